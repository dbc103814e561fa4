"""Pixel sets: some pixels of a mask held on their own, and the whole-image operations measuring needs, done on them.

A :class:`Pixels` holds pixels as flat indices into the image padded with background, so a neighbour is a fixed
offset away and no image-sized array is made per operation. :func:`components`, :func:`distances` and :func:`thin`
give, bit for bit, scipy.ndimage's 8-connected labels and Euclidean distance transform and scikit-image's
thin (Guo and Hall's thinning, with scikit-image's tables); :func:`thin_grown` thins a set grown by a few pixels
(the bridges of a join) from the thinning of the set it grew from. Kept apart from :mod:`crackseg.cracks.measure`,
which builds lengths, widths and joins on them, because they are the pixel morphology, not the crack measures.

Their loops over pixels are compiled by numba (cached on disk after the first call of a machine): vectorized NumPy
spent most of its time on many small arrays, and measuring must keep up with a GPU's masks.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from numba import njit
from scipy import ndimage


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
        pixels = cls(mask.shape, (rows + 1) * (mask.shape[1] + 2) + cols + 1)
        pixels.points = np.stack([rows, cols], axis=1)  # known here: set in place of the cached property's division
        return pixels

    def index_of(self, rows, cols):
        return (rows + 1) * self.stride + cols + 1

    @cached_property
    def points(self) -> np.ndarray:
        """(n, 2) row, col in the image, as np.argwhere gives them."""
        if self.parent is not None:
            return self.parent.points[self.in_parent]
        rows, cols = np.divmod(self.index, self.stride)
        return np.stack([rows - 1, cols - 1], axis=1)

    def find(self, index: np.ndarray) -> np.ndarray:
        """Position of each padded flat index among the pixels, -1 where it is not one."""
        if self.parent is None:
            return self.slots[index] - 1
        return self.from_parent[self.parent.find(index)]

    @cached_property
    def slots(self) -> np.ndarray:
        """1 + each pixel's position over the padded image, 0 elsewhere: an image-sized table, made when first asked
        (a subset finds pixels through its parent's, and makes its own only when asked)."""
        slots = np.zeros((self.shape[0] + 2) * self.stride, np.int32)
        slots[self.index] = np.arange(1, len(self.index) + 1)
        return slots

    @cached_property
    def from_parent(self) -> np.ndarray:
        """Position in this set of each pixel of the parent set, -1 for the others and, last, for -1."""
        where = np.full(len(self.parent.index) + 1, -1, np.int32)
        where[self.in_parent] = np.arange(len(self.index))
        return where

    @cached_property
    def neighbours(self) -> np.ndarray:
        """(n, 8) positions of each pixel's neighbours, in _RING order, -1 where a neighbour is not in the set."""
        if self.parent is not None:
            return _subset_neighbours(self.parent.neighbours, self.in_parent, self.from_parent)
        return _neighbour_table(self.index, self.slots, _RING[:, 0] * self.stride + _RING[:, 1])

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
# scikit-image's tables for Guo and Hall's thinning (thin: G123_LUT, G123P_LUT), one digit per neighbourhood code:
# 1 = the pixel goes in the first sub-pass, 2 = in the second, 3 = in either
_THINNING = np.array([int(digit) for digit in (
    "0000000300220022000000000022202200000000202220220000000030222022"
    "0000000000000000000000000000000000000000202020203000000030202020"
    "0013001300020002000000000002000211110011000000001111000011000000"
    "0111001100000000000000000000000011110011000000001111000011000000"
    )], np.uint8)


def thinned(mask: np.ndarray) -> np.ndarray:
    """skimage.morphology.thin of a whole (H, W) mask, bit for bit, by the compiled :func:`thin` (scikit-image's own
    runs NumPy per sub-pass, 20 times the cost)."""
    return thin(Pixels.of(np.asarray(mask, bool))).image(True, bool)


def components(pixels: Pixels) -> np.ndarray:
    """The 8-connected component of each pixel, numbered from 1 in scan order of their first pixels, as ndimage.label numbers them."""
    return _components(pixels.neighbours)


def distances(pixels: Pixels) -> np.ndarray:
    """ndimage.distance_transform_edt at each pixel: the distance to the nearest background pixel in the image (in an
    image without one, that is all crack, to the nearest pixel outside it, since no width within could be told).

    Separably, as exact distance transforms do (Meijster et al., 2000), but on the pixels alone: each pixel's
    distance along its column to the background, then, along its row, the least of (column offset)^2 + that
    column distance^2, searched outwards until the offset alone is farther than the best found. A crack's
    pixels lie a few pixels from the background, so this costs a few steps per pixel.
    """
    height, width = pixels.shape
    if len(pixels.index) == height * width:  # scipy would measure to the pixel above the top-left corner: widths past the image
        return ndimage.distance_transform_edt(np.pad(np.ones(pixels.shape, bool), 1))[1:-1, 1:-1].ravel()
    rows, cols = pixels.points.T
    return _distances(pixels.neighbours, rows, cols, pixels.slots, pixels.stride, height, width)


def thin(pixels: Pixels) -> Pixels:
    """skimage.morphology.thin of the pixels: Guo and Hall's parallel thinning with scikit-image's tables,
    outside the image being background as there. Not skeletonize (Zhang and Suen's): that erases stretches of
    bands near 45 degrees, up to half of a straight diagonal crack (scikit-image issue 7704).

    A sub-pass looks again only at the pixels beside one removed since a sub-pass of its kind last looked:
    the others, with the same neighbours, would stay again.
    """
    return thinning(pixels)[0]


def thinning(pixels: Pixels) -> tuple[Pixels, np.ndarray]:
    """:func:`thin`, and the sub-pass in which each pixel went (-1: it stays), from which :func:`thin_grown` goes on."""
    removed_at = _thinned(pixels.neighbours, _THINNING)
    return pixels.subset(removed_at < 0), removed_at


def thin_grown(grown: Pixels, base: Pixels, removed_at: np.ndarray) -> Pixels:
    """:func:`thin` of ``grown``, every pixel of ``base`` and a few more, bit for bit, from ``removed_at`` of thinning
    ``base``.

    A pixel's fate in a sub-pass depends on itself and its eight neighbours alone, so ``grown`` is thinned as ``base``
    was wherever neither differs: only the pixels that differ from ``base``'s at that sub-pass (at first the added
    ones) and their neighbours are looked at.
    """
    in_base = base.find(grown.index)
    if np.count_nonzero(in_base >= 0) != len(base.index):
        raise ValueError("thin_grown: the grown set lacks pixels of the base set")
    return grown.subset(_thinned_again(grown.neighbours, in_base, removed_at, _THINNING))


def skeleton_ends(skeleton: Pixels) -> np.ndarray:
    """Whether each pixel of a skeleton has exactly one neighbour in it."""
    return _one_neighbour(skeleton.neighbours)


@njit(cache=True, nogil=True)
def _one_neighbour(neighbours):
    ends = np.zeros(len(neighbours), np.bool_)
    for pixel in range(len(neighbours)):
        degree = 0
        for place in range(8):
            degree += neighbours[pixel, place] >= 0
        ends[pixel] = degree == 1
    return ends


@njit(cache=True, nogil=True)
def _neighbour_table(index: np.ndarray, slots: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Pixels.neighbours of a whole set: each pixel's slot, at each offset of the ring, less one."""
    table = np.empty((len(index), len(offsets)), slots.dtype)
    for pixel in range(len(index)):
        for place in range(len(offsets)):
            table[pixel, place] = slots[index[pixel] + offsets[place]] - 1
    return table


@njit(cache=True, nogil=True)
def _subset_neighbours(parent_neighbours: np.ndarray, in_parent: np.ndarray, from_parent: np.ndarray) -> np.ndarray:
    """Pixels.neighbours of a subset, from its parent's."""
    table = np.empty((len(in_parent), parent_neighbours.shape[1]), from_parent.dtype)
    for pixel in range(len(in_parent)):
        for place in range(parent_neighbours.shape[1]):
            other = parent_neighbours[in_parent[pixel], place]
            table[pixel, place] = from_parent[other] if other >= 0 else -1
    return table


@njit(cache=True, nogil=True)
def _components(neighbours: np.ndarray) -> np.ndarray:
    count = len(neighbours)
    parent = np.arange(count)
    for pixel in range(count):
        for place in range(3, 7):  # E, SE, S, SW: each link once, from its upper or left pixel
            other = neighbours[pixel, place]
            if other < 0:
                continue
            a, b = pixel, other
            while parent[a] != a:
                parent[a] = parent[parent[a]]
                a = parent[a]
            while parent[b] != b:
                parent[b] = parent[parent[b]]
                b = parent[b]
            if a != b:
                parent[max(a, b)] = min(a, b)
    number = np.zeros(count, np.int64)
    found = 0
    for pixel in range(count):  # pixels in scan order: a root is numbered at its component's first pixel
        root = pixel
        while parent[root] != root:
            root = parent[root]
        if number[root] == 0:
            found += 1
            number[root] = found
        number[pixel] = number[root]
    return number


@njit(cache=True, nogil=True)
def _distances(neighbours, rows, cols, slots, stride, height, width):
    """See distances: ``slots`` holds 1 + each pixel's position over the padded image, 0 elsewhere."""
    count = len(neighbours)
    far = height + width  # farther than any pixel of the image
    up = np.empty(count, np.int64)
    for pixel in range(count):  # scan order: the pixel above comes first
        above = neighbours[pixel, 1]
        up[pixel] = up[above] + 1 if above >= 0 else (far if rows[pixel] == 0 else 1)
    along = np.empty(count, np.int64)  # the distance along the column, up or down
    for pixel in range(count - 1, -1, -1):
        below = neighbours[pixel, 5]
        down = along[below] + 1 if below >= 0 else (far if rows[pixel] == height - 1 else 1)
        along[pixel] = min(up[pixel], down, far)
    distance = np.empty(count)
    for pixel in range(count):
        row, col = rows[pixel], cols[pixel]
        best = along[pixel] * along[pixel]
        offset = 1
        while offset * offset < best and (col - offset >= 0 or col + offset < width):
            for other in (col - offset, col + offset):
                if 0 <= other < width:
                    slot = slots[(row + 1) * stride + other + 1]
                    best = min(best, offset * offset + (0 if slot == 0 else along[slot - 1] * along[slot - 1]))
            offset += 1
        distance[pixel] = np.sqrt(np.float64(best))
    return distance


@njit(cache=True, nogil=True)
def _thinned(neighbours: np.ndarray, table: np.ndarray) -> np.ndarray:
    """The sub-pass in which each pixel goes, -1 for those that stay (see thin). Each pixel's neighbourhood code is
    kept up to date as its neighbours go, and a sub-pass looks only at the pixels waiting for one of its kind: at
    first those beside the background (a pixel with all eight neighbours stays), then those beside a pixel removed
    since that kind last looked."""
    count = len(neighbours)
    removed_at = np.full(count, -1, np.int64)
    code = np.zeros(count, np.uint8)
    for pixel in range(count):
        for place in range(8):
            if neighbours[pixel, place] >= 0:
                code[pixel] |= np.uint8(1 << place)
    due = np.empty((2, count), np.int64)
    due_count = np.zeros(2, np.int64)
    waiting = np.zeros((2, count), np.bool_)
    for pixel in range(count):
        if code[pixel] != 255:
            for kind in range(2):
                due[kind, due_count[kind]] = pixel
                due_count[kind] += 1
                waiting[kind, pixel] = True
    removed = np.empty(count, np.int64)
    step, idle = 0, 0
    while idle < 2:  # until a sub-pass of each kind removed nothing
        sub_pass = step % 2
        gone = 0
        for k in range(due_count[sub_pass]):
            pixel = due[sub_pass, k]
            waiting[sub_pass, pixel] = False
            if removed_at[pixel] < 0:
                verdict = table[code[pixel]]
                if verdict == 3 or verdict == sub_pass + 1:
                    removed[gone] = pixel
                    gone += 1
        due_count[sub_pass] = 0
        for k in range(gone):
            removed_at[removed[k]] = step
        for k in range(gone):
            for place in range(8):
                other = neighbours[removed[k], place]
                if other >= 0:
                    code[other] &= ~np.uint8(1 << ((place + 4) % 8))  # the removed pixel is the other's opposite neighbour
                    if removed_at[other] < 0:
                        for kind in range(2):
                            if not waiting[kind, other]:
                                waiting[kind, other] = True
                                due[kind, due_count[kind]] = other
                                due_count[kind] += 1
        idle = 0 if gone else idle + 1
        step += 1
    return removed_at


@njit(cache=True, nogil=True)
def _in_base(pixel, step, base, removed_at):
    """Whether a pixel of the grown set is one of the base set's still there at the start of sub-pass ``step``."""
    at = base[pixel]
    return at >= 0 and (removed_at[at] < 0 or removed_at[at] >= step)


@njit(cache=True, nogil=True)
def _thinned_again(neighbours: np.ndarray, base: np.ndarray, removed_at: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which pixels of the grown set stay (see thin_grown): ``base`` holds each one's position in the base set, -1 for
    an added one; ``removed_at``, the base pixels' sub-passes."""
    count = len(neighbours)
    last = removed_at.max() if len(removed_at) else -1
    differs = np.zeros(count, np.bool_)  # present in one set and not the other, at the start of the sub-pass
    listed = np.empty(count, np.int64)
    listed_count = 0
    for pixel in range(count):
        if base[pixel] < 0:
            differs[pixel] = True
            listed[listed_count] = pixel
            listed_count += 1
    stamp = np.zeros(count, np.int64)
    looked = np.empty(count, np.int64)
    goes = np.zeros(count, np.bool_)
    step, idle = 0, 0
    while idle < 2:  # until a sub-pass of each kind removed nothing, here or (up to its last) in the base set
        looked_count = 0
        for k in range(listed_count):  # the differing pixels and their neighbours
            pixel = listed[k]
            for place in range(9):
                other = pixel if place == 8 else neighbours[pixel, place]
                if other >= 0 and stamp[other] != step + 1:
                    stamp[other] = step + 1
                    looked[looked_count] = other
                    looked_count += 1
        gone = 0
        for k in range(looked_count):
            pixel = looked[k]
            goes[k] = False
            if _in_base(pixel, step, base, removed_at) != differs[pixel]:
                code = 0
                for place in range(8):
                    other = neighbours[pixel, place]
                    if other >= 0 and _in_base(other, step, base, removed_at) != differs[other]:
                        code |= 1 << place
                verdict = table[code]
                if verdict == 3 or verdict == step % 2 + 1:
                    goes[k] = True
                    gone += 1
        listed_count = 0
        for k in range(looked_count):
            pixel = looked[k]
            here = (_in_base(pixel, step, base, removed_at) != differs[pixel]) and not goes[k]
            differs[pixel] = here != _in_base(pixel, step + 1, base, removed_at)
            if differs[pixel]:
                listed[listed_count] = pixel
                listed_count += 1
        idle = 0 if gone or step <= last else idle + 1
        step += 1
    stays = np.empty(count, np.bool_)
    for pixel in range(count):
        stays[pixel] = _in_base(pixel, step, base, removed_at) != differs[pixel]
    return stays
