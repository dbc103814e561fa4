"""Crack measurements from a binary mask: length, mean and maximum width, area, per connected crack.

Definitions (pixels; :func:`crackseg.cracks.widths.in_mm` multiplies them by the pixel size for millimetres):

- **length**: the skeleton's length by the corner-count estimator of Vossepoel and
  Smeulders (1982), ``0.980 n_orthogonal + 1.406 n_diagonal - 0.091 n_corners``, within
  about 2% for digital lines at any angle (plain 1 / sqrt(2) step counting is up to 8% off),
  plus the half-width at each skeleton end, which thinning cuts off.
- **mean width**: area / length, the mean full width of a crack of any shape; at most the max width, which
  the length estimator's shortfall along the pixel grid would otherwise let it pass on a uniform crack.
- **max width**: the largest full width along the skeleton, from the distance to the
  background: ``2 d - 1`` where the distance ridge is one pixel wide (odd widths) and
  ``2 d`` where it is two pixels wide (even widths).

Measuring works on the crack pixels alone, not on whole-image arrays (one scan of the mask and
the images returned aside): a 12-megapixel photo with a few cracks costs about what its cracks
cost. The results are, bit for bit, those of the whole-image operations they stand for:
scipy.ndimage's 8-connected labels and Euclidean distance transform, and scikit-image's
thin (Guo and Hall's thinning, with scikit-image's tables), done on pixel sets
(:mod:`crackseg.cracks.pixel_sets`).
Pieces of one crack are joined across short gaps by :mod:`crackseg.cracks.joins`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from crackseg.cracks.joins import join_pieces
from crackseg.cracks.pixel_sets import Pixels, components, distances, skeleton_ends, thin_grown, thinning

ORTHOGONAL, DIAGONAL, CORNER = 0.980, 1.406, 0.091


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
    gap_px: float = 0.0  # of its length, the faint stretches the join bridged (no pixels of the mask)


def find_cracks(mask: np.ndarray, join_gap: float = 0.0, min_length: float = 0.0) -> tuple[np.ndarray, list[CrackMeasure]]:
    """The cracks of ``mask`` ((H, W) bool): (H, W) int32 crack ids, and one measurement per crack, longest first.

    Pieces of one crack that the mask shows apart are joined when a skeleton end points at
    another piece (within 30 degrees of its direction) across a gap of at most ``join_gap``
    px between their edges: a crack is followed along its own direction, never merged with
    whatever lies near it. The joined length includes the gap; area and widths are the
    mask's own pixels. Cracks shorter than ``min_length`` px are dropped (id 0).
    """
    labels, cracks, _ = find_cracks_with_skeleton(mask, join_gap, min_length)
    return labels, cracks


def find_cracks_with_skeleton(mask: np.ndarray, join_gap: float = 0.0, min_length: float = 0.0
                              ) -> tuple[np.ndarray, list[CrackMeasure], np.ndarray]:
    """:func:`find_cracks`, and (H, W) int32 each crack's id on the skeleton its length was measured on, through the
    gaps the join bridged (0 elsewhere): its centreline, drawn as one line where it was measured as one."""
    mask = np.asarray(mask, bool)
    parts = crack_parts(mask, join_gap)
    numbers = np.flatnonzero(parts.area[1:]) + 1
    box = parts.box[numbers]
    length = parts.length[numbers]
    length = np.where(length <= 0, np.maximum(box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]), length)  # as crack_measure takes it
    kept = length >= min_length
    numbers, length = numbers[kept], length[kept]
    found = numbers[np.lexsort((numbers, -length))]  # longest first, then in label order
    renumber = np.zeros(len(parts.area), np.int32)
    renumber[found] = np.arange(1, len(found) + 1)
    cracks = [parts.measure(int(old), new_id) for new_id, old in enumerate(found, 1)]
    joined, skeleton = parts.pixels, parts.skeleton_pixels
    ids = renumber[parts.pixel_labels]
    on_mask = mask[joined.points[:, 0], joined.points[:, 1]]  # the ids go on the mask's pixels only, not on the bridges across gaps
    return joined.image(np.where(on_mask, ids, 0), np.int32), cracks, skeleton.image(ids[skeleton.in_parent], np.int32)


@dataclass
class CrackParts:
    """Per-label sums over the counted rows of a mask, which add up across bands of rows.

    Index 0 of every array is the background. Lengths are the skeleton's links that start in
    the counted rows plus the caps of the ends there; bounding boxes cover counted pixels.
    The joined cracks are held as pixel sets: images of them are made only when asked for.
    """

    length: np.ndarray
    gap: np.ndarray
    area: np.ndarray
    max_width: np.ndarray
    box: np.ndarray  # (n + 1, 4) top, left, bottom, right (exclusive); top = H where no counted pixel
    fragments: np.ndarray
    anchors: dict[int, tuple[int, int]]
    pixels: Pixels  # the joined cracks: the mask's pixels and the bridges across gaps
    pixel_labels: np.ndarray  # the label of each of them, before any crack is dropped
    skeleton_pixels: Pixels  # a subset of ``pixels``: the skeleton of the joined cracks

    @cached_property
    def labels(self) -> np.ndarray:
        """(H, W) int32: the joined cracks' labels."""
        return self.pixels.image(self.pixel_labels, np.int32)

    @cached_property
    def skeleton(self) -> np.ndarray:
        """(H, W) bool: the joined cracks' skeleton."""
        return self.skeleton_pixels.image(True, bool)

    def measure(self, number: int, crack_id: int) -> CrackMeasure:
        """Label ``number`` as CrackMeasure ``crack_id``, anchored on its skeleton where it has one."""
        crack = crack_measure(crack_id, float(self.length[number]), float(self.gap[number]), int(self.area[number]),
                              float(self.max_width[number]), tuple(int(v) for v in self.box[number]), int(self.fragments[number]))
        anchor = self.anchors.get(number)
        return crack if anchor is None else dataclasses.replace(crack, anchor=anchor)


def crack_measure(number: int, length: float, gap: float, area: int, max_width: float, box: tuple[int, int, int, int],
                  fragments: int) -> CrackMeasure:
    """A CrackMeasure from a crack's sums (of one mask, or of several bands of one), anchored at its box's top-left corner."""
    if length <= 0:  # a speck whose skeleton is one pixel: take the bounding extent
        length = float(max(box[2] - box[0], box[3] - box[1]))
    seen, widest = max(length - gap, 1.0), max(max_width, 1.0)
    return CrackMeasure(number, length, min(area / seen, widest), widest, area, box, box[:2], fragments, gap)


def crack_parts(mask: np.ndarray, join_gap: float = 0.0, counted: slice = slice(None)) -> CrackParts:
    """Join and label the cracks of ``mask`` and sum each one's measurements over the ``counted`` rows."""
    mask = np.asarray(mask, bool)
    rows = np.zeros(mask.shape[0], bool)
    rows[counted] = True
    cracks = Pixels.of(mask)
    pieces = components(cracks)
    distance = distances(cracks)
    skeleton, removed_at = thinning(cracks)
    bridges = join_pieces(cracks, pieces, distance, skeleton, join_gap) if join_gap > 0 and len(cracks.index) else []
    joined, labels = cracks, pieces
    if bridges:
        joined = cracks.union(np.concatenate([pixels for _, _, pixels in bridges]))
        labels, skeleton = components(joined), thin_grown(joined, cracks, removed_at)
    total = int(labels.max(initial=0))
    mine = np.where(rows[joined.points[:, 0]], labels, 0)  # labels of the counted rows only: other pixels add to the background
    skeleton_mine = mine[skeleton.in_parent]  # the skeleton was thinned from the joined pixels
    ends = skeleton_ends(skeleton)
    length = np.concatenate([[0.0], _chain_length_by_label(skeleton, skeleton_mine, total)])
    end_at = cracks.find(skeleton.index[ends])
    end_depth = np.where(end_at >= 0, distance[end_at], 0.0)  # a bridge's pixels lie on the background
    length += np.bincount(skeleton_mine[ends], weights=end_depth - 0.5, minlength=total + 1)
    gap = np.zeros(total + 1)
    for (row, col), size, _ in bridges:
        if rows[row]:
            gap[labels[joined.find(joined.index_of(row, col))]] += size
    max_width = np.concatenate([[0.0], _max_width_by_label(cracks, distance, skeleton, ends, skeleton_mine, total)])
    box = _boxes(joined.points, mine, mask.shape, total)
    first = np.full(int(pieces.max(initial=0)) + 1, len(pieces))
    np.minimum.at(first, pieces, np.arange(len(pieces)))  # each piece's first pixel in scan order
    owners = labels[joined.find(cracks.index[first[1:]])]
    fragments = np.bincount(owners[rows[cracks.points[first[1:], 0]]], minlength=total + 1)
    area = np.bincount(mine[joined.find(cracks.index)], minlength=total + 1)
    return CrackParts(length, gap, area, max_width, box, fragments, _anchors(skeleton, labels[skeleton.in_parent], total),
                      joined, labels, skeleton)


def _anchors(skeleton: Pixels, labels: np.ndarray, count: int) -> dict[int, tuple[int, int]]:
    """A skeleton pixel per label, the middle one of its pixels in scan order (on the crack, not beside it)."""
    middle = _middles(labels, count)
    some = np.flatnonzero(middle >= 0)
    return dict(zip(some.tolist(), map(tuple, skeleton.points[middle[some]].tolist())))


@njit(cache=True, nogil=True)
def _middles(labels: np.ndarray, count: int) -> np.ndarray:
    """Per label, the position of the middle of its pixels in scan order (the one after the middle for an even
    count), -1 for label 0 and a label without pixels."""
    sizes = np.zeros(count + 1, np.int64)
    for label in labels:
        sizes[label] += 1
    middle = np.full(count + 1, -1, np.int64)
    seen = np.zeros(count + 1, np.int64)
    for position in range(len(labels)):
        label = labels[position]
        if label > 0 and seen[label] == sizes[label] // 2:
            middle[label] = position
        seen[label] += 1
    return middle


@njit(cache=True, nogil=True)
def _boxes(points: np.ndarray, labels: np.ndarray, shape: tuple[int, int], count: int) -> np.ndarray:
    """ndimage.find_objects of labelled points as (count + 1, 4) top, left, bottom, right; (H, W, 0, 0) for a label
    without points and for label 0, the background."""
    box = np.zeros((count + 1, 4), np.int64)
    box[:, 0], box[:, 1] = shape[0], shape[1]
    for k in range(len(labels)):
        label, row, col = labels[k], points[k, 0], points[k, 1]
        if label == 0:
            continue
        box[label, 0], box[label, 1] = min(box[label, 0], row), min(box[label, 1], col)
        box[label, 2], box[label, 3] = max(box[label, 2], row + 1), max(box[label, 3], col + 1)
    return box


def _chain_length_by_label(skeleton: Pixels, labels: np.ndarray, count: int) -> np.ndarray:
    """Corner-count chain length per label (``labels``: one per skeleton pixel).

    Diagonal links count only where no orthogonal path joins the pair (staircases are
    not counted twice). A corner is a pixel with two links that are not collinear.
    """
    return _chain_lengths(skeleton.neighbours, labels, count)[1:]


@njit(cache=True, nogil=True)
def _chain_lengths(neighbours: np.ndarray, labels: np.ndarray, count: int) -> np.ndarray:
    links = np.zeros((count + 1, 5), np.int64)  # per label: E, S, SE, SW links (each at its upper or left pixel), corners
    for pixel in range(len(neighbours)):
        ring = neighbours[pixel]
        nw, n, ne, e, se, s, sw, w = ring[0] >= 0, ring[1] >= 0, ring[2] >= 0, ring[3] >= 0, ring[4] >= 0, ring[5] >= 0, \
            ring[6] >= 0, ring[7] >= 0
        se, sw, nw, ne = se and not e and not s, sw and not w and not s, nw and not n and not w, ne and not n and not e
        label = labels[pixel]
        links[label, 0] += e
        links[label, 1] += s
        links[label, 2] += se
        links[label, 3] += sw
        degree = nw + n + ne + e + se + s + sw + w
        collinear = (e and w) or (s and n) or (se and nw) or (sw and ne)
        links[label, 4] += degree == 2 and not collinear
    total = np.zeros(count + 1)
    for label in range(count + 1):  # in the order, and with the products, of summing whole arrays
        total[label] += ORTHOGONAL * links[label, 0]
        total[label] += ORTHOGONAL * links[label, 1]
        total[label] += DIAGONAL * links[label, 2]
        total[label] += DIAGONAL * links[label, 3]
        total[label] -= CORNER * links[label, 4]
    return total


def _max_width_by_label(cracks: Pixels, distance: np.ndarray, skeleton: Pixels, ends: np.ndarray, labels: np.ndarray,
                        count: int) -> np.ndarray:
    """Largest full width along each skeleton, away from the rounded caps at its ends where possible.

    The full width at a skeleton pixel of the mask (the ridge) is 2d - 1, or 2d where a neighbour
    off the ridge is as far from the background (even widths). ndimage.maximum_filter found that
    neighbour before; its 'reflect' border only repeats pixels of the neighbourhood.
    """
    joined = skeleton.parent  # the pixels it was thinned from: the mask's, and the bridges'
    is_end = np.zeros(len(joined.index) + 1, np.bool_)  # by slot: 1 + position among the joined pixels
    is_end[skeleton.in_parent[ends] + 1] = True
    return _max_widths(cracks.find(skeleton.index), distance, cracks.neighbours, labels, skeleton.points,
                       (joined.slots, is_end, joined.stride), count)[1:]


@njit(cache=True, nogil=True)
def _max_widths(at, distance, neighbours, labels, points, ends, count):
    """Per label, the largest 2d - 1 over its skeleton pixels on the mask (``at``: their positions among the mask's
    pixels, -1 on a bridge), and the largest full width over those farther than d + 1 from every skeleton end
    (``ends``: the joined pixels' slots, whether each slot is an end, the stride)."""
    slots, is_end, stride = ends
    on_ridge = np.zeros(len(distance), np.bool_)
    for pixel in at:
        if pixel >= 0:
            on_ridge[pixel] = True
    result = np.zeros(count + 1)
    for k in range(len(at)):
        pixel, label = at[k], labels[k]
        if pixel < 0:
            continue
        depth = distance[pixel]
        result[label] = max(result[label], 2.0 * depth - 1.0)
        if _near_an_end(points[k, 0], points[k, 1], depth + 1, slots, is_end, stride):  # near an end the cap distorts the width
            continue
        twin = 0.0
        for place in range(8):
            other = neighbours[pixel, place]
            if other >= 0 and not on_ridge[other]:
                twin = max(twin, distance[other])
        even = abs(twin - depth) <= 1e-8 + 1e-5 * depth  # np.isclose
        result[label] = max(result[label], 2.0 * depth - 1.0 + (1.0 if even else 0.0))
    return result


@njit(cache=True, nogil=True)
def _near_an_end(row, col, reach, slots, is_end, stride):
    """Whether a skeleton end lies within ``reach`` of the pixel (all such ends are in the square of that half-side
    around it), compared as a k-d tree's distances would be."""
    height, width = len(slots) // stride - 2, stride - 2
    side = int(reach)
    nearest = -1
    for other_row in range(max(row - side, 0), min(row + side, height - 1) + 1):
        for other_col in range(max(col - side, 0), min(col + side, width - 1) + 1):
            if is_end[slots[(other_row + 1) * stride + other_col + 1]]:
                squared = (other_row - row) ** 2 + (other_col - col) ** 2
                if nearest < 0 or squared < nearest:
                    nearest = squared
    return nearest >= 0 and not np.sqrt(np.float64(nearest)) > reach
