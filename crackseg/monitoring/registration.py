"""Where a point of the BEFORE image lies in the AFTER image of a pair of inspections.

Georeferenced rasters align by their map coordinates; photos of the same spot taken on
another day are registered by image features on a reduced copy. A pair that cannot be
registered reliably says so (status ``unregistered``) and is never compared.

Coordinates: pixel (col, row) = (0, 0) is the centre of the top-left pixel, so a pixel
centre of the full photo at x lies at ``(x + 0.5) * factor - 0.5`` in a copy reduced by
``factor``, whichever way the copy was made.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import skimage.transform
from PIL import Image
from scipy import ndimage
from skimage.feature import ORB, match_descriptors
from skimage.measure import ransac

from crackseg.core.errors import InputError
from crackseg.data.images import DECODE_ERRORS, describe_error, open_picture, orientation
from crackseg.data.rasters import rasterio
from crackseg.monitoring.options import TRANSFORMS

REGISTERED, UNREGISTERED = "registered", "unregistered"

# Features, found on the reduced copies: every distance below is in their pixels.
ORB_KEYPOINTS = 500  # per photo: a hundred or more matches on pavement, and cheap to match (all pairs are compared)
# Pyramid levels 1 to 1.3**3 = 2.2x apart: enough to match photos up to 2x nearer or farther (SCALE_RANGE), and the
# fewest levels that do so (every level costs a full detection).
ORB_LEVELS, ORB_DOWNSCALE = 4, 1.3
BLUR_SIGMA = 1.0  # px of blur before detection: sensor noise, which differs between visits, makes no corners
# FAST's threshold, in units of the texture's typical step between neighbouring pixels (their 75th percentile):
# rough asphalt and smooth concrete then give a like number of candidate corners, which is ORB's cost.
FAST_CONTRAST = 4.0
MATCH_RATIO = 0.9  # a match must be this much closer (Hamming) than the next best: drops ambiguous texture
RANSAC_THRESHOLD = 3.0  # px a match may lie from the model and still agree with it
RANSAC_TRIALS = 1000  # finds a homography that 30 % of the matches agree on 99.9 % of the time (4 matches a try)
# Twenty agreeing matches: a similarity needs 2 and a homography 4 to be fitted at all, and matches between
# unrelated photos agree by chance in a handful at most (each lands within 3 px of a model's prediction with
# odds of about 1 in 10,000 on a 640 px copy; 300 pairs of unrelated pavement photos gave at most 6), never 20.
MIN_INLIERS = 20
MIN_INLIER_SHARE = 0.3  # of the cross-checked matches: true pairs kept 50-99 % in trials, chance models 25 % at most
MAX_RESIDUAL = 1.5  # root mean square px: matches lie 0.6-1.2 px from a true model, chance ones fill the 3 px disc
# Models fitted to every other agreeing match and to the rest may place a point this far apart (px) where BEFORE
# lands in AFTER: the whole fit is then off by about half of it there. Beyond, the matches are too few, clustered
# or in a line to fix the model (a homography far from its matches, most of all).
MAX_DISAGREEMENT = 3.0
SCALE_RANGE = (0.5, 2.0)  # AFTER px per BEFORE px on the reduced copies: the camera moved at most 2x nearer or farther
# A view more oblique than at the other visit squeezes one direction more than the other, and one side of the
# photo more than the other: up to 1.5x (a camera turned about 50 degrees further from the surface's normal).
MAX_OBLIQUITY = 1.5

# EXIF orientation -> how stored (x, y) turn into displayed (x', y'), the linear part; see _display_matrix
_ORIENTATIONS = {1: ((1, 0), (0, 1)), 2: ((-1, 0), (0, 1)), 3: ((-1, 0), (0, -1)), 4: ((1, 0), (0, -1)),
                 5: ((0, 1), (1, 0)), 6: ((0, -1), (1, 0)), 7: ((0, -1), (-1, 0)), 8: ((0, 1), (-1, 0))}
_TRANSPOSE = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
              5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
              8: Image.Transpose.ROTATE_90}


@dataclass(frozen=True)
class Alignment:
    """BEFORE pixel (col, row) -> AFTER pixel (col, row), both at pixel centres, by a 3x3 matrix (homogeneous)."""

    matrix: np.ndarray = field(default_factory=lambda: np.eye(3))
    method: str = "identity"  # map, orb-similarity, orb-affine, orb-homography
    status: str = REGISTERED
    inliers: int | None = None  # feature matches that agree with the model (None: not feature-based)
    residual_px: float | None = None  # root mean square distance of those matches from the model, in AFTER pixels
    reason: str = ""  # why a pair is unregistered
    error_px: float = 0.0  # how far (AFTER px) the mapping may place a point from where it lies: half the disagreement

    @property
    def registered(self) -> bool:
        return self.status == REGISTERED

    def map_points(self, rows_cols: np.ndarray) -> np.ndarray:
        """(N, 2) BEFORE (row, col) -> (N, 2) float AFTER (row, col)."""
        points = np.asarray(rows_cols, np.float64).reshape(-1, 2)
        xy1 = np.column_stack([points[:, 1], points[:, 0], np.ones(len(points))]) @ self.matrix.T
        xy = xy1[:, :2] / xy1[:, 2:3]
        return xy[:, ::-1]

    def scale_at(self, rows_cols: np.ndarray) -> np.ndarray:
        """AFTER pixels per BEFORE pixel around each (row, col) of BEFORE: the local linear scale of the mapping."""
        points = np.asarray(rows_cols, np.float64).reshape(-1, 2)
        step = 0.5
        centre = self.map_points(points)
        along_x = self.map_points(points + [0.0, step]) - centre
        along_y = self.map_points(points + [step, 0.0]) - centre
        area = np.abs(along_x[:, 0] * along_y[:, 1] - along_x[:, 1] * along_y[:, 0])
        return np.sqrt(area) / step


def read_grey(path: Path, max_side: int) -> tuple[np.ndarray, float]:
    """The photo as displayed (EXIF orientation applied), (H, W) float32 grey in [0, 1], its longer side at most
    ``max_side``; and the factor, reduced px per full px (1.0 when the photo is small enough already).

    A JPEG is decoded already reduced (DCT scaling, by up to 8), so a 12-megapixel photo costs a fraction
    of a full decode. Both axes share the one factor exactly: the copy covers the photo's top-left
    ``size / factor`` px, leaving out less than one reduced pixel's width at the right and bottom.
    """
    try:
        with open_picture(path) as image:
            turn = orientation(image)
            stored = np.array(image.size, np.float64)
            factor = min(1.0, max_side / stored.max())
            # floor, so that the covered part lies inside the photo; the tolerance keeps max_side itself
            reduced = np.maximum(1, np.floor(stored * factor + 1e-6)).astype(int)
            drafted = image.draft("L", tuple(int(v) for v in reduced))  # only JPEG: None for other formats
            scale = stored[0] / drafted[1][2] if drafted else 1.0  # full px per decoded px
            box = _stored_box(turn, stored, reduced / factor) / scale
            if image.mode.startswith("I"):  # 16-bit: to [0, 1] before a conversion to 8 bits clips it
                image = Image.fromarray(np.asarray(image, np.float32) / 65535.0)
            elif image.mode not in ("L", "F"):
                image = image.convert("L")
            small = image.resize(tuple(int(v) for v in reduced), Image.Resampling.BILINEAR, box=tuple(box))
            if turn in _TRANSPOSE:
                small = small.transpose(_TRANSPOSE[turn])
            grey = np.asarray(small, np.float32)
    except DECODE_ERRORS as error:
        raise InputError(f"{path}: {describe_error(error)}") from None
    return (grey if small.mode == "F" else grey / 255.0), float(factor)


def _display_matrix(turn: int, stored_size: np.ndarray) -> np.ndarray:
    """3x3: stored continuous (x, y) -> displayed (x', y') for an EXIF orientation (pixel edges at integers)."""
    linear = np.array(_ORIENTATIONS.get(turn, _ORIENTATIONS[1]), np.float64)
    matrix = np.eye(3)
    matrix[:2, :2] = linear
    matrix[:2, 2] = np.clip(-linear, 0, None) @ stored_size  # a flipped axis starts at the far edge
    return matrix


def _stored_box(turn: int, stored_size: np.ndarray, covered_stored: np.ndarray) -> np.ndarray:
    """(left, top, right, bottom) in stored px of the part of the photo that, once displayed, is its top-left
    ``covered`` px (``covered_stored`` is that extent before turning: (w, h) in stored axes)."""
    to_display = _display_matrix(turn, stored_size)
    covered = np.abs(to_display[:2, :2]) @ covered_stored  # the same extent in displayed axes
    corners = np.array([[0.0, 0.0, 1.0], [covered[0], covered[1], 1.0]]) @ np.linalg.inv(to_display).T
    box = np.concatenate([corners[:, :2].min(axis=0), corners[:, :2].max(axis=0)])
    return np.clip(box, 0, np.tile(stored_size, 2))


def register_photos(before: np.ndarray, after: np.ndarray, model: str = "similarity") -> Alignment:
    """Align two (H, W) grey photos (values in [0, 1]) by ORB features and RANSAC; ``model``: similarity, affine or
    homography.

    The matrix maps BEFORE (col, row) to AFTER (col, row) in these arrays' pixels; an unreliable
    result comes back ``unregistered`` with the reason, never as a wrong alignment.
    """
    if model not in TRANSFORMS:
        raise InputError(f"registration model {model!r}: choose one of {', '.join(TRANSFORMS)}")
    method = f"orb-{model}"
    found = [_features(grey) for grey in (before, after)]
    fewest = min(len(points) for points, _ in found)
    if fewest < MIN_INLIERS:
        return _unregistered(method, f"too little texture: {fewest} keypoints in a photo, {MIN_INLIERS} needed")
    (points_before, descriptors_before), (points_after, descriptors_after) = found
    pairs = match_descriptors(descriptors_before, descriptors_after, cross_check=True, max_ratio=MATCH_RATIO)
    if len(pairs) < MIN_INLIERS:
        return _unregistered(method, f"{len(pairs)} feature matches, {MIN_INLIERS} needed")
    source, target = points_before[pairs[:, 0]], points_after[pairs[:, 1]]
    transform_class, samples = getattr(skimage.transform, TRANSFORMS[model].skimage_class), TRANSFORMS[model].samples
    fitted, agree = ransac((source, target), transform_class, min_samples=samples, residual_threshold=RANSAC_THRESHOLD,
                           max_trials=RANSAC_TRIALS, stop_probability=0.999, rng=0)
    count = int(agree.sum()) if agree is not None else 0
    if fitted is None or count < MIN_INLIERS:
        return _unregistered(method, f"{count} matches agree on one {model}, {MIN_INLIERS} needed", count)
    agreeing = source[agree], target[agree]
    residual = float(np.sqrt(np.mean(fitted.residuals(*agreeing) ** 2)))
    disagreement = _disagreement(fitted, *agreeing, (before.shape, after.shape))
    reason = _doubt(fitted, count / len(pairs), residual, disagreement, before.shape)
    if reason:
        return _unregistered(method, reason, count, residual)
    return Alignment(np.asarray(fitted.params, np.float64), method, REGISTERED, count, residual, error_px=disagreement / 2)


def _features(grey: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ORB keypoints as (N, 2) (col, row) and their (N, 256) bool descriptors; none on a photo without texture."""
    grey = np.asarray(grey, np.float32)
    low, high = np.percentile(grey, [1, 99]) if grey.size else (0.0, 0.0)
    if high - low < 1e-3:  # blank
        return np.empty((0, 2)), np.empty((0, 256), bool)
    smooth = ndimage.gaussian_filter(grey, BLUR_SIGMA)
    step = max(float(np.percentile(np.abs(np.diff(smooth, axis=1)), 75)), 1 / 255)  # below one 8-bit level: noise
    orb = ORB(n_keypoints=ORB_KEYPOINTS, fast_threshold=FAST_CONTRAST * step, n_scales=ORB_LEVELS,
              downscale=ORB_DOWNSCALE)
    try:
        orb.detect_and_extract(smooth)
    except RuntimeError:  # not one corner
        return np.empty((0, 2)), np.empty((0, 256), bool)
    # ORB reports a level's (row, col) times downscale**k, but each level is ceil(size / downscale) px of the one
    # before (640 -> 493, 380, 293 px; 640 / 1.3**3 is 291.3): a level's pixel centre u lies at
    # (u + 0.5) * size / level size - 0.5, up to 3.7 px from where ORB puts it on a 640 px copy.
    levels = np.rint(np.log(orb.scales) / math.log(ORB_DOWNSCALE)).astype(int)
    level_sizes = _level_sizes(grey.shape)[levels]
    points = (orb.keypoints / orb.scales[:, None] + 0.5) * (np.array(grey.shape) / level_sizes) - 0.5
    return points[:, ::-1], orb.descriptors


def _level_sizes(shape: tuple[int, int]) -> np.ndarray:
    """(ORB_LEVELS, 2) (rows, cols) of ORB's pyramid levels, as skimage's pyramid_gaussian sizes them."""
    sizes = [tuple(shape[:2])]
    for _ in range(ORB_LEVELS - 1):
        sizes.append(tuple(math.ceil(size / ORB_DOWNSCALE) for size in sizes[-1]))
    return np.array(sizes, np.float64)


def _doubt(fitted, share: float, residual: float, disagreement: float, shape: tuple) -> str:
    """Why a fitted model is not trusted, or "" when it is; ``disagreement``: see :func:`_disagreement`."""
    if share < MIN_INLIER_SHARE:
        return f"only {share:.0%} of feature matches agree, {MIN_INLIER_SHARE:.0%} needed"
    if residual > MAX_RESIDUAL:
        return f"matches lie {residual:.2f} px from the model (root mean square), {MAX_RESIDUAL} px allowed"
    height, width = shape[:2]
    implausible = _implausible(fitted.params, width, height)
    if implausible:
        return implausible
    if disagreement > MAX_DISAGREEMENT:
        return (f"the matches do not pin the {_transform_name(fitted)} down: halves of them place points "
                f"{disagreement:.1f} px apart, {MAX_DISAGREEMENT} px allowed")
    return ""


def _disagreement(fitted, source: np.ndarray, target: np.ndarray, shapes: tuple) -> float:
    """Farthest apart (px) that the models fitted to every other agreeing match and to the rest place a point of
    BEFORE that lands in AFTER: about twice the error of the whole fit there, wherever matches are too few,
    clustered, or in a line to fix the model (a homography far from its matches, most of all)."""
    (height, width), (height_after, width_after) = shapes[0][:2], shapes[1][:2]
    xs, ys = np.meshgrid(np.linspace(0, width - 1, 9), np.linspace(0, height - 1, 9))
    grid = np.column_stack([xs.ravel(), ys.ravel()])
    landing = fitted(grid)
    inside = np.all((landing >= 0) & (landing <= [width_after - 1, height_after - 1]), axis=1)
    if not inside.any():
        return math.inf
    halves = [_fit(type(fitted), source[start::2], target[start::2]) for start in (0, 1)]
    if any(half is None for half in halves):
        return math.inf
    apart = np.linalg.norm(halves[0](grid[inside]) - halves[1](grid[inside]), axis=1).max()
    return float(apart) if np.isfinite(apart) else math.inf


def _fit(transform_class, source: np.ndarray, target: np.ndarray):
    """The least-squares transform, or None when the points do not determine one."""
    if hasattr(transform_class, "from_estimate"):  # scikit-image 0.26 on: estimate() is deprecated
        fitted = transform_class.from_estimate(source, target)
        return fitted if fitted else None
    fitted = transform_class()
    return fitted if fitted.estimate(source, target) else None


def _implausible(matrix: np.ndarray, width: int, height: int) -> str:
    """What no camera moved between two visits produces (a mirror, a scale beyond SCALE_RANGE, the horizon inside
    the photo, a much more oblique view), checked at the corners, edge middles and centre; "" when none."""
    matrix = matrix / matrix[2, 2]
    xs, ys = np.meshgrid([0.0, width / 2, width - 1.0], [0.0, height / 2, height - 1.0])
    points = np.column_stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
    mapped = points @ matrix.T
    w = mapped[:, 2]
    if np.any(w <= 0):
        return "the mapping folds the photo over its horizon"
    # the Jacobian of (x, y) -> (u, v) = (h0 . p, h1 . p) / (h2 . p) at each point
    uv = mapped[:, :2] / w[:, None]
    jacobians = (matrix[None, :2, :2] - uv[:, :, None] * matrix[None, 2:3, :2]) / w[:, None, None]
    if np.any(np.linalg.det(jacobians) <= 0):
        return "the mapping mirrors the photo"
    stretch = np.linalg.svd(jacobians, compute_uv=False)
    low, high = SCALE_RANGE
    if stretch.min() < low or stretch.max() > high:
        return f"scale {stretch.min():.2f}-{stretch.max():.2f} between the photos, {low}-{high} allowed"
    squeeze = (stretch[:, 0] / stretch[:, 1]).max()  # singular values come largest first
    if squeeze > MAX_OBLIQUITY:
        return f"the mapping squeezes one direction {squeeze:.1f}x more than the other, {MAX_OBLIQUITY}x allowed"
    local = np.sqrt(np.linalg.det(jacobians))
    if local.max() / local.min() > MAX_OBLIQUITY:
        return f"scale varies {local.max() / local.min():.1f}x across the photo, {MAX_OBLIQUITY}x allowed"
    return ""


def _unregistered(method: str, reason: str, inliers: int | None = None, residual: float | None = None) -> Alignment:
    return Alignment(np.eye(3), method, UNREGISTERED, inliers, residual, reason)


def register_photo_files(before: Path, after: Path, model: str = "similarity", max_side: int = 640) -> Alignment:
    """Register two photo files on copies reduced to ``max_side`` px; matrix and residual are in full-resolution
    pixels of the photos as displayed (EXIF orientation applied), a reason's px in those of the copies.

    640 px: a 12-megapixel pair takes about 0.4 s of one CPU core, and the fit is within about 1 px of the
    truth at full resolution; 1024 px is no more accurate and takes 2.5 times as long (docs/benchmarks.md).
    """
    grey_before, factor_before = read_grey(before, max_side)
    grey_after, factor_after = read_grey(after, max_side)
    reduced = register_photos(grey_before, grey_after, model)
    residual = None if reduced.residual_px is None else reduced.residual_px / factor_after
    if not reduced.registered:
        return dataclasses.replace(reduced, residual_px=residual)
    # full (x) -> reduced (u): u = factor (x + 0.5) - 0.5, per photo
    matrix = np.linalg.inv(_reduction(factor_after)) @ reduced.matrix @ _reduction(factor_before)
    return dataclasses.replace(reduced, matrix=matrix / matrix[2, 2], residual_px=residual, error_px=reduced.error_px / factor_after)


def _reduction(factor: float) -> np.ndarray:
    offset = 0.5 * factor - 0.5
    return np.array([[factor, 0.0, offset], [0.0, factor, offset], [0.0, 0.0, 1.0]])


def align_by_map(before: tuple[object, str | None], after: tuple[object, str | None]) -> Alignment:
    """Align two georeferenced rasters, each given as (affine transform, CRS), through map coordinates.

    Both must be in one CRS: reprojecting would resample one inspection, so it is left to the user.
    """
    (transform_before, crs_before), (transform_after, crs_after) = before, after
    problem = crs_problem(crs_before, crs_after, "BEFORE", "AFTER")
    if problem:
        raise InputError(problem)
    centre = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]])  # pixel centre -> pixel edge coordinates
    matrix = np.linalg.inv(centre) @ np.linalg.inv(_affine(transform_after)) @ _affine(transform_before) @ centre
    return Alignment(matrix, "map")


def _affine(transform: object) -> np.ndarray:
    """3x3 from an affine transform (rasterio's Affine or its six numbers a, b, c, d, e, f)."""
    a, b, c, d, e, f = (float(v) for v in tuple(transform)[:6])
    return np.array([[a, b, c], [d, e, f], [0.0, 0.0, 1.0]])


def crs_problem(crs_before: str | None, crs_after: str | None, before: str, after: str) -> str | None:
    """Why rasters ``before`` and ``after`` (names) cannot be aligned by their map coordinates; None: they are in one CRS."""
    if _same_crs(crs_before, crs_after):
        return None
    return (f"{before} is in {_one_line(crs_before)} and {after} in {_one_line(crs_after)}: reproject one to the other's "
            "CRS (gdalwarp -t_srs) to compare them")


def _same_crs(first: str | None, second: str | None) -> bool:
    """Equal as text, or as coordinate systems (an EPSG code and its WKT are one CRS)."""
    if first == second:
        return True
    if not first or not second:
        return False
    crs = rasterio().crs.CRS
    try:
        return crs.from_user_input(first) == crs.from_user_input(second)
    except rasterio().errors.CRSError:
        return False


def _one_line(crs: str | None) -> str:
    return " ".join(str(crs).split()) if crs else "no CRS"


def _transform_name(fitted) -> str:
    return next(name for name, transform in TRANSFORMS.items() if type(fitted).__name__ == transform.skimage_class)
