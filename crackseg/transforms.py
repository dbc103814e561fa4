"""Paired (image, mask) augmentation with ``torchvision.transforms.v2``.

Spatial transforms move image and mask together; ``tv_tensors.Mask`` is always resized
with NEAREST, so masks stay binary. Photometric transforms touch the image only.
Images stay uint8 here; the model converts and normalizes them on the device.
"""

from __future__ import annotations

import math

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


class RandomScaledCrop(v2.Transform):
    """Crop a square of ``size / s`` px and resize it to ``size``, s log-uniform in ``scale``.

    Unlike ``RandomResizedCrop`` (area fractions of the whole photo), this keeps cracks near
    their native width whatever the photo's size. Photos smaller than the region are
    zero-padded (mask 0 there).
    """

    def __init__(self, size: int, scale: tuple[float, float] = (0.75, 1.33)):
        super().__init__()
        self.size = size
        self.scale = scale

    def make_params(self, flat_inputs: list) -> dict:
        height, width = v2.query_size(flat_inputs)
        log_low, log_high = math.log(self.scale[0]), math.log(self.scale[1])
        factor = math.exp(log_low + (log_high - log_low) * torch.rand(()).item())
        region = max(1, round(self.size / factor))
        pad_bottom, pad_right = max(0, region - height), max(0, region - width)
        top = int(torch.randint(0, max(height, region) - region + 1, ()).item())
        left = int(torch.randint(0, max(width, region) - region + 1, ()).item())
        return {"region": region, "top": top, "left": left, "pad": [0, 0, pad_right, pad_bottom]}

    def transform(self, inpt, params: dict):
        if any(params["pad"]):
            inpt = F.pad(inpt, params["pad"], fill=0)
        region = params["region"]
        if region == self.size:
            return F.crop(inpt, params["top"], params["left"], region, region)
        return F.resized_crop(inpt, params["top"], params["left"], region, region, [self.size, self.size], antialias=True)


class RandomRotate90(v2.Transform):
    """Rotate by 0, 90, 180 or 270 degrees: exact, no interpolation."""

    def make_params(self, flat_inputs: list) -> dict:
        return {"turns": int(torch.randint(0, 4, ()).item())}

    def transform(self, inpt, params: dict):
        if params["turns"] == 0:
            return inpt
        return tv_tensors.wrap(torch.rot90(inpt, params["turns"], dims=(-2, -1)), like=inpt)


def train_transform(crop_size: int, scale: tuple[float, float] = (0.75, 1.33), photometric: bool = True) -> v2.Transform:
    """Random scaled crop, flips, 90-degree rotations; brightness, contrast, blur and noise on the image."""
    steps = [RandomScaledCrop(crop_size, scale), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), RandomRotate90()]
    if photometric:
        steps += [
            v2.RandomApply([v2.ColorJitter(brightness=0.25, contrast=0.25)], p=0.8),
            v2.RandomApply([v2.GaussianBlur(5, sigma=(0.1, 1.2))], p=0.2),
            v2.RandomApply([v2.GaussianNoise(sigma=0.03)], p=0.2),
        ]
    return v2.Compose(steps)
