"""The options of how a model runs (``InferenceOptions``, shared by predict, evaluate, serve and the Predictor) and of
``crackseg convert`` and ``crackseg export``; no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.options import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, REQUIRED, Options, option, parse_size
from crackseg.model.architectures import CLASSIC

TILE, TILE_OVERLAP = 1024, 128  # px: images larger than a tile run as overlapping tiles (validation, predict, evaluate)
AMP_CHOICES = ("auto", "bf16", "fp16", "off")
TTA_CHOICES = ("none", "flip", "d4")
BACKENDS = ("auto", "torch", "onnxruntime", "openvino")  # runtimes of the forward pass (crackseg.model.runtimes)
# --format: what crackseg.model.export writes, and the help that says so
EXPORT_FORMATS = {
    "onnx": "onnx (pip install 'crackseg[onnx]')",
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
    device: str = option("auto", "auto (CUDA when present), cuda or cpu; exported models run on the CPU")
    amp: str = option("auto", "mixed precision; auto = bf16 on GPUs that support it; bf16 also speeds up --backend openvino "
                              "on CPUs with bfloat16 (docs/benchmarks.md)", choices=AMP_CHOICES)
    channels_last: bool = option(False, "NHWC memory layout for --backend torch (on tensor cores; on the CPU it was slower end "
                                        "to end, docs/benchmarks.md)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.overlap >= self.tile:
            raise InputError(f"--overlap ({self.overlap} px) must be smaller than --tile ({self.tile} px)")


@dataclass(frozen=True)
class ConvertOptions(Options):
    classic: Path = option(REQUIRED, "classic checkpoint, e.g. model_best.pt or model_epoch_N.pt", positional=True)
    arch: str = option(REQUIRED, "architecture it holds", choices=CLASSIC)
    out: Path = option(REQUIRED, "crackseg model file to write")
    threshold: float = option(0.2, "decision threshold on crack probability stored in the file (the classic inference default)",
                              valid=FRACTION)
    overwrite: bool = option(False, "replace --out if it exists")


@dataclass(frozen=True)
class ExportOptions(Options):
    checkpoint: Path = option(REQUIRED, "crackseg checkpoint, model file or safetensors folder", positional=True)
    format: str = option(REQUIRED, f"{', '.join(list(EXPORT_FORMATS.values())[:-1])} or {list(EXPORT_FORMATS.values())[-1]}",
                         choices=EXPORT_FORMATS)
    out: Path = option(REQUIRED, "model.onnx, model.xml (model.bin is written beside it) or a folder for safetensors")
    overwrite: bool = option(False, "replace --out if it exists (by default an existing --out is an error)")
