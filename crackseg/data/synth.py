"""Synthetic crack photographs with exact masks: the demo data and the test fixtures.

Each image is concrete- or asphalt-like texture (multi-scale noise, aggregate grains,
stains, an illumination gradient, sensor noise, JPEG compression) with zero to three
branching cracks whose width wanders between about 1 and 10 px, plus unlabelled
distractors that look crack-like (saw-cut joints, scratches, shadow edges). Masks label
crack pixels only. Sample ``i`` of seed ``s`` depends on ``(s, i)`` and the :class:`SynthOptions`
alone, so the same seed gives byte-identical files whatever the order or number of workers.

Hard negatives, stronger look-alikes on every image, are :mod:`crackseg.data.distractors`.

A later visit of the same spots is :mod:`crackseg.data.later_visit`.
"""

from __future__ import annotations

import io
import json
import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image
from scipy import ndimage, special

from crackseg.core.errors import InputError
from crackseg.core.files import write_atomic
from crackseg.data.distractors import add_look_alikes
from crackseg.data.options import CRACK_FREE_FRACTION, SynthOptions
from crackseg.data.noise import smooth_noise
from crackseg.data.synth_folder import dataset_folder

LOOK_ALIKE_STREAM = 0x100CA  # third seed word of the look-alikes' own generator, apart from the sample's
MAX_CRACK_WIDTH = 10.0
EIGHT_CONNECTED = np.ones((3, 3), bool)


@dataclass
class Crack:
    """Nominal geometry of one crack and its branches, measured inside the image."""

    length_px: float
    mean_width_px: float
    max_width_px: float
    branches: int


@dataclass
class SynthSample:
    image: np.ndarray  # (H, W, 3) uint8, before JPEG compression
    mask: np.ndarray  # (H, W) bool, True on crack pixels
    distractors: np.ndarray  # (H, W) bool, crack-like marks that are not cracks
    labels: np.ndarray  # (H, W) uint8: 0 background, k on the pixels of cracks[k - 1]
    cracks: list[Crack] = field(default_factory=list)
    look_alikes: list[str] = field(default_factory=list)  # kinds of crackseg.data.distractors drawn, in order


def make_sample(
    rng: np.random.Generator,
    height: int,
    width: int,
    crack_free: float = CRACK_FREE_FRACTION,
    look_alikes: np.random.Generator | None = None,
) -> SynthSample:
    """Draw one image, its crack mask and its distractor mask.

    ``crack_free`` is the chance of an image without cracks. With ``look_alikes``, a generator of
    their own (so that ``rng`` draws the rest of the sample as it would without them), 1-4 crack
    look-alikes are drawn too, under the cracks: a crack across one stays a crack.
    """
    texture = surface_texture(rng, height, width)
    distractors = np.zeros((height, width), bool)
    shade = np.ones((height, width), np.float32)

    for _ in range(rng.poisson(0.4)):
        _add_joint(rng, shade, distractors)
    for _ in range(rng.poisson(1.0)):
        _add_scratch(rng, texture, distractors)
    if rng.random() < 0.3:
        _add_shadow(rng, shade)
    kinds = add_look_alikes(look_alikes, texture, shade, distractors) if look_alikes is not None else []

    cracks: list[Crack] = []
    mask = np.zeros((height, width), bool)
    labels = np.zeros((height, width), np.uint8)
    if rng.random() >= crack_free:
        centre = np.zeros((height, width), bool)
        half_width = np.zeros((height, width), np.float32)
        owner = np.zeros((height, width), np.uint8)
        while not cracks:  # a crack wholly outside the image is left out; a sample meant to show cracks shows one
            for _ in range(rng.integers(1, 4)):
                crack = _add_crack_path(rng, centre, half_width)
                if crack.length_px:
                    cracks.append(crack)
                    owner[centre & (owner == 0)] = len(cracks)
        mask, depth, labels = rasterize_cracks(rng, centre, half_width, owner)
        shade *= 1.0 - depth

    image = texture * shade * _illumination(rng, height, width)
    tint = 1.0 + rng.normal(0.0, 0.035, 3).astype(np.float32)
    rgb = image[..., None] * tint + rng.normal(0.0, rng.uniform(1.5, 5.0), (height, width, 3))
    return SynthSample(np.clip(rgb, 0, 255).astype(np.uint8), mask, distractors, labels, cracks, kinds)


def write_dataset(
    out: Path,
    count: int,
    size: tuple[int, int],
    seed: int,
    options: SynthOptions = SynthOptions(),
    overwrite: bool = False,
    workers: int = 1,
) -> list[str]:
    """Write ``count`` samples as ``images/<stem>.jpg`` and ``masks/<stem>.png``; return the stems.

    With ``options.truth``, ``truth.json`` maps each stem to its cracks' nominal length and width, and
    ``truth/<stem>.png`` labels each crack pixel with its crack's number in that list (1, 2, ...).
    """
    out = Path(out)
    truth = options.truth
    if count < 1:
        raise InputError(f"--count must be at least 1, got {count}")
    if not 0.0 <= options.crack_free <= 1.0:
        raise InputError(f"--crack-free must be in [0, 1], got {options.crack_free:g}")
    with dataset_folder(out, overwrite) as staging:
        jobs = [(staging, seed, index, size, options) for index in range(count)]
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                results = list(pool.map(_write_one, jobs, chunksize=4))
        else:
            results = [_write_one(job) for job in jobs]
        if truth:
            table = {stem: [vars(c) for c in cracks] for stem, cracks in results}
            write_atomic(staging / "truth.json", json.dumps(table, indent=1, sort_keys=True) + "\n")
    return [stem for stem, _ in results]


def _write_one(job: tuple[Path, int, int, tuple[int, int], SynthOptions]) -> tuple[str, list[Crack]]:
    out, seed, index, (height, width), options = job
    rng = np.random.default_rng([seed, index])
    look_alikes = np.random.default_rng([seed, index, LOOK_ALIKE_STREAM]) if options.hard_negatives else None
    sample = make_sample(rng, height, width, options.crack_free, look_alikes)
    stem = f"{index:05d}"
    buffer = io.BytesIO()
    Image.fromarray(sample.image).save(buffer, "JPEG", quality=int(rng.integers(72, 96)))
    write_atomic(out / "images" / f"{stem}.jpg", buffer.getvalue())
    buffer = io.BytesIO()
    Image.fromarray(sample.mask.astype(np.uint8) * 255).save(buffer, "PNG")
    write_atomic(out / "masks" / f"{stem}.png", buffer.getvalue())
    if options.truth:
        buffer = io.BytesIO()
        Image.fromarray(sample.labels).save(buffer, "PNG")
        write_atomic(out / "truth" / f"{stem}.png", buffer.getvalue())
    cracks = [Crack(*(round(v, 2) if isinstance(v, float) else v for v in vars(c).values())) for c in sample.cracks]
    return stem, cracks


def surface_texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Grey-level surface: asphalt (dark, coarse grains) or concrete (light, fine and smooth)."""
    asphalt = rng.random() < 0.5
    base = rng.uniform(85, 125) if asphalt else rng.uniform(135, 190)
    shape = (height, width)
    surface = np.full(shape, base, np.float32)
    for scale, amplitude in ((1.5, 4.0), (5.0, 5.0), (20.0, 6.0), (80.0, 9.0)):
        surface += rng.uniform(0.5, 1.5) * amplitude * smooth_noise(rng, shape, scale)

    grain_field = smooth_noise(rng, shape, rng.uniform(2.0, 3.5) if asphalt else 1.6)
    grains = grain_field > (rng.uniform(0.6, 1.1) if asphalt else 1.5)
    brightness = 28.0 * smooth_noise(rng, shape, 2.0) + (8.0 if asphalt else -6.0)
    surface += ndimage.gaussian_filter(grains * brightness, 0.6)

    stains = smooth_noise(rng, shape, rng.uniform(25, 70))
    stain_cover = special.expit(4.0 * (stains - rng.uniform(0.8, 1.8)))
    surface *= 1.0 - rng.uniform(0.08, 0.3) * stain_cover
    return surface


def _illumination(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    y = np.linspace(-0.5, 0.5, height, dtype=np.float32)[:, None]
    x = np.linspace(-0.5, 0.5, width, dtype=np.float32)[None, :]
    gx, gy = rng.normal(0.0, 0.25, 2)
    vignette = rng.uniform(0.0, 0.5)
    return 1.0 + gx * x + gy * y - vignette * (x * x + y * y)


class CrackPath(NamedTuple):
    ys: np.ndarray
    xs: np.ndarray
    angles: np.ndarray
    widths: np.ndarray  # nominal full width in px at each step
    inside: np.ndarray  # bool, step lies inside the image


def _add_crack_path(rng: np.random.Generator, centre: np.ndarray, half_width: np.ndarray) -> Crack:
    """Draw a crack as a persistent random walk with branches into the centreline maps."""
    height, width = centre.shape
    length = int(rng.uniform(0.4, 1.3) * max(height, width))
    base_width = float(np.clip(rng.lognormal(math.log(3.0), 0.5), 1.0, 8.0))
    trunk = walk_crack(rng, centre.shape, rng.uniform((0, 0), (height, width)), rng.uniform(0, 2 * math.pi), length, base_width)
    paths = [trunk]
    for _ in range(rng.poisson(1.2)):
        fork = rng.integers(0, len(trunk.ys))
        turn = rng.choice((-1, 1)) * rng.uniform(0.4, 1.2)
        paths.append(
            walk_crack(
                rng,
                centre.shape,
                (trunk.ys[fork], trunk.xs[fork]),
                trunk.angles[fork] + turn,
                int(length * rng.uniform(0.15, 0.5)),
                max(1.0, base_width * rng.uniform(0.35, 0.8)),
            )
        )

    for path in paths:
        rows, cols = np.rint(path.ys[path.inside]).astype(int), np.rint(path.xs[path.inside]).astype(int)
        centre[rows, cols] = True
        np.maximum.at(half_width, (rows, cols), (path.widths[path.inside] / 2).astype(np.float32))

    seen = np.concatenate([path.widths[path.inside] for path in paths])
    if seen.size == 0:  # outside the image: no crack
        return Crack(0.0, 0.0, 0.0, len(paths) - 1)
    return Crack(float(seen.size), float(seen.mean()), float(seen.max()), len(paths) - 1)


def walk_crack(
    rng: np.random.Generator, shape: tuple[int, int], start, angle: float, steps: int, base_width: float
) -> CrackPath:
    """One-pixel steps with a slowly wandering heading and a width that varies and tapers."""
    steps = max(steps, 8)
    angles = angle + np.cumsum(rng.normal(0.0, 0.025, steps)) + 0.3 * smooth_noise(rng, (steps,), 50.0)
    # Small lateral zig-zags: real cracks follow grain boundaries, not smooth curves.
    jitter = 0.8 * smooth_noise(rng, (steps,), 4.0)
    ys = start[0] + np.cumsum(np.sin(angles)) + jitter * np.cos(angles)
    xs = start[1] + np.cumsum(np.cos(angles)) - jitter * np.sin(angles)
    ramp = np.minimum(np.arange(steps), np.arange(steps)[::-1]) / (0.15 * steps)
    taper = np.minimum(1.0, ramp + 0.3)
    widths = np.clip(base_width * np.exp(0.3 * smooth_noise(rng, (steps,), 30.0)) * taper, 1.0, MAX_CRACK_WIDTH)
    rows, cols = np.rint(ys), np.rint(xs)
    inside = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
    return CrackPath(ys, xs, angles, widths, inside)


def rasterize_cracks(
    rng: np.random.Generator, centre: np.ndarray, half_width: np.ndarray, owner: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Crack pixels are those within the local half-width of the nearest centreline pixel.

    Returns the mask, a darkening map in [0, 1) (deepest on the centreline, softened at the
    edges by a slight blur, as a real crack's shadowed interior is) and the crack each pixel
    belongs to: the ``owner`` of its nearest centreline pixel.
    """
    distance, (near_y, near_x) = ndimage.distance_transform_edt(~centre, return_indices=True)
    local = half_width[near_y, near_x]
    mask = distance <= local
    depth_along = np.clip(0.45 + 0.15 * smooth_noise(rng, centre.shape, 30.0), 0.25, 0.7)
    profile = 1.0 - 0.5 * (distance / np.maximum(local, 0.5)) ** 2
    depth = np.where(mask, depth_along * profile, 0.0).astype(np.float32)
    labels = np.where(mask, owner[near_y, near_x], 0).astype(np.uint8)
    return mask, np.clip(ndimage.gaussian_filter(depth, 0.7), 0.0, 0.9), labels


def _add_joint(rng: np.random.Generator, shade: np.ndarray, distractors: np.ndarray) -> None:
    """A straight saw-cut or expansion joint across the whole image."""
    height, width = shade.shape
    angle = rng.choice((0.0, math.pi / 2)) + rng.normal(0.0, 0.05)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    cy, cx = rng.uniform((0, 0), (height, width))
    distance = np.abs((y - cy) * math.cos(angle) - (x - cx) * math.sin(angle))
    half = rng.uniform(1.5, 4.0)
    band = np.clip(half + 0.5 - distance, 0.0, 1.0)
    shade *= 1.0 - rng.uniform(0.2, 0.45) * band
    distractors |= band > 0.5


def _add_scratch(rng: np.random.Generator, texture: np.ndarray, distractors: np.ndarray) -> None:
    """A short, thin, nearly straight mark, lighter or darker than the surface."""
    height, width = texture.shape
    steps = int(rng.uniform(0.1, 0.4) * max(height, width))
    angle = rng.uniform(0, 2 * math.pi) + np.cumsum(rng.normal(0.0, 0.01, steps))
    y0, x0 = rng.uniform((0, 0), (height, width))
    rows = np.rint(y0 + np.cumsum(np.sin(angle))).astype(int)
    cols = np.rint(x0 + np.cumsum(np.cos(angle))).astype(int)
    keep = (rows >= 0) & (rows < height) & (cols >= 0) & (cols < width)
    line = np.zeros_like(distractors)
    line[rows[keep], cols[keep]] = True
    contrast = rng.choice((-1.0, 1.0)) * rng.uniform(10.0, 25.0)
    texture += ndimage.gaussian_filter(line.astype(np.float32), 0.6) * contrast * 2.0
    distractors |= line


def _add_shadow(rng: np.random.Generator, shade: np.ndarray) -> None:
    """A soft-edged cast shadow over part of the image (its edge is a dark straight line)."""
    height, width = shade.shape
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    angle = rng.uniform(0, 2 * math.pi)
    signed = (y - rng.uniform(0, height)) * math.cos(angle) - (x - rng.uniform(0, width)) * math.sin(angle)
    cover = special.expit(signed / rng.uniform(1.5, 8.0))
    shade *= 1.0 - rng.uniform(0.15, 0.4) * cover
