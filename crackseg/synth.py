"""Synthetic crack photographs with exact masks: the demo data and the test fixtures.

Each image is concrete- or asphalt-like texture (multi-scale noise, aggregate grains,
stains, an illumination gradient, sensor noise, JPEG compression) with zero to three
branching cracks whose width wanders between about 1 and 10 px, plus unlabelled
distractors that look crack-like (saw-cut joints, scratches, shadow edges). Masks label
crack pixels only. Sample ``i`` of seed ``s`` depends on ``(s, i)`` alone, so the same
seed gives byte-identical files whatever the order or number of workers.

A later visit (:func:`write_later_visit`) photographs the same spots again: the camera moved
a little, cracks grew or were repaired, and ``truth.json`` says how, for ``crackseg compare``.
"""

from __future__ import annotations

import io
import json
import math
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image
from scipy import ndimage, special
from skimage.morphology import skeletonize

from crackseg.errors import InputError
from crackseg.files import ensure_writable_folder, remove_orphan_temps, write_atomic

CRACK_FREE_FRACTION = 0.15
_SYNTH_NAME = re.compile(r"images/\d{5,}\.jpg|(masks|truth)/\d{5,}\.png|truth\.json")
MAX_CRACK_WIDTH = 10.0
# A later visit (write_later_visit): chances per crack region, and of a new crack per photo
REPAIR_CHANCE, EXTEND_CHANCE, WIDEN_CHANCE, NEW_CRACK_CHANCE = 0.15, 0.35, 0.35, 0.3
MIN_CHANGED_PX = 30  # smaller regions (a crack's corner cut off by the border) stay as they are
_LATER_VISIT = 1  # third seed word: a later visit draws apart from the photos it revisits
CLEARANCE_PX = 3  # surface kept between a change and other cracks, so that no two cracks join
VIEW_MARGIN = 0.05  # of the size: new crack lines keep off the border, which the camera move may take out of view
_EIGHT = np.ones((3, 3), bool)


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


def parse_size(text: str) -> tuple[int, int]:
    """``"256"`` -> (256, 256); ``"320x480"`` -> (320, 480) as (height, width)."""
    parts = text.lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() for p in parts):
        raise ValueError(f"size must be N or HxW in pixels, got {text!r}")
    height, width = int(parts[0]), int(parts[-1])
    if min(height, width) < 16:
        raise ValueError(f"size must be at least 16 px, got {text!r}")
    return height, width


def make_sample(rng: np.random.Generator, height: int, width: int) -> SynthSample:
    """Draw one image, its crack mask and its distractor mask."""
    texture = _texture(rng, height, width)
    distractors = np.zeros((height, width), bool)
    shade = np.ones((height, width), np.float32)

    for _ in range(rng.poisson(0.4)):
        _add_joint(rng, shade, distractors)
    for _ in range(rng.poisson(1.0)):
        _add_scratch(rng, texture, distractors)
    if rng.random() < 0.3:
        _add_shadow(rng, shade)

    cracks: list[Crack] = []
    mask = np.zeros((height, width), bool)
    labels = np.zeros((height, width), np.uint8)
    if rng.random() >= CRACK_FREE_FRACTION:
        centre = np.zeros((height, width), bool)
        half_width = np.zeros((height, width), np.float32)
        owner = np.zeros((height, width), np.uint8)
        for number in range(1, rng.integers(1, 4) + 1):
            cracks.append(_add_crack_path(rng, centre, half_width))
            owner[centre & (owner == 0)] = number
        mask, depth, labels = _rasterize_cracks(rng, centre, half_width, owner)
        shade *= 1.0 - depth

    image = texture * shade * _illumination(rng, height, width)
    tint = 1.0 + rng.normal(0.0, 0.035, 3).astype(np.float32)
    rgb = image[..., None] * tint + rng.normal(0.0, rng.uniform(1.5, 5.0), (height, width, 3))
    return SynthSample(np.clip(rgb, 0, 255).astype(np.uint8), mask, distractors, labels, cracks)


def write_dataset(
    out: Path,
    count: int,
    size: tuple[int, int],
    seed: int,
    truth: bool = False,
    overwrite: bool = False,
    workers: int = 1,
) -> list[str]:
    """Write ``count`` samples as ``images/<stem>.jpg`` and ``masks/<stem>.png``; return the stems.

    With ``truth``, ``truth.json`` maps each stem to its cracks' nominal length and width, and
    ``truth/<stem>.png`` labels each crack pixel with its crack's number in that list (1, 2, ...).
    """
    out = Path(out)
    if count < 1:
        raise InputError(f"--count must be at least 1, got {count}")
    previous = _claim_folder(out, overwrite)
    jobs = [(out, seed, index, size, truth) for index in range(count)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(_write_one, jobs, chunksize=4))
    else:
        results = [_write_one(job) for job in jobs]

    if truth:
        table = {stem: [vars(c) for c in cracks] for stem, cracks in results}
        write_atomic(out / "truth.json", json.dumps(table, indent=1, sort_keys=True) + "\n")
    written = {out / "images" / f"{stem}.jpg" for stem, _ in results} | {out / "masks" / f"{stem}.png" for stem, _ in results}
    if truth:
        written |= {out / "truth.json"} | {out / "truth" / f"{stem}.png" for stem, _ in results}
    for stale in set(previous) - written:  # what a larger or --truth run left: the dataset is this run's alone
        stale.unlink()
    return [stem for stem, _ in results]


def _claim_folder(out: Path, overwrite: bool) -> list[Path]:
    """Make ``out`` ready for a dataset and return what an earlier synth run left there (to replace)."""
    ensure_writable_folder(out, "OUT")
    previous = _previous_files(out)
    if previous and not overwrite:
        raise InputError(f"{previous[0].parent} already holds files; choose another folder or pass --overwrite")
    for sub in ("images", "masks"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    return previous


def _previous_files(out: Path) -> list[Path]:
    """Files an earlier synth run left in ``out``; anything synth does not write there is an error.

    ``--overwrite`` replaces a synthetic dataset, never a folder of other files. Temp files of
    an interrupted run are removed first.
    """
    for folder in (out, out / "images", out / "masks", out / "truth"):
        remove_orphan_temps(folder)
    found = sorted(p for sub in ("images", "masks", "truth") if (out / sub).is_dir() for p in (out / sub).iterdir())
    found += [out / "truth.json"] if (out / "truth.json").exists() else []
    foreign = [p for p in found if not _SYNTH_NAME.fullmatch(p.relative_to(out).as_posix())]
    if foreign:
        raise InputError(f"{foreign[0]}: not written by crackseg synth; write the synthetic dataset into another folder")
    return found


def _write_one(job: tuple[Path, int, int, tuple[int, int], bool]) -> tuple[str, list[Crack]]:
    out, seed, index, (height, width), truth = job
    rng = np.random.default_rng([seed, index])
    sample = make_sample(rng, height, width)
    stem = f"{index:05d}"
    buffer = io.BytesIO()
    Image.fromarray(sample.image).save(buffer, "JPEG", quality=int(rng.integers(72, 96)))
    write_atomic(out / "images" / f"{stem}.jpg", buffer.getvalue())
    buffer = io.BytesIO()
    Image.fromarray(sample.mask.astype(np.uint8) * 255).save(buffer, "PNG")
    write_atomic(out / "masks" / f"{stem}.png", buffer.getvalue())
    if truth:
        buffer = io.BytesIO()
        Image.fromarray(sample.labels).save(buffer, "PNG")
        write_atomic(out / "truth" / f"{stem}.png", buffer.getvalue())
    cracks = [Crack(*(round(v, 2) if isinstance(v, float) else v for v in vars(c).values())) for c in sample.cracks]
    return stem, cracks


def write_later_visit(out: Path, earlier: Path, seed: int, overwrite: bool = False, workers: int = 1) -> list[str]:
    """Write a later inspection of the spots of the synthetic dataset ``earlier`` under the same names; return the stems.

    The camera moved a little and some cracks grew wider or longer or were repaired; now and then a new one
    appeared. ``truth.json`` says how, per stem, so that ``crackseg compare EARLIER OUT`` can be checked:
    ``camera`` (rotation_deg, scale, shift_px, and ``matrix``: EARLIER (col, row, 1) -> OUT at pixel centres);
    ``cracks``, one per crack of the earlier mask (its pixels joined across gaps of up to 2 px, numbered in
    scan order) with its ``status`` (unchanged, wider, longer, longer+wider, gone), ``dilated_px``,
    ``extended_px`` and ``pixels`` [before, after]; and the ``new`` ones. Their ``earlier_point`` and
    ``later_point`` are (row, col) on the crack in each photo's pixels.
    """
    out, earlier = Path(out), Path(earlier)
    if not ((earlier / "images").is_dir() and (earlier / "masks").is_dir()):
        raise InputError(f"--later-visit {earlier}: not a dataset written by crackseg synth (it needs images/ and masks/)")
    stems = sorted(p.stem for p in (earlier / "images").iterdir() if _SYNTH_NAME.fullmatch(f"images/{p.name}"))
    missing = [earlier / "masks" / f"{stem}.png" for stem in stems if not (earlier / "masks" / f"{stem}.png").is_file()]
    if not stems or missing:
        raise InputError(f"--later-visit {missing[0] if missing else earlier / 'images'}: missing; give a dataset written by crackseg synth")
    if out.resolve() == earlier.resolve():
        raise InputError(f"OUT {out}: is the --later-visit dataset itself; write the later visit into another folder")
    previous = _claim_folder(out, overwrite)
    jobs = [(out, earlier, seed, stem) for stem in stems]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            truth = dict(pool.map(_write_later, jobs, chunksize=4))
    else:
        truth = dict(map(_write_later, jobs))
    write_atomic(out / "truth.json", json.dumps(truth, indent=1, sort_keys=True) + "\n")
    written = {out / sub / f"{stem}.{kind}" for stem in stems for sub, kind in (("images", "jpg"), ("masks", "png"))}
    for stale in set(previous) - written - {out / "truth.json"}:
        stale.unlink()
    return stems


def _write_later(job: tuple[Path, Path, int, str]) -> tuple[str, dict]:
    out, earlier, seed, stem = job
    rng = np.random.default_rng([seed, int(stem), _LATER_VISIT])
    photo = np.asarray(Image.open(earlier / "images" / f"{stem}.jpg").convert("RGB"), np.float32)
    mask = np.asarray(Image.open(earlier / "masks" / f"{stem}.png").convert("L")) > 127
    cracks = ndimage.label(ndimage.binary_dilation(mask, _EIGHT), _EIGHT)[0] * mask
    fates = [_change_crack(rng, photo, cracks, number) for number in range(1, int(cracks.max()) + 1)]
    new = [crack for crack in [_new_crack(rng, photo, cracks)] if crack] if rng.random() < NEW_CRACK_CHANCE else []
    matrix, camera = _camera_move(rng, mask.shape)
    for crack in fates + new:
        col, row, _ = matrix @ (crack["earlier_point"][1], crack["earlier_point"][0], 1)
        crack["later_point"] = [round(row, 1), round(col, 1)]
    mask = cracks > 0
    if mask.any():  # warped as the signed distance to the crack edges: a resampled mask would break 1 px cracks
        signed = np.where(mask, ndimage.distance_transform_edt(mask) - 0.5, 0.5 - ndimage.distance_transform_edt(~mask))
        mask = _warp(signed, matrix, 1) >= -0.01
    buffer = io.BytesIO()
    Image.fromarray(np.clip(_warp(photo, matrix, 3), 0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=int(rng.integers(72, 96)))
    write_atomic(out / "images" / f"{stem}.jpg", buffer.getvalue())
    buffer = io.BytesIO()
    Image.fromarray(mask.astype(np.uint8) * 255).save(buffer, "PNG")
    write_atomic(out / "masks" / f"{stem}.png", buffer.getvalue())
    return stem, {"camera": camera, "cracks": fates, "new": new}


def _change_crack(rng: np.random.Generator, photo: np.ndarray, cracks: np.ndarray, number: int) -> dict:
    """Repair, or extend and/or widen, crack ``number`` of ``cracks`` (labels) in ``photo``, both changed in place."""
    crack = cracks == number
    before = int(crack.sum())
    fate = {"region": number, "earlier_point": _middle(crack), "status": "unchanged", "pixels": [before, before]}
    if before < MIN_CHANGED_PX:
        return fate
    if rng.random() < REPAIR_CHANCE:
        _repair(rng, photo, crack, cracks > 0)
        cracks[crack] = 0
        return fate | {"status": "gone", "pixels": [before, 0]}
    changes = []
    if rng.random() < EXTEND_CHANCE and (added := _extend(rng, photo, cracks, number)):
        changes, fate["extended_px"] = ["longer"], added
    if rng.random() < WIDEN_CHANCE:
        fate["dilated_px"] = int(rng.integers(1, 3))
        grown = ndimage.binary_dilation(cracks == number, iterations=fate["dilated_px"]) & ~_near(cracks, number, CLEARANCE_PX)
        # The edges move out and the dark interior spreads with them: each pixel takes the darkest within reach.
        _paint(photo, grown, ndimage.minimum_filter(photo, (2 * fate["dilated_px"] + 1,) * 2 + (1,)))
        cracks[grown] = number
        changes.append("wider")
    return fate | {"status": "+".join(changes) or "unchanged", "pixels": [before, int((cracks == number).sum())]}


def _extend(rng: np.random.Generator, photo: np.ndarray, cracks: np.ndarray, number: int) -> int:
    """Continue a crack 15-40 px from an end, along its last 8 px, with its width there and its darkness.

    Returns the px added, 0 when no end has room (all at the border or near other cracks).
    """
    crack = cracks == number
    joined = ndimage.binary_dilation(crack, _EIGHT)  # one piece across the crack's pixel gaps; 1 px wider all round
    skeleton = skeletonize(joined)
    ends = np.argwhere(skeleton & (ndimage.convolve(skeleton.astype(np.uint8), _EIGHT.astype(np.uint8), mode="constant") == 2))
    grey = photo.mean(axis=2)
    ring = ndimage.binary_dilation(crack, iterations=3) & ~ndimage.binary_dilation(cracks > 0)
    darkness = float(np.clip(np.median(grey[crack]) / np.median(grey[ring]), 0.3, 0.95)) if ring.any() else 0.6
    widths, behind = 2.0 * ndimage.distance_transform_edt(joined) - 3.0, np.argwhere(skeleton)
    for end in rng.permutation(ends):
        dy, dx = end - behind[np.hypot(*(behind - end).T) <= 8].mean(axis=0)
        path = _walk(rng, crack.shape, end, math.atan2(dy, dx), int(rng.integers(15, 41)), 1.0)
        # From the end itself, whatever the walk's zig-zag there, tapering towards the new tip.
        path = path._replace(ys=path.ys - path.ys[0] + end[0], xs=path.xs - path.xs[0] + end[1],
                             widths=np.maximum(1.0, widths[tuple(end)] * np.linspace(1.0, 0.5, len(path.ys))))
        traced = _trace(rng, path, cracks, number, 12)
        if traced:
            _paint(photo, traced[0] & ~crack, photo * darkness)
            cracks[traced[0]] = number
            return traced[2]
    return 0


def _new_crack(rng: np.random.Generator, photo: np.ndarray, cracks: np.ndarray) -> dict | None:
    """A crack 15-40% of the photo long, drawn as synth draws cracks, clear of the others (None: no room in 5 tries)."""
    height, width = cracks.shape
    for _ in range(5):
        base_width = float(np.clip(rng.lognormal(math.log(2.5), 0.4), 1.0, 6.0))
        path = _walk(rng, cracks.shape, rng.uniform((0, 0), (height, width)), rng.uniform(0, 2 * math.pi),
                     int(rng.uniform(0.15, 0.4) * max(height, width)), base_width)
        traced = _trace(rng, path, cracks, 0, 12)
        if traced:
            pixels, depth, steps = traced
            photo *= 1.0 - depth[..., None]
            cracks[pixels] = cracks.max() + 1
            return {"status": "new", "earlier_point": _middle(pixels), "pixels": [0, int(pixels.sum())], "length_px": steps}
    return None


def _near(cracks: np.ndarray, number: int, distance: int) -> np.ndarray:
    """Pixels within ``distance`` px (chessboard) of a crack other than ``number``: changes keep out, so cracks stay apart."""
    return ndimage.binary_dilation((cracks > 0) & (cracks != number), _EIGHT, iterations=distance)


def _trace(rng: np.random.Generator, path: _Path, cracks: np.ndarray, number: int, min_steps: int) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Rasterize ``path`` of crack ``number`` (0: a new one) as synth rasterizes cracks, up to its first step near
    another crack or VIEW_MARGIN of the size from the border (which the camera move may take out of view).

    Returns the crack pixels (CLEARANCE_PX from the others), their darkening and the steps kept; None when
    fewer than ``min_steps``.
    """
    blocked, clear = _near(cracks, number, CLEARANCE_PX + 2), ~_near(cracks, number, CLEARANCE_PX)
    half_steps = np.arange(2 * len(path.ys) - 1) / 2  # rounded to pixels, points half a step apart always touch
    ys, xs, widths = (np.interp(half_steps, np.arange(len(path.ys)), values) for values in (path.ys, path.xs, path.widths))
    rows, cols = np.rint(ys).astype(int), np.rint(xs).astype(int)
    (height, width), margin = blocked.shape, round(VIEW_MARGIN * max(blocked.shape))
    inside = (rows >= margin) & (rows < height - margin) & (cols >= margin) & (cols < width - margin)
    stop = ~inside | blocked[rows.clip(0, height - 1), cols.clip(0, width - 1)]
    kept = int(np.argmax(stop)) if stop.any() else len(rows)
    if kept < 2 * min_steps:
        return None
    centre, half_width = np.zeros(blocked.shape, bool), np.zeros(blocked.shape, np.float32)
    centre[rows[:kept], cols[:kept]] = True
    np.maximum.at(half_width, (rows[:kept], cols[:kept]), (widths[:kept] / 2).astype(np.float32))
    pixels, depth, _ = _rasterize_cracks(rng, centre, half_width, centre.astype(np.uint8))
    return pixels & clear, depth * clear, kept // 2


def _repair(rng: np.random.Generator, photo: np.ndarray, crack: np.ndarray, cracks: np.ndarray) -> None:
    """Paint a repaired crack over with the intact surface nearby, smoothed, plus fine texture copied from 12-30 px away."""
    intact = ~ndimage.binary_dilation(cracks, iterations=2)
    weight = ndimage.gaussian_filter(intact.astype(np.float32), 5.0)[..., None]
    smooth = ndimage.gaussian_filter(photo * intact[..., None], (5.0, 5.0, 0)) / np.maximum(weight, 1e-3)
    detail = np.where(intact[..., None], photo - ndimage.gaussian_filter(photo, (2.0, 2.0, 0)), 0.0)
    shift = tuple(int(v) for v in rng.choice((-1, 1), 2) * rng.integers(12, 31, 2))
    hole = ndimage.binary_dilation(crack, iterations=2) & ~ndimage.binary_dilation(cracks & ~crack, _EIGHT)
    _paint(photo, hole, smooth + np.roll(detail, shift, axis=(0, 1)))


def _paint(photo: np.ndarray, pixels: np.ndarray, target: np.ndarray) -> None:
    """Blend ``target`` into ``photo`` on ``pixels``, fading out over about a pixel as synth's crack edges do."""
    alpha = np.maximum(pixels, ndimage.gaussian_filter(pixels.astype(np.float32), 0.7))[..., None]
    photo += alpha * (target - photo)


def _middle(pixels: np.ndarray) -> list[int]:
    """The pixel (row, col) of a crack nearest its centroid: a point on it to find it by."""
    cells = np.argwhere(pixels)
    return cells[np.argmin(((cells - cells.mean(axis=0)) ** 2).sum(axis=1))].tolist()


def _camera_move(rng: np.random.Generator, shape: tuple[int, int]) -> tuple[np.ndarray, dict]:
    """Turned up to 3 degrees (clockwise as seen) and scaled within 3% about the centre, shifted up to 3% of the size."""
    height, width = shape
    camera = {"rotation_deg": round(rng.uniform(-3.0, 3.0), 2), "scale": round(rng.uniform(0.97, 1.03), 4),
              "shift_px": [round(v, 2) for v in rng.uniform(-0.03, 0.03, 2) * (width, height)]}
    turn = math.radians(camera["rotation_deg"])
    linear = camera["scale"] * np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
    centre = np.array([width - 1, height - 1]) / 2
    matrix = np.round(np.vstack([np.column_stack([linear, centre + camera["shift_px"] - linear @ centre]), [0, 0, 1]]), 6)
    return matrix, camera | {"matrix": matrix.tolist()}


def _warp(array: np.ndarray, matrix: np.ndarray, order: int) -> np.ndarray:
    """``array`` (H, W[, C]) as the moved camera sees it; what comes into view at a border mirrors what is inside it."""
    if array.ndim == 3:
        return np.stack([_warp(channel, matrix, order) for channel in np.moveaxis(array, -1, 0)], axis=-1)
    inverse = np.linalg.inv(matrix)[[1, 0]][:, [1, 0, 2]]  # OUT (row, col, 1) -> EARLIER (row, col)
    return ndimage.affine_transform(array, inverse[:, :2], inverse[:, 2], order=order, mode="reflect")


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], scale: float) -> np.ndarray:
    """Unit-variance noise correlated over about ``scale`` px: bicubic upsampling of a coarse grid.

    PIL's separable resize of a float image is several times faster than ``ndimage.zoom``.
    """
    grid_shape = (1, *shape) if len(shape) == 1 else shape
    coarse = tuple(max(2, math.ceil(n / scale)) + 3 for n in grid_shape)
    grid = Image.fromarray(rng.standard_normal(coarse).astype(np.float32))
    fine_shape = tuple(round(c * scale) for c in coarse)
    fine = np.asarray(grid.resize(fine_shape[::-1], Image.Resampling.BICUBIC))
    offset = tuple(int(rng.integers(0, max(1, f - n))) for f, n in zip(fine_shape, grid_shape))
    crop = fine[tuple(slice(o, o + n) for o, n in zip(offset, grid_shape))].reshape(shape)
    return (crop - crop.mean()) / (crop.std() + 1e-6)


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Grey-level surface: asphalt (dark, coarse grains) or concrete (light, fine and smooth)."""
    asphalt = rng.random() < 0.5
    base = rng.uniform(85, 125) if asphalt else rng.uniform(135, 190)
    shape = (height, width)
    surface = np.full(shape, base, np.float32)
    for scale, amplitude in ((1.5, 4.0), (5.0, 5.0), (20.0, 6.0), (80.0, 9.0)):
        surface += rng.uniform(0.5, 1.5) * amplitude * _smooth_noise(rng, shape, scale)

    grain_field = _smooth_noise(rng, shape, rng.uniform(2.0, 3.5) if asphalt else 1.6)
    grains = grain_field > (rng.uniform(0.6, 1.1) if asphalt else 1.5)
    brightness = 28.0 * _smooth_noise(rng, shape, 2.0) + (8.0 if asphalt else -6.0)
    surface += ndimage.gaussian_filter(grains * brightness, 0.6)

    stains = _smooth_noise(rng, shape, rng.uniform(25, 70))
    stain_cover = special.expit(4.0 * (stains - rng.uniform(0.8, 1.8)))
    surface *= 1.0 - rng.uniform(0.08, 0.3) * stain_cover
    return surface


def _illumination(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    y = np.linspace(-0.5, 0.5, height, dtype=np.float32)[:, None]
    x = np.linspace(-0.5, 0.5, width, dtype=np.float32)[None, :]
    gx, gy = rng.normal(0.0, 0.25, 2)
    vignette = rng.uniform(0.0, 0.5)
    return 1.0 + gx * x + gy * y - vignette * (x * x + y * y)


class _Path(NamedTuple):
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
    trunk = _walk(rng, centre.shape, rng.uniform((0, 0), (height, width)), rng.uniform(0, 2 * math.pi), length, base_width)
    paths = [trunk]
    for _ in range(rng.poisson(1.2)):
        fork = rng.integers(0, len(trunk.ys))
        turn = rng.choice((-1, 1)) * rng.uniform(0.4, 1.2)
        paths.append(
            _walk(
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
    if seen.size == 0:
        return Crack(0.0, 0.0, 0.0, len(paths) - 1)
    return Crack(float(seen.size), float(seen.mean()), float(seen.max()), len(paths) - 1)


def _walk(
    rng: np.random.Generator, shape: tuple[int, int], start, angle: float, steps: int, base_width: float
) -> _Path:
    """One-pixel steps with a slowly wandering heading and a width that varies and tapers."""
    steps = max(steps, 8)
    angles = angle + np.cumsum(rng.normal(0.0, 0.025, steps)) + 0.3 * _smooth_noise(rng, (steps,), 50.0)
    # Small lateral zig-zags: real cracks follow grain boundaries, not smooth curves.
    jitter = 0.8 * _smooth_noise(rng, (steps,), 4.0)
    ys = start[0] + np.cumsum(np.sin(angles)) + jitter * np.cos(angles)
    xs = start[1] + np.cumsum(np.cos(angles)) - jitter * np.sin(angles)
    ramp = np.minimum(np.arange(steps), np.arange(steps)[::-1]) / (0.15 * steps)
    taper = np.minimum(1.0, ramp + 0.3)
    widths = np.clip(base_width * np.exp(0.3 * _smooth_noise(rng, (steps,), 30.0)) * taper, 1.0, MAX_CRACK_WIDTH)
    rows, cols = np.rint(ys), np.rint(xs)
    inside = (rows >= 0) & (rows < shape[0]) & (cols >= 0) & (cols < shape[1])
    return _Path(ys, xs, angles, widths, inside)


def _rasterize_cracks(
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
    depth_along = np.clip(0.45 + 0.15 * _smooth_noise(rng, centre.shape, 30.0), 0.25, 0.7)
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
