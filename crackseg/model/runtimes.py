"""Any crackseg model file -> one callable model, with its device and precision decided once.

In the spirit of Ultralytics' ``AutoBackend``: :func:`choose_runtime` reads the flags and the
kind of file (crackseg ``.pt`` or safetensors folder: torch; ``.onnx``: ONNX Runtime, or
OpenVINO; ``.xml``: OpenVINO) and refuses contradictions before any work;
:func:`load_runtime` then loads the model on the device the process got. ``predict`` and
``evaluate`` both go through here, so a flag means the same to both.

Exported models return probabilities (:class:`RuntimeModel`, called with uint8 images like a torch model); they
run on the CPU, in float32, or in bf16 with OpenVINO. A torch model's ``--amp`` is the
Predictor's autocast. The runtimes are optional extras: ``pip install 'crackseg[onnx]'``
(onnx, onnxruntime) and ``pip install 'crackseg[openvino]'`` (openvino, onnx).

An exported file is checked before it runs: its metadata values, and the checksum that
:mod:`crackseg.model.export` stored with them (:func:`exported_digest`, over the metadata and the
weights; for OpenVINO the .xml graph too), so a damaged or edited file is refused instead of predicting.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError, require
from crackseg.model import distributed
from crackseg.model.checkpoint import load_model
from crackseg.model.networks import CrackSegModel

INPUT, OUTPUT = "images", "probabilities"  # the names of an exported graph's input and output
CHECKSUM = "sha256"  # the metadata key of an exported file's checksum
CHECKSUM_SLOT = "0" * 64  # the checksum's place in an OpenVINO .xml while the checksum over that .xml is taken


class RuntimeModel:
    """An exported model run by ONNX Runtime or OpenVINO on the CPU, called like a CrackSegModel.

    Takes (N, 3, H, W) uint8 tensors, or float ones in [0, 1], and returns (N, 1, H, W) probabilities (not logits:
    ``returns_probabilities`` tells :class:`crackseg.model.inference.Predictor`). ``takes_uint8``: the file's input is
    uint8, as older crackseg exports take; otherwise float32 in [0, 1], divided as torch divides.
    """

    returns_probabilities = True

    def __init__(self, run, info: dict[str, str], backend: str, path: Path, takes_uint8: bool):
        self._run = run
        self._takes_uint8 = takes_uint8
        self.backend = backend
        self.path = path
        self.arch = info.get("arch", "?")
        self.encoder = info.get("encoder", "?")
        self.size_divisor = int(info["size_divisor"])  # both checked by _check_exported
        self.threshold = float(info["threshold"])

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        pixels = images.detach().cpu().numpy()
        if images.is_floating_point():
            pixels = np.round(pixels * 255).astype(np.uint8) if self._takes_uint8 else pixels.astype(np.float32)
        else:
            pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
            if not self._takes_uint8:
                pixels = pixels.astype(np.float32) / np.float32(255)
        try:
            probabilities = self._run(pixels)
        except Exception as error:  # ONNX Runtime's and OpenVINO's own types: an allocation that failed is the machine's limit
            text = str(error)
            sign = next((sign for sign in ("Failed to allocate", "bad_alloc", "bad allocation") if sign in text), None)
            if sign is None:
                raise
            raise MemoryError(f"{self.backend}: {_first_line(text[text.index(sign):])}") from None
        return torch.from_numpy(np.asarray(probabilities))

    def eval(self) -> RuntimeModel:
        return self


@dataclass(frozen=True)
class RuntimeChoice:
    """What :func:`choose_runtime` decided: the runtime, and the device to ask for (``distributed.setup``)."""

    path: Path
    backend: str  # torch, onnxruntime or openvino
    device: str
    options: InferenceOptions


@dataclass(frozen=True)
class Runtime:
    """A loaded model with the device it runs on and the autocast dtype of a torch model (None: none)."""

    model: CrackSegModel | RuntimeModel
    device: torch.device
    amp_dtype: torch.dtype | None
    backend: str

    @property
    def threshold(self) -> float:
        return self.model.threshold


def choose_runtime(path: Path, options: InferenceOptions = InferenceOptions()) -> RuntimeChoice:
    """The runtime for ``path`` under ``options``; contradictory flags are one-line errors."""
    path = Path(path)
    backend = options.backend
    if backend == "auto":
        backend = {".onnx": "onnxruntime", ".xml": "openvino"}.get(path.suffix.lower(), "torch")
    if backend == "torch":
        return RuntimeChoice(path, backend, options.device, options)
    if options.channels_last:
        raise InputError(f"--channels-last applies to --backend torch; {backend} chooses its own layout")
    if options.compile:
        raise InputError(f"--compile applies to --backend torch; {backend} compiles the model itself")
    if options.amp not in ("auto", "off") and not (backend == "openvino" and options.amp == "bf16"):
        raise InputError(f"--amp {options.amp} with --backend {backend}: exported models run in float32, or in bf16 with --backend openvino")
    if options.device not in ("auto", "cpu"):
        raise InputError(f"--backend {backend} runs on the CPU; leave out --device or pass --device cpu")
    return RuntimeChoice(path, backend, "cpu", options)


def load_runtime(choice: RuntimeChoice, device: torch.device | None = None) -> Runtime:
    """Load the chosen model on ``device`` (default: the one ``choice`` names), in eval mode."""
    device = device if device is not None else distributed.select_device(choice.device)
    path, kind = choice.path, choice.path.suffix.lower()
    if choice.backend == "torch":
        if kind in (".onnx", ".xml"):
            raise InputError(f"{path}: an exported {kind[1:]} model; --backend torch needs a crackseg checkpoint or safetensors folder")
        if kind == ".bin" and path.with_suffix(".xml").is_file():
            raise InputError(f"{path}: the weights of an OpenVINO model; give its .xml: {path.with_suffix('.xml')}")
        model = load_model(path, device)
        if choice.options.channels_last:
            model.to(memory_format=torch.channels_last)
        return Runtime(model, device, distributed.resolve_amp(choice.options.amp, device), "torch")
    if path.is_dir():
        raise InputError(f"{path}: a folder; --backend {choice.backend} runs an exported file (crackseg export {path} --format "
                         f"{'onnx --out model.onnx' if choice.backend == 'onnxruntime' else 'openvino --out model.xml'})")
    if not path.is_file():
        raise InputError(f"{path}: no such model file")
    if choice.backend == "onnxruntime":
        if kind != ".onnx":
            source = "CHECKPOINT" if kind in (".xml", ".bin") else str(path)  # an OpenVINO model: export its checkpoint
            raise InputError(f"{path}: ONNX Runtime needs an .onnx file; make one with crackseg export {source} --format onnx --out model.onnx")
        return Runtime(_onnxruntime_model(path), device, None, "onnxruntime")
    if kind not in (".onnx", ".xml"):
        raise InputError(f"{path}: OpenVINO needs an .xml or .onnx file; make one with crackseg export {path} --format openvino --out model.xml")
    return Runtime(_openvino_model(path, "bf16" if choice.options.amp == "bf16" else "f32"), device, None, "openvino")


def _onnxruntime_model(path: Path) -> RuntimeModel:
    ort = require("onnxruntime", "onnx")
    content = path.read_bytes()  # read once: the bytes checked are the bytes run
    info = _checked_onnx(content, path)
    try:
        options = ort.SessionOptions()
        # Idle threads spinning for the next call took the cores from reading, blending and writing.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 4  # its failures arrive as exceptions, said once in crackseg's own line
        session = ort.InferenceSession(content, options, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types for unreadable files
        raise InputError(f"{path}: not a readable ONNX model ({type(error).__name__}: {_first_line(error)})") from None
    takes_uint8 = session.get_inputs()[0].type == "tensor(uint8)"
    return RuntimeModel(lambda pixels: session.run([OUTPUT], {INPUT: pixels})[0], info, "onnxruntime", path, takes_uint8)


def _openvino_model(path: Path, precision: str) -> RuntimeModel:
    ov = require("openvino", "openvino")
    core = ov.Core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise InputError("--amp bf16: this CPU has no bfloat16 support; leave out --amp")
    is_onnx, weights = path.suffix.lower() == ".onnx", path.with_suffix(".bin")  # where OpenVINO looks for an .xml's weights
    if is_onnx:
        info = _checked_onnx(path.read_bytes(), path, extra="openvino")
    elif not _is_openvino_ir(path):
        raise InputError(f"{path}: not an OpenVINO model (an OpenVINO .xml starts with <net>); give the .xml that crackseg export wrote")
    elif not weights.is_file():
        raise InputError(f"{path}: its weights file {weights.name} is missing; an OpenVINO model is the .xml and the .bin "
                         f"that crackseg export writes together: copy {weights.name} beside it, or export it again")
    try:
        model = core.read_model(str(path))
    except Exception as error:  # OpenVINO raises RuntimeError subclasses of its own
        raise InputError(f"{path}: not a readable OpenVINO or ONNX model ({_first_line(error)})") from None
    if not is_onnx:
        stored = model.get_rt_info(["crackseg"]).astype(dict) if model.has_rt_info(["crackseg"]) else {}
        info = {key: value.astype(str) for key, value in stored.items()}
        try:
            _check_exported(info, path, "openvino", lambda: openvino_chunks(path, weights, info.get(CHECKSUM, "")))
        except InputError:
            if info.get(CHECKSUM) and exported_digest(info, _file_chunks(weights)) == info[CHECKSUM]:
                raise InputError(f"{path}: exported by an earlier crackseg, whose checksum leaves out the model's graph; export "
                                 f"it again: crackseg export CHECKPOINT --format openvino --out {path} --overwrite") from None
            raise
    # OpenVINO picks bf16 by itself on some CPUs; f32 unless asked keeps predictions equal to torch's.
    compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": precision})
    output = compiled.output(0)
    # Copies in and out: a shared input leaves OpenVINO holding the caller's memory after the
    # call, and that crashed the process later (in an unrelated part) once it was freed.
    takes_uint8 = compiled.input(0).get_element_type() == ov.Type.u8
    return RuntimeModel(lambda pixels: compiled(pixels, share_inputs=False, share_outputs=False)[output], info, "openvino", path,
                        takes_uint8)


def exported_digest(info: dict[str, str], weights: Iterable[bytes]) -> str:
    """The checksum of an exported file: SHA-256 over its metadata but the checksum (canonical JSON,
    sorted keys), then ``weights``: the serialized ONNX graph (nodes and initializers), or :func:`openvino_chunks`."""
    digest = hashlib.sha256(b"crackseg exported v1\n")
    settings = {key: value for key, value in info.items() if key != CHECKSUM}
    digest.update(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode() + b"\n")
    for chunk in weights:
        digest.update(chunk)
    return digest.hexdigest()


def openvino_chunks(xml: Path, weights: Path, checksum: str) -> Iterable[bytes]:
    """What an OpenVINO model's checksum covers: its ``.bin``, then its ``.xml`` (operations, their attributes and
    shapes) with :data:`CHECKSUM_SLOT` in the place of the ``checksum`` it carries."""
    yield from _file_chunks(weights)
    yield xml.read_bytes().replace(checksum.encode(), CHECKSUM_SLOT.encode()) if checksum else xml.read_bytes()


def _is_openvino_ir(path: Path) -> bool:
    """Whether ``path`` is OpenVINO IR: XML whose root element is ``<net>`` (a CVAT or VOC .xml is not)."""
    with open(path, "rb") as file:
        head = file.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(b"<?xml"):
        head = head[head.find(b"?>") + 2:].lstrip()
    while head.startswith(b"<!--"):
        head = head[head.find(b"-->") + 3:].lstrip()
    return head.startswith(b"<net") and head[4:5] in (b" ", b">", b"\t", b"\n", b"\r")


def _checked_onnx(content: bytes, path: Path, extra: str = "onnx") -> dict[str, str]:
    """The metadata of an ONNX file's ``content``, checked with its checksum (see :func:`_check_exported`)."""
    onnx = require("onnx", extra)
    try:
        graph = onnx.load_from_string(content)
    except Exception as error:  # protobuf's DecodeError and others for files that are not ONNX
        raise InputError(f"{path}: not a readable ONNX model ({type(error).__name__}: {_first_line(error)})") from None
    info = {entry.key: entry.value for entry in graph.metadata_props}
    _check_exported(info, path, "onnx", lambda: [graph.graph.SerializeToString()])
    return info


def _check_exported(info: dict[str, str], path: Path, fmt: str, weights: Callable[[], Iterable[bytes]]) -> None:
    """Refuse a file that crackseg did not export, whose threshold or size divisor is not a usable
    value, or whose checksum is missing or does not match; ``weights()``: its weights' bytes, in chunks."""
    if info.get("format") != "crackseg":
        raise InputError(f"{path}: not exported by crackseg (no crackseg metadata); export it with crackseg export")
    if "tile" in info:
        raise InputError(f"{path}: exported for QGIS's Deepness plugin, for {info['tile']} px tiles only; predict with its "
                         "checkpoint or an export without --tile")
    again = f"export it again: crackseg export CHECKPOINT --format {fmt} --out {path} --overwrite"
    problem = _metadata_problem(info)
    if problem:
        raise InputError(f"{path}: its {problem} (the file is damaged or was edited); {again}")
    if not info.get(CHECKSUM):
        raise InputError(f"{path}: has no checksum over its weights and settings (exported by an older crackseg, or edited); {again}")
    if exported_digest(info, weights()) != info[CHECKSUM]:
        raise InputError(f"{path}: its weights, graph or settings do not match the checksum saved with them (the file is damaged or "
                         f"was edited); {again}")


def _metadata_problem(info: dict[str, str]) -> str | None:
    """What makes an exported file's threshold or size divisor unusable, as ``stored <key> <value> is not ...``; None: nothing."""
    missing = [key for key in ("threshold", "size_divisor") if key not in info]
    if missing:
        return f"metadata lacks {' and '.join(missing)}"
    threshold, divisor = info["threshold"], info["size_divisor"]
    if not _parses(float, threshold) or not math.isfinite(float(threshold)) or not 0 <= float(threshold) <= 1:
        return f"stored threshold {threshold!r} is not a number in [0, 1]"
    if not _parses(int, divisor) or int(divisor) <= 0:
        return f"stored size_divisor {divisor!r} is not a positive whole number"
    return None


def _parses(kind, text) -> bool:
    try:
        kind(text)
        return True
    except (TypeError, ValueError):
        return False


def _file_chunks(path: Path, size: int = 1 << 20) -> Iterable[bytes]:
    with open(path, "rb") as file:
        while chunk := file.read(size):
            yield chunk


def _first_line(error: Exception | str) -> str:
    return (str(error).splitlines() or [""])[0][:200]
