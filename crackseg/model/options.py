"""The options of how a model runs (``InferenceOptions``, shared by predict, evaluate, serve and the Predictor) and of
``crackseg convert`` and ``crackseg export``; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.options import (AT_LEAST_ONE, FRACTION, NON_NEGATIVE, PX_SIZE, REQUIRED, Options, Range, group, option,
                                   parse_device, parse_size)
from crackseg.model.architectures import CLASSIC
from crackseg.model.shipped import model_file

TILE, TILE_OVERLAP = 1024, 128  # px: images larger than a tile run as overlapping tiles (validation, predict, evaluate)
AMP_CHOICES = ("auto", "bf16", "fp16", "off")
TTA_CHOICES = ("none", "flip", "d4")
BACKENDS = ("auto", "torch", "onnxruntime", "openvino")  # runtimes of the forward pass (crackseg.model.runtimes)
# --format: what crackseg.model.export writes, and the help that says so
EXPORT_FORMATS = {
    "onnx": "onnx (also for QGIS's Deepness plugin, with --tile; pip install 'crackseg[onnx]')",
    "openvino": "openvino (float32 IR, pip install 'crackseg[openvino]')",
    "safetensors": "safetensors",
}


@dataclass(frozen=True)
class InferenceOptions(Options):
    """How a model runs over images, shared by ``predict``, ``evaluate``, ``serve`` and
    :class:`crackseg.model.inference.Predictor`."""

    tile: int = option(TILE, "tile side in px; larger images run as overlapping tiles", unit="px", valid=AT_LEAST_ONE)
    overlap: int = option(TILE_OVERLAP, "overlap between neighbouring tiles in px, blended smoothly (less than --tile)",
                          unit="px", valid=NON_NEGATIVE)
    batch_size: int | None = option(None, "tiles per forward pass; tiles of several images share a batch (default 8 on a GPU, "
                                          "1 on CPU, where batches ran slower)", valid=AT_LEAST_ONE)
    tta: str = option("none", "average probabilities over a horizontal flip, or all 8 flips and rotations", choices=TTA_CHOICES)
    resize: tuple[int, int] | None = option(None, "resize every image to N or HxW px first (for models trained on resized "
                                                  "data); masks come back at the input size", unit="px", parse=parse_size)
    backend: str = option("auto", "runtime of the forward pass; auto: torch for checkpoints and safetensors folders, "
                                  "onnxruntime for .onnx, openvino for .xml (openvino also runs .onnx)", choices=BACKENDS)
    device: str = option("auto", "auto (CUDA when present), cuda, cuda:N or cpu; exported models run on the CPU",
                         parse=parse_device)
    amp: str = option("auto", "mixed precision; auto = bf16 on GPUs that support it; bf16 also speeds up --backend openvino "
                              "on CPUs with bfloat16 (docs/benchmarks.md)", choices=AMP_CHOICES)
    channels_last: bool = option(False, "NHWC memory layout for --backend torch (on tensor cores; on the CPU it was slower end "
                                        "to end, docs/benchmarks.md)")
    compile: bool = option(False, "torch.compile the model for --backend torch, for one shape: batches of whole tiles, a "
                                  "short batch padded to --batch-size; images smaller than a tile run uncompiled (the first "
                                  "batch waits for the compiler)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlap >= self.tile:
            raise InputError(f"--overlap ({self.overlap} px) must be smaller than --tile ({self.tile} px)")


# convert --from: the kinds of model file crackseg converts (crackseg.model.classic, crackseg.model.crackpot)
CONVERT_SOURCES = {
    "classic": "a checkpoint of the classic crack-segmentation project (with --arch)",
    "crackpot": "crackpot's Keras ResUNet (MIT): its my_model.keras, by default the installed crackpot's "
                "(pip install 'crackseg[crackpot]' and pip install --no-deps crackpot==2.0)",
}


@dataclass(frozen=True, kw_only=True)
class ConvertOptions(Options):
    source: Path | None = option(None, "the file to convert: a classic checkpoint (model_best.pt, model_epoch_N.pt) or "
                                       "crackpot's my_model.keras", positional=True, nargs="?")
    from_: str = option("classic", "; ".join(f"{name}: {what}" for name, what in CONVERT_SOURCES.items()),
                        choices=CONVERT_SOURCES, flags=("--from",))
    arch: str | None = option(None, "architecture a classic checkpoint holds", choices=CLASSIC)
    out: Path = option(REQUIRED, "crackseg model file to write")
    threshold: float | None = option(None, "decision threshold on crack probability stored in the file (default: the "
                                           "source's own, 0.2 for classic checkpoints, 0.5 for crackpot)", valid=FRACTION)
    overwrite: bool = option(False, "replace --out if it exists")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.from_ == "classic" and (self.source is None or self.arch is None):
            raise InputError("a classic checkpoint needs its path and --arch: crackseg convert model_best.pt --arch unet16 --out model.pt")
        if self.from_ == "crackpot" and self.arch is not None:
            raise InputError("--arch is for classic checkpoints; a crackpot model is always its ResUNet")


@dataclass(frozen=True)
class ModelsOptions(Options):
    """``crackseg models``: nothing to choose."""


@dataclass(frozen=True)
class DeepnessOptions(Options):
    """How QGIS's Deepness plugin is to run an exported ONNX model: its tiles, the model's resolution."""

    tile: int | None = option(None, "fix the input to square tiles of this side, as QGIS's Deepness needs, in px (a multiple "
                                    "of the model's size divisor, at most 99999, Deepness's largest; default: any size, with "
                                    "512 px stated as Deepness's tile)",
                              unit="px", valid=Range(1, 99999))
    tile_overlap: int = option(20, "overlap of neighbouring tiles, in percent of --tile", unit="%", valid=Range(0, 90))
    px_size: float | None = option(None, "pixel size of the photos the model was trained on, in mm (Deepness's resolution, "
                                         "which it keeps to 0.01 cm: 0.05 mm and more; default: none stated, Deepness then "
                                         "runs the raster at its own)",
                                   unit="mm", valid=PX_SIZE)


@dataclass(frozen=True)
class ExportOptions(Options):
    checkpoint: Path = option(REQUIRED, "crackseg checkpoint, model file or safetensors folder, or a shipped model's name "
                                        "(crackseg models)", positional=True, parse=model_file)
    format: str = option(REQUIRED, f"{', '.join(list(EXPORT_FORMATS.values())[:-1])} or {list(EXPORT_FORMATS.values())[-1]}",
                         choices=EXPORT_FORMATS)
    out: Path = option(REQUIRED, "model.onnx, model.xml (model.bin is written beside it) or a folder for safetensors")
    half: bool = option(False, "store the weights in float16, half the size (safetensors; they are read back into float32)")
    overwrite: bool = option(False, "replace --out if it exists (by default an existing --out is an error)")
    deepness: DeepnessOptions = group(DeepnessOptions, "QGIS Deepness (--format onnx)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.half and self.format != "safetensors":
            raise InputError(f"--half is for --format safetensors; {self.format} models are stored in float32")
