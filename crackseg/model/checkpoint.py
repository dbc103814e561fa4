"""The one model-file format: :func:`save_model` writes it, :func:`read_checkpoint` / :func:`load_model` read it.

A crackseg file is a dict saved with ``torch.save`` and loaded with ``weights_only=True``::

    {"format": "crackseg", "version": 2,
     "model": {"config": CrackSegModel.config(), "state_dict": weights without prefixes,
               "sha256": model_digest(config, state_dict)},  # checked on every load
     ...training state (see :func:`crackseg.training.run_folder.training_state`), when written by training...}

The checksum covers everything that changes a prediction: the weights and the stored
settings (architecture, encoder, size divisor, normalization, threshold), whose values are
also checked before a model is built. A file without such a checksum (format 1 covered the
weights only) is refused with the command that re-saves it.

Any such file (``best.pt``, ``last.pt``, ``epoch_NNNN.pt``, a converted classic file) is
enough for :func:`load_model`. Classic crack-segmentation checkpoints are imported by
:func:`crackseg.model.classic.convert_classic`, and torchvision-format encoder files by :func:`load_encoder_weights`.
Every ``.pt`` file is read by :func:`load_torch_file`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import pickle
import zipfile
from pathlib import Path

import torch
from torch import nn

from crackseg.core.errors import InputError
from crackseg.core.files import PendingFile, ensure_writable_folder, write_atomic
from crackseg.core.version import __version__
from crackseg.model.architectures import ARCHITECTURES, OFFLINE_IMAGENET_ENCODERS
from crackseg.model.networks import CrackSegModel, model_from_config
from crackseg.model.shipped import model_file

FORMAT = "crackseg"
VERSION = 2  # 2: the checksum covers the model's settings as well as its weights (1: the weights only)
PRETRAINED_CONFIG, PRETRAINED_WEIGHTS = "config.json", "model.safetensors"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # added by DDP / DataParallel and torch.compile
_HEAD_PREFIXES = ("fc.", "classifier.", "head.", "last_linear.")  # classifier tensors in encoder files
_SETTINGS = ("arch", "encoder", "size_divisor", "mean", "std", "threshold")  # CrackSegModel.config()
_EXPORTED = {".onnx": "an exported ONNX model", ".xml": "an exported OpenVINO model", ".bin": "the weights of an exported OpenVINO model"}


def save_model(model: nn.Module, path: Path, **extra) -> None:
    """Write ``model`` (unwrapped, weights on the CPU) and ``extra`` entries as a crackseg file.

    The file appears whole or not at all: a temp file beside ``path``, fsynced, then renamed.
    """
    payload = {"format": FORMAT, "version": VERSION, "model": _model_entry(model, path), **extra}

    def write(file) -> None:
        try:
            torch.save(payload, file)
        except RuntimeError as error:  # torch's zip writer hides a failed write (a full disk), or Ctrl-C, behind its own
            if isinstance(error.__context__, (OSError, KeyboardInterrupt)):
                raise error.__context__ from None
            raise

    write_atomic(path, write, durable=True)


def check_model_out(out: Path, overwrite: bool) -> None:
    """Refuse an ``--out`` model file that cannot be written, before any work: a folder, an existing file without
    ``overwrite``, a folder that cannot take it."""
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; give the model file's name, e.g. {out / 'model.pt'}")
    if out.suffix.lower() in (*_EXPORTED, ".safetensors", ".keras", ".h5"):  # read by their suffix, they would not load
        raise InputError(f"--out {out}: a crackseg model file is a .pt file (e.g. {out.with_suffix('.pt')}); crackseg export "
                         "makes ONNX, OpenVINO and safetensors models from it")
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another --out or pass --overwrite")
    ensure_writable_folder(out.parent, "--out")


def save_pretrained(model: nn.Module, folder: Path) -> None:
    """``folder/config.json`` + ``folder/model.safetensors``: the weights without pickle, for any tool.

    :func:`read_checkpoint` and :func:`load_model` take the folder like a ``.pt`` file.
    """
    import safetensors.torch

    entry = _model_entry(model, folder)
    folder = Path(folder)
    created = not folder.exists()
    ensure_writable_folder(folder, "--out")
    tensors = {key: value.contiguous().clone() for key, value in entry["state_dict"].items()}  # shared tensors stored apart
    config = {"format": FORMAT, "version": VERSION, "crackseg": __version__, "model": entry["config"], "sha256": entry["sha256"]}
    try:  # both files written whole before either takes its name: never new weights beside an old config
        with PendingFile(folder / PRETRAINED_CONFIG) as config_file, PendingFile(folder / PRETRAINED_WEIGHTS) as weights:
            weights.write(safetensors.torch.save(tensors, metadata={"format": FORMAT}))
            config_file.write((json.dumps(config, indent=1) + "\n").encode())
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # the folder this export made, left empty
        raise


def read_checkpoint(path: Path, *, resaving: bool = False) -> dict:
    """Load a file (or safetensors folder) written by crackseg; a missing, torn, foreign or damaged one is a one-line error.

    Its model entry, when it has one, is checked: the settings' values, then the checksum over
    settings and weights. ``resaving`` (``crackseg export --format safetensors``, which writes a
    new checksum) also takes a file without such a checksum, checking the older weights-only
    checksum where there is one: the refusal of such a file names that command. A shipped model's name
    (:mod:`crackseg.model.shipped`) reads that model.
    """
    path = model_file(path)
    if path.is_file() and path.suffix.lower() in _EXPORTED:
        raise InputError(
            f"{path}: {_EXPORTED[path.suffix.lower()]}, not a crackseg checkpoint; "
            "give the checkpoint (.pt) or safetensors folder it was exported from"
        )
    if path.is_file() and path.name in (PRETRAINED_CONFIG, PRETRAINED_WEIGHTS) and (path.parent / PRETRAINED_CONFIG).is_file():
        raise InputError(f"{path}: one file of a safetensors model folder; give the folder: {path.parent}")
    payload = _read_pretrained(path) if path.is_dir() else load_torch_file(path, "checkpoint")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        if isinstance(payload, dict) and isinstance(payload.get("model"), dict) and "epoch" in payload:
            raise InputError(f"{path}: a classic crack-segmentation checkpoint; convert it first: crackseg convert {path} --arch ARCH --out model.pt")
        raise InputError(f"{path}: not a crackseg checkpoint")
    version = payload.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise InputError(f"{path}: not a crackseg checkpoint (its format version {version!r} is not a number)")
    if version > VERSION:
        raise InputError(f"{path}: written by a newer crackseg (format version {version}); upgrade crackseg")
    if "model" in payload:
        _check_model_entry(payload["model"], version, path, resaving)
    return payload


def _check_model_entry(entry, version: int, path: Path, resaving: bool) -> None:
    """The settings' values, then the checksum; see :func:`read_checkpoint`."""
    state = entry.get("state_dict") if isinstance(entry, dict) else None
    if not (isinstance(state, dict) and isinstance(entry.get("config"), dict)
            and all(isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in state.items())):
        raise InputError(f"{path}: its model entry is not a config and a state dict of tensors (the file is damaged); use another copy")
    problem = _config_problem(entry["config"])
    if problem:
        raise InputError(f"{path}: its stored {problem} (the file is damaged or was edited); use another copy")
    stored = entry.get("sha256")
    damaged = f"{path}: its weights or settings do not match the checksum saved with them (the file is damaged or was edited); use another copy"
    if version >= 2 and isinstance(stored, str):
        if model_digest(entry["config"], state) != stored:
            raise InputError(damaged)
        return
    if version < 2 and isinstance(stored, str) and _weights_digest(state) != stored:
        raise InputError(damaged)
    if resaving:
        return
    why = ("written by an older crackseg, whose checksum does not cover the threshold, normalization and architecture stored with the weights"
           if version < 2 else "has no checksum over its weights and settings (it was edited, or written by another tool)")
    named = path if path.name not in ("", ".", "..") else path.resolve()
    resaved = named.with_name(f"{named.stem}-resaved")
    raise InputError(f"{path}: {why}; if you trust it, re-save it: crackseg export {path} --format safetensors --out {resaved}")


def _config_problem(config: dict) -> str | None:
    """What is wrong with a model config (from :meth:`CrackSegModel.config`), as ``<setting> <value> is not ...``; None: nothing."""
    missing, unknown = [key for key in _SETTINGS if key not in config], sorted(map(str, config.keys() - set(_SETTINGS)))
    if missing or unknown:
        return "model config " + "; ".join(f"{label} {', '.join(keys)}" for label, keys in (("lacks", missing), ("has unknown settings", unknown)) if keys)
    arch, encoder, divisor, threshold = config["arch"], config["encoder"], config["size_divisor"], config["threshold"]
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        return f"arch {_short(arch)} is not one of {', '.join(ARCHITECTURES)}"
    implied = ARCHITECTURES[arch].encoder
    if implied and encoder != implied:
        return f"encoder {_short(encoder)} is not {implied}, the encoder of {arch}"
    if not implied:
        import segmentation_models_pytorch as smp

        if not isinstance(encoder, str) or encoder not in (*smp.encoders.get_encoder_names(), *OFFLINE_IMAGENET_ENCODERS):
            return f"encoder {_short(encoder)} is not a segmentation_models_pytorch encoder"
    if not isinstance(divisor, int) or isinstance(divisor, bool) or divisor <= 0:
        return f"size_divisor {_short(divisor)} is not a positive whole number"
    if not _finite_number(threshold) or not 0 <= threshold <= 1:
        return f"threshold {_short(threshold)} is not a number in [0, 1]"
    for name in ("mean", "std"):
        values = config[name]
        if not isinstance(values, (list, tuple)) or len(values) != 3 or not all(map(_finite_number, values)):
            return f"{name} {_short(values)} is not 3 finite numbers (one per RGB channel)"
    if min(config["std"]) <= 0:
        return f"std {_short(config['std'])} is not 3 numbers above 0"
    return None


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load_torch_file(path: Path, what: str):
    """The one loader of ``.pt`` files: CPU, ``weights_only=True``, one-line errors naming the file."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{path}: a folder, not a {what} file")
    if not path.is_file():
        raise InputError(f"{path}: no such {what} file")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torn or foreign files raise many types (pickle, zip, struct errors)
        lines = str(error).splitlines() or [""]
        reason = next((line.strip() for line in lines if "Unsupported global" in line), None)
        if reason is None and _keras_file(path):
            raise InputError(f"{path}: a Keras model, not a PyTorch file; crackseg convert --from crackpot {path} --out "
                             "model.pt converts crackpot's") from None
        if reason is None and isinstance(error, pickle.UnpicklingError):
            # torch's message for any file that is not a pickle of tensors advises weights_only=False: unsafe, and no help here
            reason = "not a PyTorch file"
        raise InputError(f"{path}: not a readable {what} file ({type(error).__name__}: {reason or lines[0]})") from None


def _keras_file(path: Path) -> bool:
    """A Keras 3 model file: a zip archive holding config.json and metadata.json at its top."""
    with contextlib.suppress(OSError, zipfile.BadZipFile):
        with zipfile.ZipFile(path) as archive:
            return {"config.json", "metadata.json"} <= set(archive.namelist())
    return False


def _read_pretrained(folder: Path) -> dict:
    """The payload of a safetensors folder, shaped like a ``.pt`` file's."""
    import safetensors
    import safetensors.torch

    missing = [name for name in (PRETRAINED_CONFIG, PRETRAINED_WEIGHTS) if not (folder / name).is_file()]
    if missing:  # safetensors' own error for a missing file names none
        raise InputError(f"{folder}: not a crackseg model folder (no {' and no '.join(missing)})")
    try:
        config = json.loads((folder / PRETRAINED_CONFIG).read_text())
        state = safetensors.torch.load_file(str(folder / PRETRAINED_WEIGHTS))
    except (ValueError, OSError, safetensors.SafetensorError) as error:
        raise InputError(f"{folder}: not a readable crackseg model folder ({type(error).__name__}: {error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise InputError(f"{folder / PRETRAINED_CONFIG}: not a crackseg model config")
    model = {"config": config["model"], "state_dict": state, **({"sha256": config["sha256"]} if "sha256" in config else {})}
    return {"format": config.get("format"), "version": config.get("version", 0), "model": model}


def model_digest(config: dict, state: dict[str, torch.Tensor]) -> str:
    """The checksum of a model entry: SHA-256 over ``config`` as canonical JSON (sorted keys), then
    every tensor's name, dtype, shape and bytes, in name order. ``config`` must be valid (finite numbers)."""
    digest = hashlib.sha256(b"crackseg model v2\n")
    digest.update(json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n")
    return _add_tensors(digest, state).hexdigest()


def _weights_digest(state: dict[str, torch.Tensor]) -> str:
    """Format 1's checksum, over the weights only: still checked when such a file is re-saved."""
    return _add_tensors(hashlib.sha256(), state).hexdigest()


def _add_tensors(digest, state: dict[str, torch.Tensor]):
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / DataParallel / torch.compile wrappers."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) or hasattr(model, "_orig_mod"):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def _model_entry(model: nn.Module, path: Path) -> dict:
    """The ``"model"`` entry of a file: config, weights without wrapper prefixes, and their checksum.

    Computed when saving, from what is saved (training sets the threshold just before); a
    config that could not be loaded back is refused here rather than written.
    """
    plain = unwrap(model)
    config = plain.config()
    problem = _config_problem(config)
    if problem:
        raise InputError(f"{path}: cannot save the model: its {problem}")
    state = {}
    for key, value in plain.state_dict().items():
        while key.startswith(_WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        state[key] = value.detach().cpu()
    return {"config": config, "state_dict": state, "sha256": model_digest(config, state)}


def load_model(
    path: str | Path, device: str | torch.device = "cpu", arch: str | None = None, encoder: str | None = None,
    *, resaving: bool = False,
) -> CrackSegModel:
    """The ready model (eval mode, on ``device``) from any crackseg checkpoint or model file.

    With ``arch`` (and ``encoder``), a file holding another model is an error naming what it holds.
    ``resaving``: see :func:`read_checkpoint`.
    """
    payload = read_checkpoint(Path(path), resaving=resaving)
    if "model" not in payload:
        raise InputError(f"{path}: holds no model (a crackseg file without its model entry); use another copy")
    config = payload["model"]["config"]
    if (arch is not None and config["arch"] != arch) or (encoder is not None and config["encoder"] != encoder):
        asked = f"{arch or config['arch']}" + (f" with the {encoder} encoder" if encoder else "")
        advice = f"--arch {config['arch']}" + (f" --encoder {config['encoder']}" if config["arch"] == "unet" else "")
        raise InputError(
            f"{path}: holds a {config['arch']} model with the {config['encoder']} encoder, not the {asked} that was asked for; pass {advice}"
        )
    try:
        model = model_from_payload(payload)
    except InputError as error:
        raise InputError(f"{path}: {error}") from None
    return model.to(device).eval()


def model_from_payload(payload: dict) -> CrackSegModel:
    """The model a file's payload (from :func:`read_checkpoint`) holds, weights loaded, on the CPU."""
    if "model" not in payload:
        raise InputError("holds no model (a crackseg file without its model entry); use another copy")
    config = payload["model"]["config"]
    model = model_from_config(config)
    if model.size_divisor != config["size_divisor"]:
        raise InputError(f"its stored size_divisor {config['size_divisor']} is not the {model.size_divisor} of the {config['arch']} model "
                         "(the file is damaged or was edited); use another copy")
    expected, state = model.state_dict(), payload["model"]["state_dict"]
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    reshaped = sorted(key for key in expected.keys() & state.keys() if expected[key].shape != state[key].shape)
    if missing or unexpected or reshaped:
        detail = "; ".join(f"{label} e.g. {keys[0]}" for label, keys in
                           (("missing", missing), ("unexpected", unexpected), ("wrong shape", reshaped)) if keys)
        raise InputError(
            f"its weights do not fit the {config['arch']} model with the {config['encoder']} encoder its config describes ({detail})"
        )
    model.load_state_dict(state, strict=True)
    return model


def load_encoder_weights(model: CrackSegModel, path: str | Path) -> None:
    """Copy a torchvision-format encoder state dict into ``model``'s encoder, every tensor checked.

    Classifier tensors (``fc.*``, ``classifier.*``) that the encoder lacks are ignored;
    anything else missing, unexpected or of another shape is an error naming the file.
    """
    state = load_torch_file(path, "encoder weights")
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"{path}: not a state dict (a mapping of names to tensors)")
    if model.arch == "unet16":
        state = {key.removeprefix("features."): value for key, value in state.items()}
    encoder = model.net.encoder
    expected = encoder.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(key for key in state.keys() - expected.keys() if not key.startswith(_HEAD_PREFIXES))
    reshaped = sorted(key for key in expected.keys() & state.keys() if expected[key].shape != state[key].shape)
    if missing or unexpected or reshaped:
        detail = "; ".join(
            f"{label} {len(keys)} (e.g. {keys[0]})"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", reshaped))
            if keys
        )
        raise InputError(f"{path}: not a state dict of the {model.encoder} encoder: {detail}")
    encoder.load_state_dict({key: state[key] for key in expected}, strict=True)
