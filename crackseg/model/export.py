"""Exported models: ONNX and OpenVINO IR files (run by :mod:`crackseg.model.runtimes`).

An exported model takes what :func:`crackseg.load_model` takes from ``predict`` in its float form: RGB images
float32 (N, 3, H, W) in [0, 1] of any N, H and W (normalization and padding to the size divisor are inside the graph)
and returns crack **probabilities** (N, 1, H, W) float32 in [0, 1], so it needs neither PyTorch nor crackseg to be
used. The decision threshold, architecture, encoder, size divisor and crackseg version travel with it (ONNX
``metadata_props``, OpenVINO ``rt_info`` under ``crackseg``), with a checksum over them and the weights
(:func:`crackseg.model.runtimes.exported_digest`) that the runtimes check before running the file.
Safetensors folders are written and read by :mod:`crackseg.model.checkpoint`.

An ONNX file also carries the metadata QGIS's Deepness plugin reads (:func:`deepness_metadata`); Deepness takes the
tile side from the input's shape, so ``--tile`` fixes it for QGIS (crackseg's own runtimes then refuse the file).

The exporters are optional extras: ``pip install 'crackseg[onnx]'`` (onnx) and
``pip install 'crackseg[openvino]'`` (openvino, onnx).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

from crackseg.core.errors import InputError, RunError, require
from crackseg.core.files import PendingFile, ensure_writable_folder, write_atomic
from crackseg.core.version import __version__
from crackseg.model.checkpoint import load_model, save_pretrained
from crackseg.model.networks import CrackSegModel
from crackseg.model.options import EXPORT_FORMATS, DeepnessOptions
from crackseg.model.runtimes import CHECKSUM, CHECKSUM_SLOT, INPUT, OUTPUT, exported_digest, openvino_chunks

OPSET = 17
_EXAMPLE_OUT = {"onnx": "model.onnx", "openvino": "model.xml", "safetensors": "model"}  # safetensors: a folder
DEEPNESS_TILE = 512  # px: the tile an ONNX file states for Deepness when --tile fixes none


def export_model(checkpoint: Path, fmt: str, out: Path, overwrite: bool = False, half: bool = False,
                 deepness: DeepnessOptions = DeepnessOptions()) -> Path:
    """Write the model of ``checkpoint`` as ``fmt`` (onnx, openvino, safetensors) to ``out``; returns what was written.

    ``out`` is a file for onnx (``model.onnx``) and openvino (``model.xml``, with ``model.bin``
    beside it), and a folder for safetensors (``config.json`` + ``model.safetensors``).
    Exporting to safetensors is also how a model file without a checksum over its settings
    (an older crackseg's) is re-saved with one: see :func:`crackseg.model.checkpoint.read_checkpoint`. ``half`` stores a
    safetensors folder's weights in float16 (the settings stay exact). ``deepness``: how QGIS's Deepness plugin is to
    run an ONNX file (its tiles, the resolution).
    """
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if fmt != "onnx" and deepness != DeepnessOptions():
        raise InputError(f"--tile, --tile-overlap and --px-size are for --format onnx (QGIS's Deepness plugin), not {fmt}")
    kept_resolution = _deepness_resolution(deepness.px_size) if deepness.px_size is not None else None
    out = Path(out)
    if out.name in ("", "..") or out.name.lower() in (".onnx", ".xml", ".safetensors"):  # a folder, or a suffix alone
        raise InputError(f"--out {str(out)!r}: give the exported model's name, e.g. --out {_EXAMPLE_OUT[fmt]}")
    if fmt == "safetensors" and out.suffix.lower() in (".onnx", ".xml", ".bin", ".pt", ".safetensors"):
        raise InputError(f"--out {out}: a safetensors model is a folder (config.json and model.safetensors); e.g. --out {out.with_suffix('')}")
    if fmt == "openvino" and out.suffix.lower() != ".xml":
        raise InputError(f"--out {out}: an OpenVINO model is an .xml file (its weights go to the .bin beside it); e.g. --out {out.with_suffix('.xml')}")
    if fmt == "onnx" and out.suffix.lower() != ".onnx":  # predict picks the runtime by the suffix
        raise InputError(f"--out {out}: an ONNX model is an .onnx file; e.g. --out {out.with_suffix('.onnx')}")
    targets = [out, out.with_suffix(".bin")] if fmt == "openvino" else [out]
    existing = next((path for path in targets if path.exists()), None)
    if existing is not None and not overwrite:
        raise InputError(f"{existing} already exists; choose another --out or pass --overwrite")
    model = load_model(checkpoint, resaving=fmt == "safetensors")
    if half:
        if fmt != "safetensors":
            raise InputError(f"--half is for --format safetensors; {fmt} models are stored in float32")
        _check_half_range(model.net)
        model.net.half()  # the network only: the scaling in its settings stays float32
    written = write_exported(model, fmt, out, deepness)
    if kept_resolution is not None:  # said once the file is written, so that a refusal stays one line
        _warn_if_rounded(deepness.px_size, kept_resolution)
    return written


def _check_half_range(net: nn.Module) -> None:
    """Refuse --half when a weight or buffer lies beyond float16's range, where it would be stored as infinity."""
    limit = torch.finfo(torch.float16).max
    for name, tensor in [*net.named_parameters(), *net.named_buffers()]:
        if tensor.is_floating_point() and tensor.numel() and tensor.detach().abs().max() > limit:
            raise InputError(f"--half: {name} holds {tensor.detach().abs().max().item():.3g}, beyond float16's {limit:g}; "
                             "export without --half")


def write_exported(model: CrackSegModel, fmt: str, out: Path, deepness: DeepnessOptions = DeepnessOptions()) -> Path:
    """Write an in-memory model as ``fmt`` to ``out`` (replacing it); see :func:`export_model`."""
    out = Path(out)
    made = [folder for folder in [out.parent, *out.parent.parents] if not folder.exists()]
    try:
        if fmt != "safetensors":
            if out.is_dir():
                raise InputError(f"--out {out}: is a folder; give the file's name, e.g. {out / ('model.xml' if fmt == 'openvino' else 'model.onnx')}")
            ensure_writable_folder(out.parent, "--out")
        writer = functools.partial(_write_onnx, tiles=deepness) if fmt == "onnx" else _WRITERS[fmt]
        writer(model, out)
    except BaseException:  # a refused --tile, a missing exporter, a full disk: no empty folder is left for it
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return out


def metadata(model: CrackSegModel, tile: int | None = None) -> dict[str, str]:
    """What an exported file records about its model, as text; ``tile``: the one input side it takes (None: any)."""
    config = model.config()
    sides = "any H, W" if tile is None else f"H = W = {tile}"
    info = {
        "format": "crackseg",
        "crackseg_version": __version__,
        "arch": config["arch"],
        "encoder": config["encoder"],
        "size_divisor": str(config["size_divisor"]),
        "threshold": repr(config["threshold"]),
        "input": f"images: float32 (N, 3, H, W) RGB in [0, 1], any N, {sides}",
        "output": "probabilities: float32 (N, 1, H, W), crack probability in [0, 1]",
    }
    return info if tile is None else info | {"tile": str(tile)}


class _Probabilities(nn.Module):
    def __init__(self, model: CrackSegModel):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(images))


def deepness_metadata(model: CrackSegModel, tiles: DeepnessOptions) -> dict[str, str]:
    """The metadata QGIS's Deepness plugin reads, each value JSON as it parses them.

    It scales pixels to [0, 1], then by ``standardization_mean`` / ``_std`` (here none: the model's own scaling is in
    the graph); one output channel is one class against the background, cut at ``seg_thresh``. Its documentation names
    the tile ``tiles_size``, its code reads ``tile_size``: both are written. ``resolution`` is in cm per pixel.
    ``seg_small_segment`` 0 unticks its "remove small segment areas", a median filter over the class map.
    """
    tile = tiles.tile or DEEPNESS_TILE
    values = {
        "model_type": "Segmentor",
        "class_names": {"0": "background", "1": "crack"},
        "tiles_size": tile,
        "tile_size": tile,
        "tiles_overlap": tiles.tile_overlap,
        "seg_thresh": model.config()["threshold"],
        "seg_small_segment": 0,  # Deepness's default median filter of 9 px would erase cracks thinner than about 5 px
        "standardization_mean": [0.0, 0.0, 0.0],
        "standardization_std": [1.0, 1.0, 1.0],
    }
    if tiles.px_size is not None:
        values["resolution"] = tiles.px_size / 10
    return {key: json.dumps(value) for key, value in values.items()}


def _deepness_resolution(px_size: float) -> float:
    """The resolution Deepness will use, in cm per pixel: its dock's field keeps two decimals. A pixel size it would read
    as 0, which it divides by, is refused."""
    kept = float(f"{px_size / 10:.2f}")
    if kept == 0:
        raise InputError(f"--px-size {px_size:g}: QGIS's Deepness keeps two decimals of the resolution in cm per pixel and "
                         f"reads {px_size / 10:g} cm as 0, which it divides by; it takes 0.05 mm and more")
    return kept


def _warn_if_rounded(px_size: float, kept: float) -> None:
    """One line when Deepness's two decimals move the resolution by more than 1%."""
    exact = px_size / 10
    if abs(kept / exact - 1) > 0.01:
        print(f"crackseg: warning: --px-size {px_size:g}: QGIS's Deepness keeps two decimals of the resolution in cm per pixel "
              f"and will run rasters at {kept:.2f} cm, not {exact:g} cm per pixel ({abs(kept / exact - 1):.0%} "
              f"{'coarser' if kept > exact else 'finer'} than the training photos)", file=sys.stderr)


def _onnx_bytes(model: CrackSegModel, tiles: DeepnessOptions = DeepnessOptions()) -> bytes:
    if tiles.tile is not None and tiles.tile % model.size_divisor:
        raise InputError(f"--tile {tiles.tile} px is not a multiple of {model.size_divisor}, the size divisor of the "
                         f"{model.arch} model; e.g. --tile {max(tiles.tile // model.size_divisor, 1) * model.size_divisor}")
    # An example whose sides are not multiples of the divisor, so the padding is traced as operations on the input's
    # shape rather than left out; small, since a trace's memory grows with its example's area (a --tile fixes the sides after).
    example = torch.zeros((1, 3, model.size_divisor + 3, 2 * model.size_divisor + 5))
    axes = {INPUT: {0: "batch", 2: "height", 3: "width"}, OUTPUT: {0: "batch", 2: "height", 3: "width"}}
    return _onnx_graph(_Probabilities(model), example, axes, metadata(model, tiles.tile) | deepness_metadata(model, tiles), tiles.tile)


def _onnx_graph(module: nn.Module, example: torch.Tensor, axes: dict, info: dict[str, str], tile: int | None = None) -> bytes:
    """``module`` traced on ``example`` as a checked ONNX graph with ``info`` as its metadata and crackseg's checksum;
    ``tile``: the input's sides declared T x T.

    The output's sides are declared as the input's (the tracer names them after the operations that computed them),
    so a runtime that reads the declared shape, as Deepness does, sees (N, 1, H, W).
    """
    onnx = require("onnx", "onnx")
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(module.eval(), (example,), buffer, dynamo=False, opset_version=OPSET,
                          input_names=[INPUT], output_names=[OUTPUT], dynamic_axes=axes)
    graph = onnx.load_from_string(buffer.getvalue())
    sides = graph.graph.input[0].type.tensor_type.shape.dim[2:]
    if tile is not None:
        for side in sides:
            side.dim_value = tile  # in place of its free name
    for declared, side in zip(graph.graph.output[0].type.tensor_type.shape.dim[2:], sides):
        declared.CopyFrom(side)
    info = info | {CHECKSUM: exported_digest(info, [graph.graph.SerializeToString()])}
    for key, value in info.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(graph)
    return graph.SerializeToString()


def _write_onnx(model: CrackSegModel, out: Path, tiles: DeepnessOptions = DeepnessOptions()) -> None:
    write_atomic(out, _onnx_bytes(model, tiles), durable=True)


def _write_openvino(model: CrackSegModel, out: Path) -> None:
    """IR stored in float32 (``compress_to_fp16=False``): the precision it computes in is chosen when loading (``--amp``)."""
    ov = require("openvino", "openvino")
    converted = ov.convert_model(io.BytesIO(_onnx_bytes(model)))
    info = metadata(model)
    for key, value in info.items():
        converted.set_rt_info(value, ["crackseg", key])
    with PendingFile(out, suffix=".xml") as xml:
        weights = xml.companion(".bin")  # OpenVINO names the weights after the .xml
        try:
            # The checksum is over the .bin and the .xml this save wrote, with its slot for the checksum, and goes into
            # that slot: a second save writes the same files but for the checksum.
            converted.set_rt_info(CHECKSUM_SLOT, ["crackseg", CHECKSUM])
            _saved(ov, converted, xml.temp, out)
            digest = exported_digest(info, openvino_chunks(xml.temp, weights.temp, CHECKSUM_SLOT))
            converted.set_rt_info(digest, ["crackseg", CHECKSUM])
            _saved(ov, converted, xml.temp, out)
            if exported_digest(info, openvino_chunks(xml.temp, weights.temp, digest)) != digest:
                raise RuntimeError(f"OpenVINO wrote another model for {out} when saving it again")
            weights.commit()  # the weights first: the .xml names them
        except BaseException:
            weights.abort()
            raise


def _saved(ov, converted, temp: Path, out: Path) -> None:
    """OpenVINO's save, whose failure to write (a full disk) is a C++ stream error: one line naming the file."""
    try:
        ov.save_model(converted, str(temp), compress_to_fp16=False)
    except RuntimeError as error:
        raise RunError(f"{out}: OpenVINO could not write it ({str(error).splitlines()[0]}); is the disk full?") from None


# EXPORT_FORMATS' writers: (model, out) -> the files at ``out``
_WRITERS = {"onnx": _write_onnx, "openvino": _write_openvino, "safetensors": save_pretrained}
if set(_WRITERS) != set(EXPORT_FORMATS):  # model.options names them for --format, this table writes them
    raise ImportError("crackseg.model.export's writers and crackseg.model.options.EXPORT_FORMATS disagree")
