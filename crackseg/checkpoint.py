"""Checkpoint files: atomic writes, safe loads, the self-describing model file, classic imports.

A crackseg file is a dict saved with ``torch.save`` and loaded with ``weights_only=True``::

    {"format": "crackseg", "version": 1,
     "model": {"config": CrackSegModel.config(), "state_dict": weights without prefixes},
     ...training state, when written by training...}

Any such file (``best.pt``, ``last.pt``, ``epoch_NNNN.pt``, a converted classic file) is
enough for :func:`load_model`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from crackseg.errors import InputError
from crackseg.files import write_atomic
from crackseg.models import CLASSIC_ENCODERS, CrackSegModel, build_model, load_torch_file, model_from_config

FORMAT = "crackseg"
VERSION = 1
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # added by DDP / DataParallel and torch.compile


def save_atomic(payload: dict, path: Path) -> None:
    """``torch.save`` to a temp file beside ``path``, fsynced, then renamed into place."""
    write_atomic(path, lambda file: torch.save(payload, file), durable=True)


def read_checkpoint(path: Path) -> dict:
    """Load a file written by crackseg; a missing, torn or foreign file is a one-line error."""
    payload = load_torch_file(path, "checkpoint")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        if isinstance(payload, dict) and isinstance(payload.get("model"), dict) and "epoch" in payload:
            raise InputError(f"{path}: a classic crack-segmentation checkpoint; convert it first: crackseg convert {path} --arch ARCH --out model.pt")
        raise InputError(f"{path}: not a crackseg checkpoint")
    if payload.get("version", 0) > VERSION:
        raise InputError(f"{path}: written by a newer crackseg (format version {payload['version']}); upgrade crackseg")
    return payload


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside DDP / DataParallel / torch.compile wrappers."""
    while isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) or hasattr(model, "_orig_mod"):
        model = model.module if hasattr(model, "module") else model._orig_mod
    return model


def model_payload(model: nn.Module) -> dict:
    """The ``"model"`` entry of a checkpoint: config and weights without wrapper prefixes."""
    plain = unwrap(model)
    state = {}
    for key, value in plain.state_dict().items():
        while key.startswith(_WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        state[key] = value.detach().cpu()
    return {"config": plain.config(), "state_dict": state}


def load_model(path: str | Path, device: str | torch.device = "cpu", arch: str | None = None) -> CrackSegModel:
    """The ready model (eval mode, on ``device``) from any crackseg checkpoint or model file.

    With ``arch``, a file holding another architecture is an error that names both.
    """
    payload = read_checkpoint(Path(path))
    config = payload["model"]["config"]
    if arch is not None and config["arch"] != arch:
        raise InputError(f"{path}: holds a {config['arch']} model ({config['encoder']} encoder), not the {arch} that was asked for")
    model = model_from_config(config)
    model.load_state_dict(payload["model"]["state_dict"], strict=True)
    return model.to(device).eval()


def convert_classic(source: Path, arch: str, out: Path, threshold: float = 0.2, overwrite: bool = False) -> CrackSegModel:
    """Turn a classic ``{'model': state_dict, 'epoch', 'valid_loss', ...}`` file into a crackseg model file.

    Every tensor must match ``arch`` by name and shape. ``threshold`` defaults to 0.2, the
    classic inference script's default.
    """
    if arch not in CLASSIC_ENCODERS:
        raise InputError(f"--arch must be a classic architecture ({', '.join(CLASSIC_ENCODERS)}), got {arch!r}")
    if Path(out).exists() and not overwrite:
        raise InputError(f"{out} already exists; choose another --out or pass --overwrite")
    classic = load_torch_file(source, "checkpoint")
    state = classic.get("model") if isinstance(classic, dict) else None
    if not isinstance(state, dict):
        raise InputError(f"{source}: not a classic checkpoint (no 'model' state dict inside)")
    state = {key.removeprefix("module."): value for key, value in state.items()}

    model = build_model(arch=arch)
    expected = model.net.state_dict()
    if state.keys() != expected.keys() or any(state[k].shape != expected[k].shape for k in expected):
        holds = next((name for name in CLASSIC_ENCODERS if _classic_shapes(name) == {k: v.shape for k, v in state.items()}), None)
        if holds:
            raise InputError(f"{source}: holds a {holds} model, not the {arch} that was asked for (--arch {holds})")
        raise InputError(f"{source}: its {len(state)} tensors do not match {arch} ({len(expected)} tensors) by name and shape")
    model.net.load_state_dict(state, strict=True)
    model.threshold = threshold
    source_info = {key: _plain(value) for key, value in classic.items() if key != "model"}
    save_atomic({"format": FORMAT, "version": VERSION, "model": model_payload(model), "converted_from": {"path": str(source), **source_info}}, Path(out))
    return model.eval()


def _classic_shapes(arch: str) -> dict:
    with torch.device("meta"):  # shapes only: no memory, no initialization
        return {key: value.shape for key, value in build_model(arch=arch).net.state_dict().items()}


def _plain(value):
    """Tensors in classic metadata (e.g. ``train_loss``) become numbers or lists."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    return value
