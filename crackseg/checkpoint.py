"""The one model-file format: :func:`save_model` writes it, :func:`read_checkpoint` / :func:`load_model` read it.

A crackseg file is a dict saved with ``torch.save`` and loaded with ``weights_only=True``::

    {"format": "crackseg", "version": 1,
     "model": {"config": CrackSegModel.config(), "state_dict": weights without prefixes,
               "sha256": weights_digest(state_dict)},  # checked on every load
     ...training state (see :func:`training_state`), when written by training...}

Any such file (``best.pt``, ``last.pt``, ``epoch_NNNN.pt``, a converted classic file) is
enough for :func:`load_model`. Classic crack-segmentation checkpoints are imported by
:func:`convert_classic`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from crackseg.errors import InputError
from crackseg.files import ensure_writable_folder, write_atomic
import crackseg
from crackseg.config import CLASSIC_ENCODERS
from crackseg.models import CrackSegModel, build_model, load_torch_file, model_from_config

FORMAT = "crackseg"
VERSION = 1
PRETRAINED_CONFIG, PRETRAINED_WEIGHTS = "config.json", "model.safetensors"
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # added by DDP / DataParallel and torch.compile


def save_model(model: nn.Module, path: Path, **extra) -> None:
    """Write ``model`` (unwrapped, weights on the CPU) and ``extra`` entries as a crackseg file.

    The file appears whole or not at all: a temp file beside ``path``, fsynced, then renamed.
    """
    payload = {"format": FORMAT, "version": VERSION, "model": _model_entry(model), **extra}

    def write(file) -> None:
        try:
            torch.save(payload, file)
        except RuntimeError as error:  # torch's zip writer hides a failed write (a full disk) behind its own error
            if isinstance(error.__context__, OSError):
                raise error.__context__ from None
            raise

    write_atomic(path, write, durable=True)


def save_pretrained(model: nn.Module, folder: Path) -> None:
    """``folder/config.json`` + ``folder/model.safetensors``: the weights without pickle, for any tool.

    :func:`read_checkpoint` and :func:`load_model` take the folder like a ``.pt`` file.
    """
    import safetensors.torch

    entry = _model_entry(model)
    ensure_writable_folder(Path(folder), "--out")
    tensors = {key: value.contiguous().clone() for key, value in entry["state_dict"].items()}  # shared tensors stored apart
    write_atomic(Path(folder) / PRETRAINED_WEIGHTS, safetensors.torch.save(tensors, metadata={"format": FORMAT}))
    config = {"format": FORMAT, "version": VERSION, "crackseg": crackseg.__version__, "model": entry["config"], "sha256": entry["sha256"]}
    write_atomic(Path(folder) / PRETRAINED_CONFIG, json.dumps(config, indent=1) + "\n")


def read_checkpoint(path: Path) -> dict:
    """Load a file (or safetensors folder) written by crackseg; a missing, torn or foreign one is a one-line error."""
    payload = _read_pretrained(Path(path)) if Path(path).is_dir() else load_torch_file(path, "checkpoint")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        if isinstance(payload, dict) and isinstance(payload.get("model"), dict) and "epoch" in payload:
            raise InputError(f"{path}: a classic crack-segmentation checkpoint; convert it first: crackseg convert {path} --arch ARCH --out model.pt")
        raise InputError(f"{path}: not a crackseg checkpoint")
    if payload.get("version", 0) > VERSION:
        raise InputError(f"{path}: written by a newer crackseg (format version {payload['version']}); upgrade crackseg")
    entry = payload.get("model")
    if isinstance(entry, dict) and "sha256" in entry and weights_digest(entry["state_dict"]) != entry["sha256"]:
        raise InputError(f"{path}: its weights do not match the checksum saved with them (the file is damaged); use another copy")
    return payload


def _read_pretrained(folder: Path) -> dict:
    """The payload of a safetensors folder, shaped like a ``.pt`` file's."""
    import safetensors
    import safetensors.torch

    try:
        config = json.loads((folder / PRETRAINED_CONFIG).read_text())
        state = safetensors.torch.load_file(str(folder / PRETRAINED_WEIGHTS))
    except FileNotFoundError as error:
        raise InputError(f"{folder}: not a crackseg model folder (no {Path(error.filename).name})") from None
    except (ValueError, OSError, safetensors.SafetensorError) as error:
        raise InputError(f"{folder}: not a readable crackseg model folder ({type(error).__name__}: {error})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        raise InputError(f"{folder / PRETRAINED_CONFIG}: not a crackseg model config")
    model = {"config": config["model"], "state_dict": state, **({"sha256": config["sha256"]} if "sha256" in config else {})}
    return {"format": config.get("format"), "version": config.get("version", 0), "model": model}


def weights_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / DataParallel / torch.compile wrappers."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) or hasattr(model, "_orig_mod"):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def _model_entry(model: nn.Module) -> dict:
    """The ``"model"`` entry of a file: config and weights without wrapper prefixes."""
    plain = unwrap(model)
    state = {}
    for key, value in plain.state_dict().items():
        while key.startswith(_WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        state[key] = value.detach().cpu()
    return {"config": plain.config(), "state_dict": state, "sha256": weights_digest(state)}


def load_model(
    path: str | Path, device: str | torch.device = "cpu", arch: str | None = None, encoder: str | None = None
) -> CrackSegModel:
    """The ready model (eval mode, on ``device``) from any crackseg checkpoint or model file.

    With ``arch`` (and ``encoder``), a file holding another model is an error naming what it holds.
    """
    payload = read_checkpoint(Path(path))
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
    config = payload["model"]["config"]
    model = model_from_config(config)
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


def training_state(optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler) -> dict:
    """What a resume needs besides the weights: optimizer, learning-rate schedule, AMP scaler."""
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict() if scaler.is_enabled() else None,
    }


def restore_training_state(payload: dict, optimizer: torch.optim.Optimizer, scheduler, scaler: torch.amp.GradScaler) -> None:
    """Put back what :func:`training_state` saved."""
    optimizer.load_state_dict(payload["optimizer"])
    scheduler.load_state_dict(payload["scheduler"])
    if payload.get("scaler"):
        scaler.load_state_dict(payload["scaler"])


def convert_classic(source: Path, arch: str, out: Path, threshold: float = 0.2, overwrite: bool = False) -> CrackSegModel:
    """Turn a classic ``{'model': state_dict, 'epoch', 'valid_loss', ...}`` file into a crackseg model file.

    Every tensor must match ``arch`` by name and shape. ``threshold`` defaults to 0.2, the
    classic inference script's default.
    """
    if arch not in CLASSIC_ENCODERS:
        raise InputError(f"--arch must be a classic architecture ({', '.join(CLASSIC_ENCODERS)}), got {arch!r}")
    if Path(out).is_dir():
        raise InputError(f"--out {out}: is a folder; give the model file's name, e.g. {Path(out) / 'model.pt'}")
    if Path(out).exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another --out or pass --overwrite")
    ensure_writable_folder(Path(out).parent, "--out")
    classic = load_torch_file(source, "checkpoint")
    if isinstance(classic, dict) and classic.get("format") == FORMAT:
        raise InputError(f"{source}: already a crackseg model file; predict, evaluate and --init take it as it is")
    state = classic.get("model") if isinstance(classic, dict) else None
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise InputError(f"{source}: not a classic checkpoint (no 'model' state dict of tensors inside)")
    state = {key.removeprefix("module."): value for key, value in state.items()}

    model = build_model(arch=arch)
    expected = model.net.state_dict()
    if state.keys() != expected.keys() or any(state[k].shape != expected[k].shape for k in expected):
        holds = next((name for name in CLASSIC_ENCODERS if _classic_shapes(name) == {k: v.shape for k, v in state.items()}), None)
        if holds:
            raise InputError(f"{source}: holds a {holds} model, not the {arch} that was asked for (--arch {holds})")
        missing = sorted(expected.keys() - state.keys())
        detail = f"; missing e.g. {missing[0]}" if missing else ""
        raise InputError(f"{source}: its {len(state)} tensors do not match {arch} ({len(expected)} tensors) by name and shape{detail}")
    model.net.load_state_dict(state, strict=True)
    model.threshold = threshold
    source_info = {key: _plain(value) for key, value in classic.items() if key != "model"}
    save_model(model, Path(out), converted_from={"path": str(source), **source_info})
    return model.eval()


def _classic_shapes(arch: str) -> dict:
    with torch.device("meta"):  # shapes only: no memory, no initialization
        return {key: value.shape for key, value in build_model(arch=arch).net.state_dict().items()}


def _plain(value):
    """Tensors in classic metadata (e.g. ``train_loss``) become numbers or lists."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value
