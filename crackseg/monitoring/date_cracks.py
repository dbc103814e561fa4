"""One date's cracks of one image, as a comparison takes them: predict's measurement and each crack's centreline.

:func:`measure_date` measures a mask as ``predict`` does (:func:`crackseg.cracks.measure.find_cracks`, so crack ids
are those of cracks.csv) and adds what matching two dates needs and cracks.csv does not hold: the skeleton pixels
of every crack, and the cracks shorter than predict's minimum length, kept aside. :mod:`crackseg.monitoring.changes`
matches two such dates; measuring one date is a step of its own, made once per side of a pair.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage

from crackseg.cracks.measure import CrackMeasure, find_cracks
from crackseg.cracks.pixel_sets import thinned


@dataclass(frozen=True)
class DateCracks:
    """One date's cracks of one image, as predict measures them."""

    labels: np.ndarray  # (H, W) int32 crack ids, 0 = background (find_cracks' labels)
    cracks: list[CrackMeasure]  # longest first; ids from 1, as cracks.csv numbers them
    points: dict[int, np.ndarray]  # crack id -> (N, 2) int (row, col) of its skeleton pixels, short cracks' included
    # shorter than predict's minimum length on this date, so not in its cracks.csv (ids after the others', not in
    # labels): what the mask shows where the other date, photographed at another pixel size, has a crack
    short: list[CrackMeasure] = field(default_factory=list)


def measure_date(mask: np.ndarray, join_gap_px: float, min_length_px: float) -> DateCracks:
    """The cracks of ``mask`` ((H, W) bool) with their skeleton pixels.

    find_cracks runs on the box around the crack pixels with one pixel of background around it
    (distances, skeletons and labels are those of the whole mask, so ids are predict's), and
    each crack is skeletonised inside its own box: a whole photo with a few cracks costs
    little more than its cracks.
    """
    mask = np.asarray(mask, bool)
    labels = np.zeros(mask.shape, np.int32)
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        return DateCracks(labels, [], {})
    top, left = max(int(rows[0]) - 1, 0), max(int(cols[0]) - 1, 0)
    window = (slice(top, rows[-1] + 2), slice(left, cols[-1] + 2))
    # every crack, the short ones too: sorted longest first, those predict kept come first, under its ids
    inner, found = find_cracks(mask[window], join_gap_px, 0.0)
    cracks = [dataclasses.replace(crack, bbox=(crack.bbox[0] + top, crack.bbox[1] + left, crack.bbox[2] + top, crack.bbox[3] + left),
                                  anchor=(crack.anchor[0] + top, crack.anchor[1] + left)) for crack in found]
    kept = sum(crack.length_px >= min_length_px for crack in cracks)
    labels[window] = np.where(inner <= kept, inner, 0)
    points = {}
    skeleton = thinned(inner > 0)  # one crack's pixels are never 8-adjacent to another's: each thins as if alone
    for number, box in enumerate(ndimage.find_objects(inner), 1):
        points[number] = np.argwhere(skeleton[box] & (inner[box] == number)) + (box[0].start + top, box[1].start + left)
    return DateCracks(labels, cracks[:kept], points, cracks[kept:])
