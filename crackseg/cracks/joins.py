"""Joining the pieces of one crack that a mask shows apart, across short gaps along the crack's own direction.

Each skeleton end in scan order, its direction taken from its own piece's skeleton within 10 px to the end and its
neighbour (a thinning spur at the tip tilts it half as much as from the end alone), is bridged to the nearest skeleton
pixel of a piece not yet joined to its own (the gap between their edges) that lies within 30 degrees of that
direction: a crack is followed along itself, never merged with whatever lies near it. The results are, bit for bit,
those of testing every skeleton pixel a k-d tree of the skeleton finds within reach, in the tree's order.

Candidates are found on a grid of cells a gap's reach wide, in one compiled loop. Where two candidates are equally
near, or an angle lies within rounding of 30 degrees, that loop cannot settle an end bit for bit: the tree's order
picks the last of equal gaps, and NumPy's dot product (which BLAS may take with a fused multiply-add) decides the
angle. Such an end is settled over scipy's k-d tree, built for it then. Everywhere else the loop's figures are
NumPy's: its spans are the C library's hypot, which np.hypot calls too, and its gaps take no product.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit
from scipy.spatial import cKDTree
from skimage.draw import line as draw_line

from crackseg.cracks.pixel_sets import Pixels, skeleton_ends

_COS_30 = math.cos(math.radians(30))
_SLACK = 1e-6  # px: far more than rounding, far less than a pixel
_CELL = 16  # px: the least side of the grid's cells, which bounds the grid to 1 / 256 of the image


def join_pieces(cracks: Pixels, pieces: np.ndarray, distance: np.ndarray, skeleton: Pixels,
                join_gap: float) -> list[tuple[tuple[int, int], float, np.ndarray]]:
    """A one-pixel bridge across each gap of at most ``join_gap`` px a skeleton end points over: (row, col) of its
    start, the gap, its pixels' padded indices. ``pieces`` and ``distance`` are per pixel of ``cracks``, the mask's
    pixels; ``skeleton``, a subset of them."""
    points, owner, depth = skeleton.points, pieces[skeleton.in_parent], distance[skeleton.in_parent]
    ends, direction = _pointing_ends(skeleton, owner)
    deepest = float(depth.max(initial=0.0))
    reach = join_gap + 2 * deepest + 2 * _SLACK  # the farthest a candidate may lie; one cell past the image holds it all
    cell = max(_CELL, math.ceil(min(reach, max(skeleton.shape) + 1)))
    grid = (*_grid(points, cell, skeleton.shape), cell)
    roots = np.arange(int(pieces.max(initial=0)) + 1)  # the pieces joined so far: one bridge per pair, none around a loop
    settled = (roots, np.full(len(ends), -1, np.int64), np.zeros(len(ends)))  # and each end's target and gap
    tree, head = None, 0
    while head < len(ends):
        head = _targets((points, owner, depth), ends, direction, join_gap, grid, settled, head)
        if head < len(ends):  # an end the compiled search could not settle on its own
            tree = cKDTree(points) if tree is None else tree
            found = tree.query_ball_point(points[ends[head]], join_gap + depth[ends[head]] + deepest + _SLACK, return_sorted=False)
            _settle_by_tree(found, (points, owner, depth), ends, direction, join_gap, settled, head)
            head += 1
    _, target, gaps = settled
    bridges = []
    for end, best, best_gap in zip(ends[target >= 0], target[target >= 0], gaps[target >= 0]):
        (row, col), (best_row, best_col) = points[end], points[best]
        line_rows, line_cols = draw_line(int(row), int(col), int(best_row), int(best_col))
        bridges.append(((int(row), int(col)), max(float(best_gap), 0.0), cracks.index_of(line_rows, line_cols)))
    return bridges


def _pointing_ends(skeleton: Pixels, owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The skeleton ends that point somewhere, and each one's unit direction."""
    points, cracks = skeleton.points, skeleton.parent
    ends = np.flatnonzero(skeleton_ends(skeleton))
    tip_sums, tip_count, sums, count = _own_sums(points[ends, 0], points[ends, 1], owner[ends], cracks.slots,
                                                 skeleton.from_parent, owner, cracks.stride)
    # the sums are of integers, exact in any order: np.mean's values
    direction = tip_sums / tip_count[:, None] - sums / count[:, None]
    size = np.hypot(direction[:, 0], direction[:, 1])
    pointing = size >= 0.5
    return ends[pointing], direction[pointing] / size[pointing, None]


def _settle_by_tree(found: list[int], skeleton: tuple[np.ndarray, np.ndarray, np.ndarray], ends: np.ndarray,
                    direction: np.ndarray, join_gap: float, settled: tuple[np.ndarray, np.ndarray, np.ndarray],
                    head: int) -> None:
    """Settle end ``head`` over ``found``, the skeleton pixels within reach in the k-d tree's order, as
    :func:`_targets` would but with NumPy's own dot product, the last of equal gaps winning."""
    (points, owner, depth), (roots, target, gaps), end = skeleton, settled, ends[head]
    piece, best, best_gap = _root(roots, owner[end]), -1, join_gap
    for i in found:
        if _root(roots, owner[i]) == piece:
            continue
        step = points[i] - points[end]
        span = np.hypot(*step)
        gap = span - (depth[end] - 0.5) - (depth[i] - 0.5)
        if gap <= best_gap and step @ direction[head] >= span * _COS_30:
            best, best_gap = i, gap
    if best >= 0:
        roots[_root(roots, owner[best])] = piece
        target[head], gaps[head] = best, best_gap


@njit(cache=True, nogil=True)
def _grid(points, cell, shape):
    """The points sorted by the cell of side ``cell`` they lie in (row-major cells), where each cell's points start
    in that order (and the last end), and the number of cells per row."""
    columns = shape[1] // cell + 1
    cells = (shape[0] // cell + 1) * columns
    where = (points[:, 0] // cell) * columns + points[:, 1] // cell
    cell_starts = np.zeros(cells + 1, np.int64)
    for k in range(len(where)):
        cell_starts[where[k] + 1] += 1
    for k in range(cells):
        cell_starts[k + 1] += cell_starts[k]
    filled = cell_starts[:-1].copy()
    order = np.empty(len(where), np.int64)
    for k in range(len(where)):
        order[filled[where[k]]] = k
        filled[where[k]] += 1
    return order, cell_starts, columns


@njit(cache=True, nogil=True)
def _targets(skeleton, ends, direction, join_gap, grid, settled, first):
    """Settle the ends from ``first`` on in turn (``skeleton``: its pixels' points, pieces and depths; ``grid``: the
    points in cell order, where each cell starts, cells per row, the cell's side; ``settled``: the pieces' union-find
    forest, each bridge joining two, and each end's target (-1: none) and gap, filled in here); return where an
    end needs the k-d tree (two equally near candidates, or an angle within rounding of 30 degrees), or the number
    of ends."""
    (points, owner, depth), (order, cell_starts, columns, cell), (roots, target, gaps) = skeleton, grid, settled
    rows = (len(cell_starts) - 1) // columns
    for head in range(first, len(ends)):
        end = ends[head]
        row, col = points[end, 0], points[end, 1]
        piece = _root(roots, owner[end])
        best, best_gap, ties = -1, join_gap, 0
        for cell_row in range(max(row // cell - 1, 0), min(row // cell + 1, rows - 1) + 1):
            for cell_col in range(max(col // cell - 1, 0), min(col // cell + 1, columns - 1) + 1):
                at = cell_row * columns + cell_col
                for k in range(cell_starts[at], cell_starts[at + 1]):
                    i = order[k]
                    step_row, step_col = points[i, 0] - row, points[i, 1] - col
                    span = math.hypot(step_row, step_col)
                    gap = span - (depth[end] - 0.5) - (depth[i] - 0.5)  # each edge half a pixel beyond its last crack pixel
                    if gap > best_gap:
                        continue
                    along, least = step_row * direction[head, 0] + step_col * direction[head, 1], span * _COS_30
                    if along < least - _SLACK or _root(roots, owner[i]) == piece:
                        continue
                    if along - least <= _SLACK:
                        return head
                    if gap == best_gap and best >= 0:
                        ties += 1
                    else:
                        best, best_gap, ties = i, gap, 0
        if ties:
            return head
        if best >= 0:
            roots[_root(roots, owner[best])] = piece
            target[head], gaps[head] = best, best_gap
    return len(ends)


@njit(cache=True, nogil=True)
def _root(roots, piece):
    while roots[piece] != piece:
        roots[piece] = roots[roots[piece]]
        piece = roots[piece]
    return piece


@njit(cache=True, nogil=True)
def _own_sums(rows, cols, owners, slots, in_skeleton, owner, stride):
    """Per end: the sums of the rows and of the columns of its own piece's skeleton pixels within 1.5 px (itself and
    its neighbour) and their count, then the same within 10 px."""
    height, width = len(slots) // stride - 2, stride - 2
    tip_sums = np.zeros((len(rows), 2))
    tip_count = np.zeros(len(rows), np.int64)
    sums = np.zeros((len(rows), 2))
    count = np.zeros(len(rows), np.int64)
    for end in range(len(rows)):
        for row in range(max(rows[end] - 10, 0), min(rows[end] + 10, height - 1) + 1):
            for col in range(max(cols[end] - 10, 0), min(cols[end] + 10, width - 1) + 1):
                if (row - rows[end]) ** 2 + (col - cols[end]) ** 2 > 100:
                    continue
                slot = slots[(row + 1) * stride + col + 1]
                if slot == 0:
                    continue
                pixel = in_skeleton[slot - 1]
                if pixel >= 0 and owner[pixel] == owners[end]:
                    sums[end, 0] += row
                    sums[end, 1] += col
                    count[end] += 1
                    if (row - rows[end]) ** 2 + (col - cols[end]) ** 2 <= 2:
                        tip_sums[end, 0] += row
                        tip_sums[end, 1] += col
                        tip_count[end] += 1
    return tip_sums, tip_count, sums, count


