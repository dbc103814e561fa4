"""A later visit of a synthetic dataset's spots, with the true changes, for checking ``crackseg compare``.

The camera moved a little, cracks grew wider or longer or were repaired, now and then a new
one appeared; ``truth.json`` says how. Visit ``s`` of a stem depends on ``(s, stem)`` alone.
"""

from __future__ import annotations

import io
import json
import math
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage
from skimage.morphology import skeletonize

from crackseg.core.errors import InputError
from crackseg.core.files import write_atomic
from crackseg.data.images import crack_mask
from crackseg.data.synth import EIGHT_CONNECTED, CrackPath, rasterize_cracks, walk_crack
from crackseg.data.synth_folder import SYNTH_NAME, dataset_folder

# A later visit (write_later_visit): chances per crack region, and of a new crack per photo
REPAIR_CHANCE, EXTEND_CHANCE, WIDEN_CHANCE, NEW_CRACK_CHANCE = 0.15, 0.35, 0.35, 0.3
MIN_CHANGED_PX = 30  # smaller regions (a crack's corner cut off by the border) stay as they are
_LATER_VISIT = 1  # third seed word: a later visit draws apart from the photos it revisits
CLEARANCE_PX = 3  # surface kept between a change and other cracks, so that no two cracks join
VIEW_MARGIN = 0.05  # of the size: new crack lines keep off the border, which the camera move may take out of view


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
    stems = sorted(p.stem for p in (earlier / "images").iterdir() if SYNTH_NAME.fullmatch(f"images/{p.name}"))
    missing = [earlier / "masks" / f"{stem}.png" for stem in stems if not (earlier / "masks" / f"{stem}.png").is_file()]
    if not stems or missing:
        raise InputError(f"--later-visit {missing[0] if missing else earlier / 'images'}: missing; give a dataset written by crackseg synth")
    if out.resolve() == earlier.resolve():
        raise InputError(f"OUT {out}: is the --later-visit dataset itself; write the later visit into another folder")
    with dataset_folder(out, overwrite) as staging:
        jobs = [(staging, earlier, seed, stem) for stem in stems]
        if workers > 1:
            with ProcessPoolExecutor(workers) as pool:
                truth = dict(pool.map(_write_later, jobs, chunksize=4))
        else:
            truth = dict(map(_write_later, jobs))
        write_atomic(staging / "truth.json", json.dumps(truth, indent=1, sort_keys=True) + "\n")
    return stems


def _write_later(job: tuple[Path, Path, int, str]) -> tuple[str, dict]:
    out, earlier, seed, stem = job
    rng = np.random.default_rng([seed, int(stem), _LATER_VISIT])
    photo = np.asarray(Image.open(earlier / "images" / f"{stem}.jpg").convert("RGB"), np.float32)
    mask = crack_mask(earlier / "masks" / f"{stem}.png")
    cracks = ndimage.label(ndimage.binary_dilation(mask, EIGHT_CONNECTED), EIGHT_CONNECTED)[0] * mask
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
    joined = ndimage.binary_dilation(crack, EIGHT_CONNECTED)  # one piece across the crack's pixel gaps; 1 px wider all round
    skeleton = skeletonize(joined)
    ends = np.argwhere(skeleton & (ndimage.convolve(skeleton.astype(np.uint8), EIGHT_CONNECTED.astype(np.uint8), mode="constant") == 2))
    grey = photo.mean(axis=2)
    ring = ndimage.binary_dilation(crack, iterations=3) & ~ndimage.binary_dilation(cracks > 0)
    darkness = float(np.clip(np.median(grey[crack]) / np.median(grey[ring]), 0.3, 0.95)) if ring.any() else 0.6
    widths, behind = 2.0 * ndimage.distance_transform_edt(joined) - 3.0, np.argwhere(skeleton)
    for end in rng.permutation(ends):
        dy, dx = end - behind[np.hypot(*(behind - end).T) <= 8].mean(axis=0)
        path = walk_crack(rng, crack.shape, end, math.atan2(dy, dx), int(rng.integers(15, 41)), 1.0)
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
        path = walk_crack(rng, cracks.shape, rng.uniform((0, 0), (height, width)), rng.uniform(0, 2 * math.pi),
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
    return ndimage.binary_dilation((cracks > 0) & (cracks != number), EIGHT_CONNECTED, iterations=distance)


def _trace(rng: np.random.Generator, path: CrackPath, cracks: np.ndarray, number: int, min_steps: int) -> tuple[np.ndarray, np.ndarray, int] | None:
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
    pixels, depth, _ = rasterize_cracks(rng, centre, half_width, centre.astype(np.uint8))
    return pixels & clear, depth * clear, kept // 2


def _repair(rng: np.random.Generator, photo: np.ndarray, crack: np.ndarray, cracks: np.ndarray) -> None:
    """Paint a repaired crack over with the intact surface nearby, smoothed, plus fine texture copied from 12-30 px away."""
    intact = ~ndimage.binary_dilation(cracks, iterations=2)
    weight = ndimage.gaussian_filter(intact.astype(np.float32), 5.0)[..., None]
    smooth = ndimage.gaussian_filter(photo * intact[..., None], (5.0, 5.0, 0)) / np.maximum(weight, 1e-3)
    detail = np.where(intact[..., None], photo - ndimage.gaussian_filter(photo, (2.0, 2.0, 0)), 0.0)
    shift = tuple(int(v) for v in rng.choice((-1, 1), 2) * rng.integers(12, 31, 2))
    hole = ndimage.binary_dilation(crack, iterations=2) & ~ndimage.binary_dilation(cracks & ~crack, EIGHT_CONNECTED)
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
