"""Smooth random fields: the one noise source of the synthetic photos (:mod:`~crackseg.data.synth`, its look-alikes)."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Unit-variance noise correlated over about ``scale`` px: bicubic upsampling of a coarse grid.

    ``shape`` is (H, W) or (N,). PIL's separable resize of a float image is several times faster
    than ``ndimage.zoom``.
    """
    grid_shape = (1, *shape) if len(shape) == 1 else shape
    coarse = tuple(max(2, math.ceil(n / scale)) + 3 for n in grid_shape)
    grid = Image.fromarray(rng.standard_normal(coarse).astype(np.float32))
    fine_shape = tuple(round(c * scale) for c in coarse)
    fine = np.asarray(grid.resize(fine_shape[::-1], Image.Resampling.BICUBIC))
    offset = tuple(int(rng.integers(0, max(1, f - n))) for f, n in zip(fine_shape, grid_shape))
    crop = fine[tuple(slice(o, o + n) for o, n in zip(offset, grid_shape))].reshape(shape)
    return (crop - crop.mean()) / (crop.std() + 1e-6)
