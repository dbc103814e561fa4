"""The deep residual UNet (Zhang, Liu and Wang 2018) in the layout crackpot's Keras model uses, so its weights load.

Every block is pre-activated (BatchNorm, ReLU, convolution) with a 1x1 convolution and BatchNorm on the shortcut;
five encoder levels of 16 to 256 filters, the first four halving the size; a bridge; four decoder levels that
upsample (nearest), concatenate the skip and run a residual block. Convolutions pad as TensorFlow's ``same`` does
(a strided one pads one pixel more after than before on even sides), so outputs match Keras's. Modules are
declared in Keras's creation order: :mod:`crackseg.model.crackpot` pairs them with the Keras layers in that order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FILTERS = (16, 32, 64, 128, 256)
_EPSILON, _MOMENTUM = 1e-3, 0.01  # Keras BatchNormalization's defaults (its momentum 0.99 is torch's 0.01)


class SameConv2d(nn.Conv2d):
    """A convolution padded as TensorFlow's ``padding="same"``: output side ceil(side / stride), the odd pixel after."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1):
        super().__init__(in_channels, out_channels, kernel_size, stride=stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pads = []
        for side, kernel, stride in zip(reversed(x.shape[-2:]), reversed(self.kernel_size), reversed(self.stride)):
            total = max((-(-side // stride) - 1) * stride + kernel - side, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads) if any(pads) else x)


def _norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, eps=_EPSILON, momentum=_MOMENTUM)


class _Block(nn.Module):
    """[BN, ReLU,] conv 3x3 (stride), BN, ReLU, conv 3x3, plus the shortcut's conv 1x1 (stride) and BN when it has one."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1, pre_activation: bool = True, shortcut: bool = True):
        super().__init__()
        self.pre = _norm(in_channels) if pre_activation else None
        self.conv1 = SameConv2d(in_channels, out_channels, 3, stride)
        self.norm1 = _norm(out_channels)
        self.conv2 = SameConv2d(out_channels, out_channels, 3)
        self.shortcut_conv = SameConv2d(in_channels, out_channels, 1, stride) if shortcut else None
        self.shortcut_norm = _norm(out_channels) if shortcut else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.pre(x)) if self.pre is not None else x
        y = self.conv2(F.relu(self.norm1(self.conv1(y))))
        if self.shortcut_conv is None:
            return y
        return y + self.shortcut_norm(self.shortcut_conv(x))


class ResUNet(nn.Module):
    """(N, 3, H, W) scaled images -> (N, 1, H, W) crack logits; H and W multiples of 16."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.ModuleList([_Block(3, FILTERS[0], pre_activation=False)])
        self.encoder.extend(_Block(FILTERS[i - 1], FILTERS[i], stride=2) for i in range(1, len(FILTERS)))
        self.bridge = _Block(FILTERS[-1], FILTERS[-1], shortcut=False)
        skips = FILTERS[-2::-1]  # the encoder levels the decoder meets, deepest first
        outputs = [channels * 2 for channels in skips]
        self.decoder = nn.ModuleList(
            _Block(below + skip, out) for below, skip, out in zip((FILTERS[-1], *outputs[:-1]), skips, outputs)
        )
        self.head = SameConv2d(FILTERS[1], 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.encoder:
            x = block(x)
            skips.append(x)
        x = self.bridge(x)
        for block, skip in zip(self.decoder, reversed(skips[:-1])):
            x = block(torch.cat([F.interpolate(x, scale_factor=2, mode="nearest"), skip], dim=1))
        return self.head(x)
