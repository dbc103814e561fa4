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

Skeletons come from scikit-image, distances and labels from scipy.ndimage, and pieces
that one crack joins are tracked by scipy's DisjointSet (here and across raster bands).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy import ndimage
from scipy.cluster.hierarchy import DisjointSet
from scipy.spatial import cKDTree
from skimage.draw import line as draw_line
from skimage.morphology import skeletonize

ORTHOGONAL, DIAGONAL, CORNER = 0.980, 1.406, 0.091
_EIGHT = np.ones((3, 3), bool)
_COS_30 = math.cos(math.radians(30))


@dataclass(frozen=True)
class CrackMeasure:
    id: int  # 1 = the longest crack of the mask; the value of its pixels in find_cracks' labels
    length_px: float
    mean_width_px: float
    max_width_px: float
    area_px: int
    bbox: tuple[int, int, int, int]  # top, left, bottom, right (exclusive)
    anchor: tuple[int, int]  # (row, col) of a skeleton pixel near the crack's middle: where to write its id
    fragments: int  # connected pieces of the mask joined into this crack


def find_cracks(mask: np.ndarray, join_gap: float = 0.0, min_length: float = 0.0) -> tuple[np.ndarray, list[CrackMeasure]]:
    """The cracks of ``mask`` ((H, W) bool): (H, W) int32 crack ids, and one measurement per crack, longest first.

    Pieces of one crack that the mask shows apart are joined when a skeleton end points at
    another piece (within 30 degrees of its direction) across a gap of at most ``join_gap``
    px between their edges: a crack is followed along its own direction, never merged with
    whatever lies near it. The joined length includes the gap; area and widths are the
    mask's own pixels. Cracks shorter than ``min_length`` px are dropped (id 0).
    """
    mask = np.asarray(mask, bool)
    parts = crack_parts(mask, join_gap)
    found = []
    for number in range(1, len(parts.area)):
        if parts.area[number] == 0:
            continue
        measure = parts.measure(number)
        if measure.length_px >= min_length:
            found.append((number, measure))
    found.sort(key=lambda item: (-item[1].length_px, item[0]))
    renumber = np.zeros(len(parts.area), np.int32)
    cracks = []
    for new_id, (old, measure) in enumerate(found, 1):
        renumber[old] = new_id
        cracks.append(dataclasses.replace(measure, id=new_id))
    return np.where(mask, renumber[parts.labels], 0).astype(np.int32), cracks


@dataclass
class CrackParts:
    """Per-label sums over the counted rows of a mask, which add up across bands of rows.

    Index 0 of every array is the background. Lengths are the skeleton's links that start in
    the counted rows plus the caps of the ends there; bounding boxes cover counted pixels.
    """

    labels: np.ndarray  # (H, W) int32: the joined cracks, before any is dropped
    length: np.ndarray
    gap: np.ndarray
    area: np.ndarray
    max_width: np.ndarray
    box: np.ndarray  # (n + 1, 4) top, left, bottom, right (exclusive); top = H where no counted pixel
    fragments: np.ndarray
    anchors: dict[int, tuple[int, int]]
    skeleton: np.ndarray  # (H, W) bool, of the joined cracks

    def measure(self, number: int) -> CrackMeasure:
        """Label ``number`` as a CrackMeasure (id = number), anchored on its skeleton where it has one."""
        crack = crack_measure(number, float(self.length[number]), float(self.gap[number]), int(self.area[number]),
                              float(self.max_width[number]), tuple(int(v) for v in self.box[number]), int(self.fragments[number]))
        anchor = self.anchors.get(number)
        return crack if anchor is None else dataclasses.replace(crack, anchor=anchor)


def crack_measure(number: int, length: float, gap: float, area: int, max_width: float, box: tuple[int, int, int, int],
                  fragments: int) -> CrackMeasure:
    """A CrackMeasure from a crack's sums (of one mask, or of several bands of one), anchored at its box's top-left corner."""
    if length <= 0:  # a speck whose skeleton is one pixel: take the bounding extent
        length = float(max(box[2] - box[0], box[3] - box[1]))
    seen = max(length - gap, 1.0)
    return CrackMeasure(number, length, area / seen, max(max_width, 1.0), area, box, box[:2], fragments)


def crack_parts(mask: np.ndarray, join_gap: float = 0.0, counted: slice = slice(None)) -> CrackParts:
    """Join and label the cracks of ``mask`` and sum each one's measurements over the ``counted`` rows."""
    mask = np.asarray(mask, bool)
    pieces, count = ndimage.label(mask, _EIGHT)
    distance = ndimage.distance_transform_edt(mask) if count else np.zeros(mask.shape)
    rows = np.zeros(mask.shape[0], bool)
    rows[counted] = True
    joined, bridges = _join_pieces(mask, pieces, distance, join_gap) if join_gap > 0 and count else (mask, [])
    labels, total = ndimage.label(joined, _EIGHT) if bridges else (pieces, count)
    mine = np.where(rows[:, None], labels, 0)  # labels of the counted rows only: other pixels add to the background
    skeleton = skeletonize(joined) if count else np.zeros(mask.shape, bool)
    length = np.concatenate([[0.0], _chain_length_by_label(skeleton, mine, total)])
    ends = _end_points(skeleton)
    length += np.bincount(mine[ends], weights=distance[ends] - 0.5, minlength=total + 1)
    gap = np.zeros(total + 1)
    for (row, col), size in bridges:
        if rows[row]:
            gap[labels[row, col]] += size
    max_width = np.concatenate([[0.0], _max_width_by_label(np.where(mask, distance, 0.0), skeleton & mask, ends, mine, total)])
    box = np.tile(np.array([mask.shape[0], mask.shape[1], 0, 0]), (total + 1, 1))
    for number, found in enumerate(ndimage.find_objects(mine), 1):
        if found is not None:
            box[number] = (found[0].start, found[1].start, found[0].stop, found[1].stop)
    first_rows = np.array([found[0].start for found in ndimage.find_objects(pieces)], int)
    owners = ndimage.maximum(labels, pieces, np.arange(1, count + 1)).astype(int) if count else np.zeros(0, int)
    fragments = np.bincount(owners[rows[first_rows]], minlength=total + 1)
    return CrackParts(labels.astype(np.int32), length, gap, np.bincount(mine[mask], minlength=total + 1), max_width, box,
                      fragments, _anchors(skeleton, labels, total), skeleton)


def _join_pieces(mask, pieces, distance, join_gap):
    """The mask with a one-pixel bridge across each gap a skeleton end points over, and the bridges' (start, gap)."""
    skeleton = skeletonize(mask)
    points = np.argwhere(skeleton)
    owner = pieces[skeleton]
    tree = cKDTree(points)
    reach = join_gap + 2 * distance.max()
    joined, bridges = mask.copy(), []
    joined_pieces = DisjointSet(range(pieces.max() + 1))  # one bridge per pair of pieces, none around a loop
    for end in np.argwhere(_end_points(skeleton)):
        piece = pieces[tuple(end)]
        near = [i for i in tree.query_ball_point(end, 10.0) if owner[i] == piece]
        direction = end - points[near].mean(axis=0)
        if np.hypot(*direction) < 1.0:
            continue
        direction /= np.hypot(*direction)
        best, best_gap = None, join_gap
        for i in tree.query_ball_point(end, reach):
            if joined_pieces.connected(owner[i], piece):
                continue
            step = points[i] - end
            span = np.hypot(*step)
            gap = span - distance[tuple(end)] - distance[tuple(points[i])]
            if gap <= best_gap and step @ direction >= span * _COS_30:
                best, best_gap = points[i], gap
        if best is not None:
            joined_pieces.merge(pieces[tuple(best)], piece)
            rows, cols = draw_line(int(end[0]), int(end[1]), int(best[0]), int(best[1]))
            joined[rows, cols] = True
            bridges.append(((int(end[0]), int(end[1])), max(best_gap, 0.0)))
    return joined, bridges


def _anchors(skeleton: np.ndarray, labels: np.ndarray, count: int) -> dict[int, tuple[int, int]]:
    """A skeleton pixel per label, the middle one of its pixels in scan order (on the crack, not beside it)."""
    points = np.argwhere(skeleton & (labels > 0))
    owners = labels[skeleton & (labels > 0)]
    order = np.argsort(owners, kind="stable")
    points, owners = points[order], owners[order]
    starts = np.searchsorted(owners, np.arange(1, count + 1))
    ends = np.searchsorted(owners, np.arange(1, count + 1), side="right")
    return {label: tuple(int(v) for v in points[(a + b) // 2]) for label, a, b in zip(range(1, count + 1), starts, ends) if b > a}


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


WIDTH_CLASS_PRESETS = {
    # BRE Digest 251 damage categories for masonry walls, by crack width in mm: 0 hairline, 1 fine,
    # 2 easily filled, 3 opening up, 4 extensive, 5 structural.
    "bre251": ((0.1, 1.0, 5.0, 15.0, 25.0), ("0", "1", "2", "3", "4", "5")),
    # ACI 224R tolerable widths by exposure (water-retaining, seawater, deicing chemicals,
    # humidity / soil, dry air): a crack is tolerable in the exposures whose width it does not exceed.
    "aci224": ((0.10, 0.15, 0.18, 0.30, 0.41), None),
}


@dataclass(frozen=True)
class WidthClasses:
    """Width bands in mm; a width on an edge goes to the lower band."""

    name: str
    edges_mm: tuple[float, ...]
    labels: tuple[str, ...]  # one more than edges

    @classmethod
    def parse(cls, text: str) -> WidthClasses:
        """``bre251``, ``aci224``, or increasing edges in mm such as ``0.1,0.2,0.3,1.0``."""
        if text in WIDTH_CLASS_PRESETS:
            edges, labels = WIDTH_CLASS_PRESETS[text]
            return cls(text, edges, labels or _band_labels(edges))
        try:
            edges = tuple(float(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"must be {', '.join(WIDTH_CLASS_PRESETS)} or increasing widths in mm like 0.1,0.2,0.3, got {text!r}") from None
        if not edges or any(not math.isfinite(e) or e <= 0 for e in edges) or list(edges) != sorted(set(edges)):
            raise ValueError(f"widths must be positive and increasing (mm), got {text!r}")
        return cls("custom", edges, _band_labels(edges))

    def classify(self, width_mm: float) -> str:
        return self.labels[int(np.searchsorted(self.edges_mm, width_mm, side="left"))]

    def narrowest_band_mm(self) -> float:
        """The narrowest band's width (the first band runs from 0)."""
        return float(min(np.diff((0.0, *self.edges_mm))))


def _band_labels(edges: tuple[float, ...]) -> tuple[str, ...]:
    text = [f"{edge:g}" for edge in edges]
    return (f"<={text[0]}", *(f"{a}-{b}" for a, b in zip(text, text[1:])), f">{text[-1]}")
