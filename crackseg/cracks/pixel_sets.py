"""Pixel sets: some pixels of a mask held on their own, and the whole-image operations measuring needs, done on them.

A :class:`Pixels` holds pixels as flat indices into the image padded with background, so a neighbour is a fixed
offset away and no image-sized array is made per operation. :func:`components`, :func:`distances` and :func:`thin`
give, bit for bit, scipy.ndimage's 8-connected labels and Euclidean distance transform and scikit-image's
skeletonize (Zhang and Suen's thinning, with scikit-image's table). Kept apart from :mod:`crackseg.cracks.measure`,
which builds lengths, widths and joins on them, because they are the pixel morphology, not the crack measures.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy import ndimage
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree


class Pixels:
    """Some pixels of an (H, W) image, in scan order, as flat indices into the image padded with one
    pixel of background: a neighbour is a fixed offset away and the image's border needs no check.
    Values per pixel are arrays in the same order. A subset finds pixels through the set it was
    taken from, so only a whole mask's set holds an image-sized table.
    """

    def __init__(self, shape: tuple[int, int], index: np.ndarray, parent: Pixels | None = None,
                 in_parent: np.ndarray | None = None):
        self.shape, self.index = shape, index
        self.stride = shape[1] + 2
        self.parent, self.in_parent = parent, in_parent  # in_parent: the pixels' positions in the parent set

    @classmethod
    def of(cls, mask: np.ndarray) -> Pixels:
        rows, cols = np.divmod(np.flatnonzero(mask), mask.shape[1])
        return cls(mask.shape, (rows + 1) * (mask.shape[1] + 2) + cols + 1)

    def index_of(self, rows, cols):
        return (rows + 1) * self.stride + cols + 1

    @cached_property
    def points(self) -> np.ndarray:
        """(n, 2) row, col in the image, as np.argwhere gives them."""
        rows, cols = np.divmod(self.index, self.stride)
        return np.stack([rows - 1, cols - 1], axis=1)

    def find(self, index: np.ndarray) -> np.ndarray:
        """Position of each padded flat index among the pixels, -1 where it is not one."""
        if self.parent is None:
            return self._slots[index] - 1
        return self._from_parent[self.parent.find(index)]

    @cached_property
    def _slots(self) -> np.ndarray:
        """1 + each pixel's position over the padded image, 0 elsewhere."""
        slots = np.zeros((self.shape[0] + 2) * self.stride, np.int32)
        slots[self.index] = np.arange(1, len(self.index) + 1)
        return slots

    @cached_property
    def _from_parent(self) -> np.ndarray:
        """Position in this set of each pixel of the parent set, -1 for the others and, last, for -1."""
        where = np.full(len(self.parent.index) + 1, -1, np.int32)
        where[self.in_parent] = np.arange(len(self.index))
        return where

    @cached_property
    def neighbours(self) -> np.ndarray:
        """(n, 8) positions of each pixel's neighbours, in _RING order, -1 where a neighbour is not in the set."""
        if self.parent is not None:
            return self._from_parent[self.parent.neighbours[self.in_parent]]
        return np.stack([self.find(self.index + row * self.stride + col) for row, col in _RING], axis=1)

    def subset(self, keep: np.ndarray) -> Pixels:
        positions = np.flatnonzero(keep)
        return Pixels(self.shape, self.index[positions], self, positions)

    def union(self, index: np.ndarray) -> Pixels:
        """A new set of these pixels and those at the padded flat indices ``index`` (a few)."""
        extra = np.unique(index[self.find(index) < 0])
        return Pixels(self.shape, np.insert(self.index, np.searchsorted(self.index, extra), extra))

    def image(self, values, dtype) -> np.ndarray:
        """An (H, W) array of ``values`` at the pixels, 0 elsewhere."""
        image = np.zeros(self.shape, dtype)
        image[self.points[:, 0], self.points[:, 1]] = values
        return image


# a pixel's 8 neighbours (row, col offsets) NW N NE E SE S SW W: bits 0 to 7 of its neighbourhood code
_RING = np.array([(-1, -1), (-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1)])
# scikit-image's table for Zhang and Suen's thinning (skeletonize), one digit per neighbourhood code:
# 1 = the pixel goes in the first sub-pass, 2 = in the second, 3 = in either
_THINNING = np.array([int(digit) for digit in (
    "0001001300311013000000002020303300000000300000000000000020003022"
    "0000000000000000000000000000000020000000200020003000000030003020"
    "0031001300000001000000000000000131000000000000002000000000000000"
    "2313001300000001000000000000000023010001000000003301000022002000")], np.uint8)


def components(pixels: Pixels) -> np.ndarray:
    """The 8-connected component of each pixel, numbered from 1 in scan order of their first pixels, as ndimage.label numbers them."""
    count = len(pixels.index)
    forward = pixels.neighbours[:, 3:7]  # E, SE, S, SW: each link once, from its upper or left pixel
    heads, which = np.nonzero(forward >= 0)
    graph = coo_array((np.ones(len(heads), np.int8), (heads, forward[heads, which])), shape=(count, count))
    found, component = connected_components(graph, directed=False)
    first = np.full(found, count)
    np.minimum.at(first, component, np.arange(count))
    number = np.empty(found, np.int64)
    number[np.argsort(first)] = np.arange(1, found + 1)
    return number[component]


def distances(pixels: Pixels) -> np.ndarray:
    """ndimage.distance_transform_edt at each pixel: the distance to the nearest background pixel in the image.

    That is 1 beside the background and sqrt(2) where only a corner touches it; inside a crack, the
    nearest background pixel is one along its edges (a step from any other towards the pixel would
    land on background nearer to it).
    """
    height, width = pixels.shape
    background = pixels.neighbours < 0
    rows, cols = pixels.points.T
    border = np.flatnonzero((rows == 0) | (rows == height - 1) | (cols == 0) | (cols == width - 1))
    around_rows, around_cols = rows[border, None] + _RING[:, 0], cols[border, None] + _RING[:, 1]
    background[border] &= (around_rows >= 0) & (around_rows < height) & (around_cols >= 0) & (around_cols < width)
    distance = np.where(background[:, 1::2].any(axis=1), 1.0, np.sqrt(2.0))  # odd places of the ring: N, E, S, W
    inside = ~background.any(axis=1)
    if inside.any():
        pixel, place = np.nonzero(background)
        around = pixels.index[pixel] + _RING[place, 0] * pixels.stride + _RING[place, 1]
        edge = _once(around, np.zeros((height + 2) * pixels.stride, np.int32))
        if not len(edge):  # the whole image is crack: scipy then measures to the pixel above the top-left corner
            return ndimage.distance_transform_edt(np.ones(pixels.shape, bool)).ravel()
        distance[inside] = cKDTree(Pixels(pixels.shape, edge).points).query(pixels.points[inside])[0]
    return distance


def thin(pixels: Pixels) -> Pixels:
    """skimage.morphology.skeletonize of the pixels: Zhang and Suen's parallel thinning with scikit-image's
    table, outside the image being background as there.

    A sub-pass looks again only at the pixels beside one removed since that sub-pass last looked:
    the others, with the same neighbours, would stay again.
    """
    neighbours = pixels.neighbours
    present = np.ones(len(pixels.index) + 1, np.uint8)
    present[-1] = 0  # where a neighbour is not in the set (-1)
    seen = np.zeros(len(present), np.int64)
    due = [np.arange(len(pixels.index)), np.arange(len(pixels.index))]
    while len(due[0]) or len(due[1]):
        for sub_pass in (0, 1):
            look = due[sub_pass][present[due[sub_pass]] == 1]
            kind = _THINNING[np.packbits(present[neighbours[look]], axis=1, bitorder="little")[:, 0]]
            removed = look[(kind == 3) | (kind == sub_pass + 1)]
            present[removed] = 0
            beside = neighbours[removed].ravel()
            beside = _once(beside[beside >= 0], seen)
            due[sub_pass], due[1 - sub_pass] = beside, _once(np.concatenate([due[1 - sub_pass], beside]), seen)
    return pixels.subset(present[:-1] == 1)


def _once(values: np.ndarray, seen: np.ndarray) -> np.ndarray:
    """``values`` without repeats, in no particular order, in time linear in their number (``seen``: scratch indexed by value)."""
    order = np.arange(len(values), dtype=seen.dtype)
    seen[values] = order
    return values[seen[values] == order]
