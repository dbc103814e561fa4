"""Exported models: ONNX and OpenVINO IR files (run by :mod:`crackseg.model.runtimes`).

An exported model takes what :func:`crackseg.load_model` takes from ``predict``: uint8 RGB
images (N, 3, H, W) of any N, H and W (normalization and padding to the size divisor are
inside the graph) and returns crack **probabilities** (N, 1, H, W) float32 in [0, 1], so it
needs neither PyTorch nor crackseg to be used. The decision threshold, architecture,
encoder, size divisor and crackseg version travel with it (ONNX ``metadata_props``,
OpenVINO ``rt_info`` under ``crackseg``), with a checksum over them and the weights
(:func:`crackseg.model.runtimes.exported_digest`) that the runtimes check before running the file.
Safetensors folders are written and read by :mod:`crackseg.model.checkpoint`.

The exporters are optional extras: ``pip install 'crackseg[onnx]'`` (onnx) and
``pip install 'crackseg[openvino]'`` (openvino, onnx).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path

import torch
from torch import nn

from crackseg.core.errors import InputError, require
from crackseg.core.files import PendingFile, ensure_writable_folder, write_atomic
from crackseg.core.version import __version__
from crackseg.model.checkpoint import load_model, save_pretrained
from crackseg.model.networks import CrackSegModel
from crackseg.model.options import EXPORT_FORMATS
from crackseg.model.runtimes import CHECKSUM, INPUT, OUTPUT, exported_digest

OPSET = 17


def export_model(checkpoint: Path, fmt: str, out: Path, overwrite: bool = False) -> Path:
    """Write the model of ``checkpoint`` as ``fmt`` (onnx, openvino, safetensors) to ``out``; returns what was written.

    ``out`` is a file for onnx (``model.onnx``) and openvino (``model.xml``, with ``model.bin``
    beside it), and a folder for safetensors (``config.json`` + ``model.safetensors``).
    Exporting to safetensors is also how a model file without a checksum over its settings
    (an older crackseg's) is re-saved with one: see :func:`crackseg.model.checkpoint.read_checkpoint`.
    """
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    out = Path(out)
    if fmt == "openvino" and out.suffix.lower() != ".xml":
        raise InputError(f"--out {out}: an OpenVINO model is an .xml file (its weights go to the .bin beside it); e.g. --out {out.with_suffix('.xml')}")
    written = [out, out.with_suffix(".bin")] if fmt == "openvino" else [out]
    existing = next((path for path in written if path.exists()), None)
    if existing is not None and not overwrite:
        raise InputError(f"{existing} already exists; choose another --out or pass --overwrite")
    return write_exported(load_model(checkpoint, resaving=fmt == "safetensors"), fmt, out)


def write_exported(model: CrackSegModel, fmt: str, out: Path) -> Path:
    """Write an in-memory model as ``fmt`` to ``out`` (replacing it); see :func:`export_model`."""
    out = Path(out)
    if fmt != "safetensors":
        if out.is_dir():
            raise InputError(f"--out {out}: is a folder; give the file's name, e.g. {out / ('model.onnx' if fmt == 'onnx' else 'model.xml')}")
        ensure_writable_folder(out.parent, "--out")
    _WRITERS[fmt](model, out)
    return out


def metadata(model: CrackSegModel) -> dict[str, str]:
    """What an exported file records about its model, as text."""
    config = model.config()
    return {
        "format": "crackseg",
        "crackseg_version": __version__,
        "arch": config["arch"],
        "encoder": config["encoder"],
        "size_divisor": str(config["size_divisor"]),
        "threshold": repr(config["threshold"]),
        "input": "images: uint8 (N, 3, H, W) RGB, any N, H, W",
        "output": "probabilities: float32 (N, 1, H, W), crack probability in [0, 1]",
    }


class _Probabilities(nn.Module):
    def __init__(self, model: CrackSegModel):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(images))


def _onnx_bytes(model: CrackSegModel) -> bytes:
    onnx = require("onnx", "onnx")
    # An example whose sides are not multiples of the divisor, so the padding is traced as
    # operations on the input's shape rather than left out.
    example = torch.zeros((1, 3, model.size_divisor + 3, 2 * model.size_divisor + 5), dtype=torch.uint8)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            _Probabilities(model).eval(), (example,), buffer, dynamo=False, opset_version=OPSET,
            input_names=[INPUT], output_names=[OUTPUT],
            dynamic_axes={INPUT: {0: "batch", 2: "height", 3: "width"}, OUTPUT: {0: "batch", 2: "height", 3: "width"}},
        )
    graph = onnx.load_from_string(buffer.getvalue())
    info = metadata(model)
    info[CHECKSUM] = exported_digest(info, [graph.graph.SerializeToString()])
    for key, value in info.items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(graph)
    return graph.SerializeToString()


def _write_onnx(model: CrackSegModel, out: Path) -> None:
    write_atomic(out, _onnx_bytes(model))


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
            ov.save_model(converted, str(xml.temp), compress_to_fp16=False)
            # The checksum is over the .bin this save wrote, and goes into the .xml: a second save
            # writes the same .bin beside an .xml that carries it.
            digest = exported_digest(info, [weights.temp.read_bytes()])
            converted.set_rt_info(digest, ["crackseg", CHECKSUM])
            ov.save_model(converted, str(xml.temp), compress_to_fp16=False)
            if exported_digest(info, [weights.temp.read_bytes()]) != digest:
                raise RuntimeError(f"OpenVINO wrote other weights for {out} when saving it again")
            weights.commit()  # the weights first: the .xml names them
        except BaseException:
            weights.abort()
            raise


# EXPORT_FORMATS' writers: (model, out) -> the files at ``out``
_WRITERS = {"onnx": _write_onnx, "openvino": _write_openvino, "safetensors": save_pretrained}
if set(_WRITERS) != set(EXPORT_FORMATS):  # model.options names them for --format, this table writes them
    raise ImportError("crackseg.model.export's writers and crackseg.model.options.EXPORT_FORMATS disagree")
