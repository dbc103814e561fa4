"""Crack measurements from a binary mask: length, mean and maximum width, area, per connected crack.

Definitions (pixels; multiply by the pixel size for millimetres):

- **length**: the skeleton's length by the corner-count estimator of Vossepoel and
  Smeulders (1982), ``0.980 n_orthogonal + 1.406 n_diagonal - 0.091 n_corners``, within
  about 2% for digital lines at any angle (plain 1 / sqrt(2) step counting is up to 8% off),
  plus the half-width at each skeleton end, which thinning cuts off.
- **mean width**: area / length, the mean full width of a crack of any shape.
- **max width**: the largest full width along the skeleton, from the distance to the
  background: ``2 d - 1`` where the distance ridge is one pixel wide (odd widths) and
  ``2 d`` where it is two pixels wide (even widths).

Skeletons come from scikit-image, distances and labels from scipy.ndimage.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree
from skimage.morphology import skeletonize

ORTHOGONAL, DIAGONAL, CORNER = 0.980, 1.406, 0.091
_EIGHT = np.ones((3, 3), bool)


@dataclass(frozen=True)
class CrackMeasure:
    length_px: float
    mean_width_px: float
    max_width_px: float
    area_px: int
    bbox: tuple[int, int, int, int]  # top, left, bottom, right (exclusive)


def measure_cracks(mask: np.ndarray, min_area: int = 1) -> list[CrackMeasure]:
    """One measurement per 8-connected crack of ``mask`` ((H, W) bool), largest first."""
    mask = np.asarray(mask, bool)
    labels, count = ndimage.label(mask, _EIGHT)
    if count == 0:
        return []
    skeleton = skeletonize(mask)
    distance = ndimage.distance_transform_edt(mask)
    areas = np.bincount(labels.ravel(), minlength=count + 1)[1:]

    chain = _chain_length_by_label(skeleton, labels, count)
    ends = _end_points(skeleton)
    end_half_widths = np.bincount(labels[ends], weights=distance[ends] - 0.5, minlength=count + 1)[1:]
    lengths = chain + end_half_widths
    lone = lengths <= 0  # specks whose skeleton is one pixel: take the bounding extent
    max_widths = _max_width_by_label(distance, skeleton, ends, labels, count)
    measures = []
    for number, box in enumerate(ndimage.find_objects(labels)):
        if areas[number] < min_area:
            continue
        length = float(lengths[number])
        if lone[number]:
            length = float(max(box[0].stop - box[0].start, box[1].stop - box[1].start))
        measures.append(
            CrackMeasure(
                length_px=length,
                mean_width_px=areas[number] / length,
                max_width_px=float(max(max_widths[number], 1.0)),
                area_px=int(areas[number]),
                bbox=(box[0].start, box[1].start, box[0].stop, box[1].stop),
            )
        )
    return sorted(measures, key=lambda m: -m.area_px)


def _chain_length_by_label(skeleton: np.ndarray, labels: np.ndarray, count: int) -> np.ndarray:
    """Corner-count chain length per label.

    Diagonal links count only where no orthogonal path joins the pair (staircases are
    not counted twice). A corner is a pixel with two links that are not collinear.
    """
    s = skeleton
    height, width = s.shape
    directions = np.zeros((height, width), np.uint8)  # bit k: a link towards E, SE, S, SW, W, NW, N, NE
    links = {
        "E": (s[:, :-1] & s[:, 1:], (slice(None), slice(None, -1)), (slice(None), slice(1, None)), 0, 4),
        "S": (s[:-1, :] & s[1:, :], (slice(None, -1), slice(None)), (slice(1, None), slice(None)), 2, 6),
        "SE": (s[:-1, :-1] & s[1:, 1:] & ~s[:-1, 1:] & ~s[1:, :-1], (slice(None, -1), slice(None, -1)), (slice(1, None), slice(1, None)), 1, 5),
        "SW": (s[:-1, 1:] & s[1:, :-1] & ~s[:-1, :-1] & ~s[1:, 1:], (slice(None, -1), slice(1, None)), (slice(1, None), slice(None, -1)), 3, 7),
    }
    total = np.zeros(count + 1)
    for name, (present, first, second, bit, back) in links.items():
        step = ORTHOGONAL if name in ("E", "S") else DIAGONAL
        total += step * np.bincount(labels[first][present], minlength=count + 1)
        directions[first] |= present.astype(np.uint8) << bit
        directions[second] |= present.astype(np.uint8) << back
    degree = np.unpackbits(directions[..., None], axis=-1).sum(axis=-1)
    collinear = np.isin(directions, [0b00010001, 0b00100010, 0b01000100, 0b10001000])
    corners = s & (degree == 2) & ~collinear
    total -= CORNER * np.bincount(labels[corners], minlength=count + 1)
    return total[1:]


def _max_width_by_label(distance, skeleton, ends, labels, count) -> np.ndarray:
    """Largest full width along each skeleton, away from the rounded caps at its ends where possible.

    Works on the skeleton's pixels only (sparse), never on whole-image label reductions.
    """
    points = np.argwhere(skeleton)
    owner = labels[skeleton]
    widths = _full_width(distance, skeleton)[skeleton]
    plain = 2.0 * distance[skeleton] - 1.0
    result = np.zeros(count + 1)
    np.maximum.at(result, owner, plain)
    end_points = np.argwhere(ends)
    if len(end_points):
        to_end, _ = cKDTree(end_points).query(points)
        away = to_end > distance[skeleton] + 1  # near an end the cap distorts the local width
        np.maximum.at(result, owner[away], widths[away])
    else:
        np.maximum.at(result, owner, widths)
    return result[1:]


def _end_points(skeleton: np.ndarray) -> np.ndarray:
    """Skeleton pixels with exactly one skeleton neighbour."""
    neighbours = ndimage.convolve(skeleton.astype(np.uint8), _EIGHT.astype(np.uint8), mode="constant") - 1
    return skeleton & (neighbours == 1)


def _full_width(distance: np.ndarray, skeleton: np.ndarray) -> np.ndarray:
    """Full width at each pixel: 2d - 1, or 2d where a neighbour shares the ridge height (even widths)."""
    ridge_twin = ndimage.maximum_filter(np.where(skeleton, 0.0, distance), footprint=_EIGHT)
    even = np.isclose(ridge_twin, distance) & (distance > 0)
    return 2.0 * distance - 1.0 + even
