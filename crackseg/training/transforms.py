"""Training augmentation in two halves: geometric per sample in loader workers, photometric per batch on the device.

On a GPU the geometric half moves to the device too (``--augment-on device``): the workers only cut fixed-size
windows, and :class:`DeviceGeometry` scales, flips and turns whole batches of them.

Spatial transforms (``torchvision.transforms.v2``) move image and mask together;
``tv_tensors.Mask`` is always resized with NEAREST, so masks stay binary. Images stay
uint8 in the workers. Brightness, contrast, blur and noise touch the image only, so they
run on whole batches where the model runs: a GPU training thousands of images a second
needs every worker millisecond it can get (their cost is in docs/benchmarks.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

GREY_WEIGHTS = torch.tensor([0.2989, 0.587, 0.114])  # torchvision's rgb_to_grayscale


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


SCALE = (0.75, 1.33)  # zoom of the scaled crops: cracks stay near their native width


def train_transform(crop_size: int, scale: tuple[float, float] = SCALE) -> v2.Transform:
    """Random scaled crop, flips and 90-degree rotations of image and mask together."""
    return v2.Compose([RandomScaledCrop(crop_size, scale), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), RandomRotate90()])


def window_transform(crop_size: int, scale: tuple[float, float] = SCALE) -> v2.Transform:
    """A loader worker's half of :class:`DeviceGeometry`: an unscaled square window, as large as the largest region
    a scaled crop takes (zero-padded where the photo is smaller), cut with no resampling."""
    return RandomScaledCrop(window_side(crop_size, scale), (1.0, 1.0))


def window_side(crop_size: int, scale: tuple[float, float] = SCALE) -> int:
    return math.ceil(crop_size / scale[0])


@dataclass(frozen=True)
class DeviceGeometry:
    """The scaled crop, flips and 90-degree turns of :func:`train_transform`, on a batch of windows on the device.

    Takes (N, 3, S, S) uint8 images and (N, 1, S, S) masks cut by :func:`window_transform` and returns (N, 3, C, C)
    uint8 and (N, 1, C, C) masks, ``C = crop_size``: each a region of side ``C / s`` (``s`` log-uniform in ``scale``)
    at a random place in its window, resampled in one batched ``grid_sample`` (bilinear for the image, nearest for
    the mask, so it stays binary) with its flips and turn. The draws come from the host's generator, as
    :class:`PhotometricJitter`'s do. Unlike the workers' crop, a region zoomed out is not antialiased (at most
    1 / 0.75 = 1.33x), and a region's place in the photo is a window's place plus its place in the window.
    """

    crop_size: int
    scale: tuple[float, float] = SCALE

    def __call__(self, images: torch.Tensor, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        count, side, device = images.shape[0], images.shape[-1], images.device
        low, high = math.log(self.scale[0]), math.log(self.scale[1])
        region = self.crop_size / torch.exp(low + (high - low) * torch.rand(count))  # px of the window
        centre = region / 2 + (side - region) * torch.rand(2, count)  # x, y in the window's px
        flips = torch.where(torch.rand(2, count) < 0.5, -1.0, 1.0)
        turns = torch.randint(0, 4, (count,))
        cos, sin = torch.tensor([1.0, 0.0, -1.0, 0.0])[turns], torch.tensor([0.0, 1.0, 0.0, -1.0])[turns]
        theta = torch.zeros(count, 2, 3)
        half = region / side  # the region's half side over the window's, as affine_grid measures it
        theta[:, 0, 0], theta[:, 0, 1] = half * cos * flips[0], -half * sin * flips[1]
        theta[:, 1, 0], theta[:, 1, 1] = half * sin * flips[0], half * cos * flips[1]
        theta[:, :, 2] = (2 * centre / side - 1).T
        grid = torch.nn.functional.affine_grid(theta.to(device, non_blocking=True), [count, 1, self.crop_size, self.crop_size],
                                               align_corners=False)
        pixels = torch.nn.functional.grid_sample(images.float(), grid, mode="bilinear", align_corners=False)
        labels = torch.nn.functional.grid_sample(masks.float(), grid, mode="nearest", align_corners=False)
        return pixels.round_().clamp_(0, 255).to(torch.uint8), labels.to(masks.dtype)


@dataclass(frozen=True)
class PhotometricJitter:
    """Per-image brightness and contrast (p=0.8), Gaussian blur (p=0.2) and noise (p=0.2) on a batch.

    Takes (N, 3, H, W) uint8 on any device, returns float in [0, 1] there. Each operation
    matches its ``torchvision.transforms.v2`` counterpart (``ColorJitter`` with brightness
    before contrast, ``GaussianBlur`` with reflected edges, ``GaussianNoise``). The choices
    and factors are drawn on the host, so choosing which images to blur never waits for the
    device; the noise comes from the device's generator. The trainer reseeds both every epoch.
    """

    brightness: float = 0.25
    contrast: float = 0.25
    jitter_p: float = 0.8
    blur_size: int = 5
    blur_sigma: tuple[float, float] = (0.1, 1.2)
    blur_p: float = 0.2
    noise_sigma: float = 0.03
    noise_p: float = 0.2

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        count, device = images.shape[0], images.device

        def uniform(low: float, high: float) -> torch.Tensor:
            return low + (high - low) * torch.rand(count)

        jitter = torch.rand(count) < self.jitter_p
        brightness = torch.where(jitter, uniform(1 - self.brightness, 1 + self.brightness), 1.0)
        contrast = torch.where(jitter, uniform(1 - self.contrast, 1 + self.contrast), 1.0)
        blurred = torch.nonzero(torch.rand(count) < self.blur_p).flatten()
        sigma = uniform(*self.blur_sigma)[blurred]
        noisy = torch.nonzero(torch.rand(count) < self.noise_p).flatten()

        def to_device(values: torch.Tensor) -> torch.Tensor:
            return values.to(device, non_blocking=True)  # a blocking copy would wait for the device

        factors = to_device(torch.stack([brightness, contrast]).view(2, count, 1, 1, 1))
        x = (images.float() / 255 * factors[0]).clamp_(0, 1)
        grey_mean = (x.mean(dim=(-2, -1)) @ to_device(GREY_WEIGHTS)).view(count, 1, 1, 1)
        x = (factors[1] * x + (1 - factors[1]) * grey_mean).clamp_(0, 1)
        if len(blurred):
            index = to_device(blurred)
            x[index] = gaussian_blur(x[index], to_device(sigma), self.blur_size)
        if len(noisy):
            index = to_device(noisy)
            x[index] = (x[index] + self.noise_sigma * torch.randn((len(noisy), *x.shape[1:]), device=device)).clamp_(0, 1)
        return x


def gaussian_blur(images: torch.Tensor, sigma: torch.Tensor, size: int) -> torch.Tensor:
    """Separable Gaussian blur of (N, C, H, W) float images, one ``sigma`` per image, reflected edges."""
    count, channels, height, width = images.shape
    offsets = torch.arange(size, device=images.device, dtype=images.dtype) - (size - 1) / 2
    kernels = torch.exp(-0.5 * (offsets / sigma[:, None]) ** 2)
    kernels = (kernels / kernels.sum(dim=1, keepdim=True)).repeat_interleave(channels, dim=0)
    half = size // 2
    x = torch.nn.functional.pad(images.reshape(1, count * channels, height, width), (half, half, half, half), mode="reflect")
    x = torch.nn.functional.conv2d(x, kernels.view(-1, 1, size, 1), groups=count * channels)
    x = torch.nn.functional.conv2d(x, kernels.view(-1, 1, 1, size), groups=count * channels)
    return x.view(count, channels, height, width)
