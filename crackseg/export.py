"""Exported models: ONNX and OpenVINO IR files, and the runtimes that predict with them.

An exported model takes what :func:`crackseg.load_model` takes from ``predict``: uint8 RGB
images (N, 3, H, W) of any N, H and W (normalization and padding to the size divisor are
inside the graph) and returns crack **probabilities** (N, 1, H, W) float32 in [0, 1], so it
needs neither PyTorch nor crackseg to be used. The decision threshold, architecture,
encoder, size divisor and crackseg version travel with it (ONNX ``metadata_props``,
OpenVINO ``rt_info`` under ``crackseg``). Safetensors folders are written and read by
:mod:`crackseg.checkpoint`.

The runtimes are optional extras: ``pip install 'crackseg[onnx]'`` (onnx, onnxruntime) and
``pip install 'crackseg[openvino]'`` (openvino, onnx).
"""

from __future__ import annotations

import importlib
import io
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

import crackseg
from crackseg.checkpoint import load_model, save_pretrained
from crackseg.config import BACKENDS, EXPORT_FORMATS
from crackseg.errors import InputError
from crackseg.files import ensure_writable_folder, write_atomic
from crackseg.models import CrackSegModel

OPSET = 17
_INPUT = "images"
_OUTPUT = "probabilities"


def export_model(checkpoint: Path, fmt: str, out: Path, overwrite: bool = False) -> Path:
    """Write the model of ``checkpoint`` as ``fmt`` (onnx, openvino, safetensors) to ``out``; returns what was written.

    ``out`` is a file for onnx (``model.onnx``) and openvino (``model.xml``, with ``model.bin``
    beside it), and a folder for safetensors (``config.json`` + ``model.safetensors``).
    """
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another --out or pass --overwrite")
    return write_exported(load_model(checkpoint), fmt, out)


def write_exported(model: CrackSegModel, fmt: str, out: Path) -> Path:
    """Write an in-memory model as ``fmt`` to ``out`` (replacing it); see :func:`export_model`."""
    out = Path(out)
    if fmt == "safetensors":
        save_pretrained(model, out)
        return out
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; give the file's name, e.g. {out / ('model.onnx' if fmt == 'onnx' else 'model.xml')}")
    ensure_writable_folder(out.parent, "--out")
    onnx_bytes = _onnx_bytes(model)
    if fmt == "onnx":
        write_atomic(out, onnx_bytes)
    else:
        _write_openvino(onnx_bytes, model, out)
    return out


def metadata(model: CrackSegModel) -> dict[str, str]:
    """What an exported file records about its model, as text."""
    config = model.config()
    return {
        "format": "crackseg",
        "crackseg_version": crackseg.__version__,
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
    onnx = _require("onnx", "onnx")
    # An example whose sides are not multiples of the divisor, so the padding is traced as
    # operations on the input's shape rather than left out.
    example = torch.zeros((1, 3, model.size_divisor + 3, 2 * model.size_divisor + 5), dtype=torch.uint8)
    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode(False):
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
        torch.onnx.export(
            _Probabilities(model).eval(), (example,), buffer, dynamo=False, opset_version=OPSET,
            input_names=[_INPUT], output_names=[_OUTPUT],
            dynamic_axes={_INPUT: {0: "batch", 2: "height", 3: "width"}, _OUTPUT: {0: "batch", 2: "height", 3: "width"}},
        )
    graph = onnx.load_from_string(buffer.getvalue())
    for key, value in metadata(model).items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(graph)
    return graph.SerializeToString()


def _write_openvino(onnx_bytes: bytes, model: CrackSegModel, out: Path) -> None:
    """IR stored in float32 (``compress_to_fp16=False``): the precision it computes in is chosen when loading (``--amp``)."""
    ov = _require("openvino", "openvino")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as temp:
        source = Path(temp) / "model.onnx"
        source.write_bytes(onnx_bytes)
        converted = ov.convert_model(str(source))
        for key, value in metadata(model).items():
            converted.set_rt_info(value, ["crackseg", key])
        ov.save_model(converted, str(Path(temp) / "model.xml"), compress_to_fp16=False)
        os.replace(Path(temp) / "model.bin", out.with_suffix(".bin"))  # the weights first: the .xml names them
        os.replace(Path(temp) / "model.xml", out)


class RuntimeModel:
    """An exported model run by ONNX Runtime or OpenVINO on the CPU, called like a CrackSegModel.

    Takes (N, 3, H, W) uint8 tensors and returns (N, 1, H, W) probabilities (not logits:
    ``returns_probabilities`` tells :class:`crackseg.inference.Predictor`).
    """

    returns_probabilities = True

    def __init__(self, run, info: dict[str, str], backend: str, path: Path):
        self._run = run
        self.backend = backend
        self.path = path
        self.arch = info.get("arch", "?")
        self.encoder = info.get("encoder", "?")
        self.size_divisor = int(info.get("size_divisor", 1))
        self.threshold = float(info.get("threshold", 0.5))

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        pixels = np.ascontiguousarray(images.detach().cpu().numpy(), dtype=np.uint8)
        return torch.from_numpy(np.asarray(self._run(pixels)))

    def eval(self) -> RuntimeModel:
        return self


def load_inference_model(path: Path, backend: str = "auto", device: torch.device | str = "cpu", amp: str = "off"):
    """A model for prediction from any crackseg model file: ``.pt`` / safetensors folder (torch),
    ``.onnx`` (ONNX Runtime, or OpenVINO) or ``.xml`` (OpenVINO).

    ``auto`` picks the backend from the file. Exported models run on the CPU, in float32
    unless ``amp`` is ``bf16`` (OpenVINO only). A torch model's ``amp`` is the caller's
    autocast, so it is not applied here.
    """
    path = Path(path)
    kind = path.suffix.lower()
    backend = resolve_backend(path, backend)
    if backend == "torch":
        if kind in (".onnx", ".xml"):
            raise InputError(f"{path}: an exported {kind[1:]} model; --backend torch needs a crackseg checkpoint or safetensors folder")
        return load_model(path, device)
    if torch.device(device).type != "cpu":
        raise InputError(f"--backend {backend} runs on the CPU; leave out --device or pass --device cpu")
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    check_runtime_amp(backend, amp)
    if backend == "onnxruntime":
        if kind != ".onnx":
            raise InputError(f"{path}: ONNX Runtime needs an .onnx file; make one with crackseg export {path} --format onnx --out model.onnx")
        return _onnxruntime_model(path)
    if kind not in (".onnx", ".xml"):
        raise InputError(f"{path}: OpenVINO needs an .xml or .onnx file; make one with crackseg export {path} --format openvino --out model.xml")
    return _openvino_model(path, "bf16" if amp == "bf16" else "f32")


def check_runtime_amp(backend: str, amp: str) -> None:
    """Refuse an ``--amp`` that ``backend`` cannot honour: runtimes compute in float32, OpenVINO also in bf16."""
    if backend != "torch" and amp not in ("auto", "off") and not (backend == "openvino" and amp == "bf16"):
        raise InputError(f"--amp {amp} with --backend {backend}: exported models run in float32, or in bf16 with --backend openvino")


def resolve_backend(path: Path, backend: str = "auto") -> str:
    """The runtime for ``path``: ``backend``, or for ``auto`` the one its kind of file needs."""
    if backend not in BACKENDS:
        raise InputError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend != "auto":
        return backend
    return {".onnx": "onnxruntime", ".xml": "openvino"}.get(Path(path).suffix.lower(), "torch")


def _onnxruntime_model(path: Path) -> RuntimeModel:
    ort = _require("onnxruntime", "onnx")
    try:
        options = ort.SessionOptions()
        # Idle threads spinning for the next call took the cores from reading, blending and writing.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for unreadable files
        raise InputError(f"{path}: not a readable ONNX model ({type(error).__name__}: {str(error).splitlines()[0][:200]})") from None
    info = session.get_modelmeta().custom_metadata_map
    _check_crackseg(info, path)
    return RuntimeModel(lambda pixels: session.run([_OUTPUT], {_INPUT: pixels})[0], info, "onnxruntime", path)


def _openvino_model(path: Path, precision: str) -> RuntimeModel:
    ov = _require("openvino", "openvino")
    core = ov.Core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise InputError("--amp bf16: this CPU has no bfloat16 support; leave out --amp")
    try:
        model = core.read_model(str(path))
    except Exception as error:  # OpenVINO raises RuntimeError subclasses of its own
        raise InputError(f"{path}: not a readable OpenVINO or ONNX model ({str(error).splitlines()[0][:200]})") from None
    if path.suffix.lower() == ".onnx":
        onnx = _require("onnx", "openvino")
        info = {entry.key: entry.value for entry in onnx.load(str(path), load_external_data=False).metadata_props}
    else:
        stored = model.get_rt_info(["crackseg"]).astype(dict) if model.has_rt_info(["crackseg"]) else {}
        info = {key: value.astype(str) for key, value in stored.items()}
    _check_crackseg(info, path)
    # OpenVINO picks bf16 by itself on some CPUs; f32 unless asked keeps predictions equal to torch's.
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    output = compiled.output(0)
    # Copies in and out: a shared input leaves OpenVINO holding the caller's memory after the
    # call, and that crashed the process later (in an unrelated part) once it was freed.
    return RuntimeModel(lambda pixels: compiled(pixels, share_inputs=False, share_outputs=False)[output], info, "openvino", path)


def _check_crackseg(info: dict, path: Path) -> None:
    if info.get("format") != "crackseg":
        raise InputError(f"{path}: not exported by crackseg (no crackseg metadata); export it with crackseg export")


def _require(module: str, extra: str):
    """Import an optional dependency, or stop with the pip command that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise InputError(f"{module} is not installed; pip install 'crackseg[{extra}]'") from None

