"""Checkpoints of the classic crack-segmentation project (UNet16, UNetResNet) turned into crackseg model files."""

from __future__ import annotations

from pathlib import Path

import torch

from crackseg.core.errors import InputError
from crackseg.model.architectures import CLASSIC
from crackseg.model.checkpoint import FORMAT, check_model_out, load_torch_file, read_checkpoint, save_model
from crackseg.model.networks import CrackSegModel, build_model


CLASSIC_THRESHOLD = 0.2  # the classic inference script's default


def convert_classic(source: Path, arch: str, out: Path, threshold: float = CLASSIC_THRESHOLD, overwrite: bool = False) -> CrackSegModel:
    """Turn a classic ``{'model': state_dict, 'epoch', 'valid_loss', ...}`` file into a crackseg model file.

    Every tensor must match ``arch`` by name and shape.
    """
    if arch not in CLASSIC:
        raise InputError(f"--arch must be a classic architecture ({', '.join(CLASSIC)}), got {arch!r}")
    check_model_out(Path(out), overwrite)
    classic = load_torch_file(source, "checkpoint")
    if isinstance(classic, dict) and classic.get("format") == FORMAT:
        read_checkpoint(source)  # an older or damaged one: the error that says what to do with it
        raise InputError(f"{source}: already a crackseg model file; predict, evaluate and --init take it as it is")
    state = classic.get("model") if isinstance(classic, dict) else None
    if not isinstance(state, dict) or not all(isinstance(value, torch.Tensor) for value in state.values()):
        raise InputError(f"{source}: not a classic checkpoint (no 'model' state dict of tensors inside)")
    state = {key.removeprefix("module."): value for key, value in state.items()}

    model = build_model(arch=arch)
    expected = model.net.state_dict()
    if state.keys() != expected.keys() or any(state[k].shape != expected[k].shape for k in expected):
        holds = next((name for name in CLASSIC if _classic_shapes(name) == {k: v.shape for k, v in state.items()}), None)
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
