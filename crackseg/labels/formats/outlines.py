"""Crack masks -> outlines each labelling tool draws back as exactly those pixels (pre-annotations).

Exported polygons are Douglas-Peucker simplified by at most EDGE_SIMPLIFY px (CENTRE_SIMPLIFY for
labelme), after dropping points on straight runs: every pixel centre lies at least 0.35 px from
the boundary that marching squares trace, and pycocotools moves a vertex by at most 0.14 px (it
rounds to fifths of a pixel), so no pixel changes sides and the polygons draw the mask back
exactly (0.3 px already lost pixels).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from scipy.spatial import cKDTree
from skimage.measure import find_contours

EDGE_SIMPLIFY = 0.2  # px: pixel centres lie >= 0.35 px from a traced boundary and pycocotools moves a vertex <= 0.14 px
CENTRE_SIMPLIFY = 0.2  # px, for labelme's outlines through boundary pixel centres (PIL draws the outline too)
CRACK = "crack"  # the label exported shapes carry


def crack_components(mask: np.ndarray):
    """Each 8-connected crack as ((h, w) bool pixels of its box, (left, top))."""
    labels, _ = ndimage.label(mask, np.ones((3, 3), bool))
    for number, box in enumerate(ndimage.find_objects(labels), 1):
        yield labels[box] == number, (box[1].start, box[0].start)


def _area(ring: np.ndarray) -> float:
    x, y = ring[:, 0], ring[:, 1]
    return 0.5 * float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1)))


def _corners(ring: np.ndarray) -> np.ndarray:
    """A closed ring without the points that lie on a straight run (exact: the coordinates are halves), closed."""
    steps = np.diff(ring, axis=0)
    before = np.roll(steps, 1, axis=0)
    turns = (steps[:, 0] * before[:, 1] != steps[:, 1] * before[:, 0]) | ((steps * before).sum(axis=1) <= 0)
    corners = ring[:-1][turns]
    return np.concatenate([corners, corners[:1]])


def _simplify(ring: np.ndarray, tolerance: float) -> np.ndarray:
    """Douglas-Peucker on a closed ring (first point repeated last): every dropped point lies within ``tolerance`` of
    the segment that replaces it. All segments of a level are split at once."""
    keep = np.zeros(len(ring), bool)
    keep[[0, -1, int(np.argmax(((ring - ring[0]) ** 2).sum(axis=1)))]] = True
    while True:
        ends = np.flatnonzero(keep)
        part = np.minimum(np.searchsorted(ends, np.arange(len(ring)), side="right") - 1, len(ends) - 2)
        start, step = ring[ends[part]], ring[ends[part + 1]] - ring[ends[part]]
        length = (step**2).sum(axis=1)
        along = np.clip(((ring - start) * step).sum(axis=1) / np.where(length > 0, length, 1), 0, 1)
        gap = np.hypot(*(ring - start - along[:, None] * step).T)
        gap[keep] = 0
        split = np.maximum.reduceat(gap, ends[:-1]) > tolerance
        if not split.any():
            return ring[keep]
        order = np.lexsort((-gap, part))  # by segment, farthest first
        keep[order[np.searchsorted(part[order], np.flatnonzero(split))]] = True


def _contours(component: np.ndarray) -> list[np.ndarray]:
    """Closed boundaries of one component, (N, 2) x, y in its padded box's centre coordinates, the outer one first."""
    found = find_contours(np.pad(component, 1).astype(np.uint8), 0.5, fully_connected="high")
    return sorted((contour[:, ::-1] for contour in found), key=lambda ring: -abs(_area(ring)))


def edge_polygon(component: np.ndarray, origin: tuple[int, int]) -> np.ndarray:
    """One polygon in edge coordinates ((N, 2) x, y) that pycocotools draws as ``component``: its outer boundary with
    each hole joined to it by a cut of zero width (a keyhole), which covers no pixel."""
    rings = [_simplify(_corners(ring), EDGE_SIMPLIFY)[:-1] + np.asarray(origin) - 0.5 for ring in _contours(component)]
    return rings[0] if len(rings) == 1 else _join_holes(rings)


def _join_holes(rings: list[np.ndarray]) -> np.ndarray:
    """The outer ring (first) with every hole spliced in: the cuts form the shortest tree (Kruskal) over each
    hole's nearest vertex on another ring, so they cross the crack, not the background between holes."""
    starts = np.cumsum([0] + [len(ring) for ring in rings])
    owner = np.repeat(np.arange(len(rings)), np.diff(starts))
    every, outer = cKDTree(np.concatenate(rings)), cKDTree(rings[0])
    cuts = []  # (length, ring, its vertex, other ring, its vertex)
    for number in range(1, len(rings)):
        lengths, found = every.query(rings[number], k=min(32, len(owner)))
        lengths = np.where(owner[found] != number, lengths, np.inf)
        at = np.unravel_index(lengths.argmin(), lengths.shape)
        if np.isfinite(lengths[at]):
            other = int(owner[found[at]])
            cuts.append((lengths[at], number, int(at[0]), other, int(found[at] - starts[other])))
        lengths, found = outer.query(rings[number])  # a cut to the outer ring always exists
        cuts.append((lengths.min(), number, int(lengths.argmin()), 0, int(found[lengths.argmin()])))
    group = list(range(len(rings)))

    def root(ring: int) -> int:
        while group[ring] != ring:
            group[ring] = group[group[ring]]
            ring = group[ring]
        return ring

    links: dict[int, list[tuple[int, int, int]]] = {}  # ring -> (its vertex, other ring, that ring's vertex)
    for _, ring, vertex, other, other_vertex in sorted(cuts):
        if root(ring) != root(other):
            group[root(ring)] = root(other)
            links.setdefault(ring, []).append((vertex, other, other_vertex))
            links.setdefault(other, []).append((other_vertex, ring, vertex))
    pieces, stack, seen = [], [(0, 0)], {0}  # each ring from the vertex its cut arrives at, round to it again
    while stack:
        item = stack.pop()
        if isinstance(item, np.ndarray):
            pieces.append(item)
            continue
        ring, entry = item
        order = np.roll(rings[ring], -entry, axis=0)
        hung = sorted(((here - entry) % len(order), other, there) for here, other, there in links.get(ring, []) if other not in seen)
        seen.update(other for _, other, _ in hung)
        todo, done = [], 0
        for offset, other, there in hung:  # up to the cut's vertex, round the hole, back at that vertex
            todo += [order[done : offset + 1], (other, there), order[offset : offset + 1]]
            done = offset + 1
        stack += reversed(todo + [np.concatenate([order[done:], order[:1]])])
    return np.concatenate(pieces)


def centre_outline(component: np.ndarray, origin: tuple[int, int]) -> np.ndarray | None:
    """The outline through ``component``'s boundary pixel centres ((N, 2) x, y) that labelme draws back as it, or
    None when the component has holes (PIL would fill them)."""
    if ndimage.binary_fill_holes(component).sum() != component.sum():
        return None
    padded = np.pad(component, 1)
    ring = _contours(component)[0][:, ::-1]  # (row, col): each point halfway between a crack pixel and a background one
    low, high = np.floor(ring).astype(int), np.ceil(ring).astype(int)
    inside = padded[low[:, 0], low[:, 1]][:, None]
    points = np.where(inside, low, high)[:, ::-1] + np.asarray(origin) - 1
    points = points[np.concatenate([[True], (points[1:] != points[:-1]).any(axis=1)])].astype(np.float64)
    if len(points) > 1 and (points[0] == points[-1]).all():
        points = points[:-1]
    if len(points) > 3:
        points = _simplify(_corners(np.concatenate([points, points[:1]])), CENTRE_SIMPLIFY)[:-1]
    return np.concatenate([points] * 3)[:3] if len(points) < 3 else points
