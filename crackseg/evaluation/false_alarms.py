"""False alarms far from any crack: what a model marks on shadows, joints, stems and watermarks of other sites.

Precision counts every wrong pixel alike, and a figure over crack-free photos needs datasets
that have them. These two figures count where a user meets false alarms, on any dataset, from
each image's mask at the report's operating threshold and its ground truth, as counts that add
up over images (never a mean of per-image figures):

- far alarm pixels: predicted crack pixels lying more than ``distance`` px (Euclidean, the
  distance transform of the ground truth) from every true crack pixel, per megapixel of all
  scored images. The rule is the tolerance's (:mod:`crackseg.evaluation.metrics`): with the
  distance equal to ``--tolerance`` they are the false positives of precision.
- crack-free tiles: every image cut into ``tile`` px squares from its top-left corner (the last
  row and column of tiles partial); a tile is crack-free when its ground truth has no crack
  pixel, in crack-free and cracked photos alike. How many there are, and the share holding at
  least one predicted crack pixel (and at least one far alarm pixel).

Only protocols with an operating threshold get them: crackseg (the grid threshold its other
figures use) and omnicrack (its prediction, probability >= the threshold). scsegamba and
deepsegmentor score 8-bit maps at thresholds of their own sweep, and leave them out.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import ndimage

from crackseg.evaluation.metrics import operating_mask

DEFINITION = (
    "far alarm pixels: predicted crack pixels (the mask at the operating threshold the other figures use) lying more than "
    "distance_px px (Euclidean) from every true crack pixel, summed over images, per megapixel of all scored images "
    "(far_pixels_per_mp; per_image.csv: far_alarm_pixels); crack-free tiles: every image cut into tile_px px tiles from its "
    "top-left corner (the last, partial ones included), a tile crack-free when its ground truth has no crack pixel (in "
    "cracked photos too): how many (crack_free_tiles), the share with at least one predicted crack pixel (share) and with at "
    "least one far alarm pixel (far_share); reported under the crackseg and omnicrack protocols, which have an operating "
    "threshold, not under scsegamba and deepsegmentor"
)

OPERATING_PROTOCOLS = ("crackseg", "omnicrack")  # those that score a mask at one threshold; the others sweep their own


def image_alarms(prob: torch.Tensor, truth: torch.Tensor, threshold: float, protocol: str, distance: float,
                 tile: int) -> dict | None:
    """The false-alarm counts of one (H, W) probability map against its (H, W) bool ground truth, the mask taken
    as ``protocol`` takes it at ``threshold``; None for a protocol without an operating threshold."""
    if protocol not in OPERATING_PROTOCOLS:
        return None
    mask, truth = operating_mask(prob, threshold, protocol).cpu().numpy(), truth.cpu().numpy().astype(bool)
    far = mask & (ndimage.distance_transform_edt(~truth) > distance) if truth.any() else mask
    free = ~_any_per_tile(truth, tile)
    return {
        "pixels": int(mask.size),
        "far_pixels": int(far.sum()),
        "crack_free_tiles": int(free.sum()),
        "crack_free_tiles_with_alarm": int((free & _any_per_tile(mask, tile)).sum()),
        "crack_free_tiles_with_far_alarm": int((free & _any_per_tile(far, tile)).sum()),
    }


def _any_per_tile(array: np.ndarray, tile: int) -> np.ndarray:
    """(ceil(H / tile), ceil(W / tile)) bool: whether each tile of ``array`` holds a True pixel."""
    rows, cols = np.arange(0, array.shape[0], tile), np.arange(0, array.shape[1], tile)
    return np.logical_or.reduceat(np.logical_or.reduceat(array, rows, axis=0), cols, axis=1)


def add_false_alarms(report: dict, alarms: dict[str, dict], distance: float, tile: int) -> dict:
    """``report`` with ``false_alarms`` (after crack_free, or worst_images) and its definition, and each per-image
    row given its far_alarm_pixels; unchanged when ``alarms`` (per image name) is empty."""
    if not alarms:
        return report
    totals = {key: sum(counts[key] for counts in alarms.values()) for key in next(iter(alarms.values()))}
    free = totals["crack_free_tiles"]
    block = {
        "distance_px": distance,
        "threshold": report["threshold"],
        "far_pixels": totals["far_pixels"],
        "far_pixels_per_mp": 1e6 * totals["far_pixels"] / totals["pixels"] if totals["pixels"] else 0.0,
        "tile_px": tile,
        "crack_free_tiles": free,
        "crack_free_tiles_with_alarm": totals["crack_free_tiles_with_alarm"],
        "share": totals["crack_free_tiles_with_alarm"] / free if free else None,
        "crack_free_tiles_with_far_alarm": totals["crack_free_tiles_with_far_alarm"],
        "far_share": totals["crack_free_tiles_with_far_alarm"] / free if free else None,
    }
    for row in report["per_image"]:
        row["far_alarm_pixels"] = alarms[row["image"]]["far_pixels"]
    after = "crack_free" if "crack_free" in report else "worst_images"
    marked = {}
    for key, value in report.items():
        marked[key] = {**value, "false_alarms": DEFINITION} if key == "definitions" else value
        if key == after:
            marked["false_alarms"] = block
    return marked


def format_alarms(block: dict) -> str:
    """The printed summary's line of the false_alarms block."""
    line = f"  false alarms > {block['distance_px']:g} px from any crack: {block['far_pixels_per_mp']:.1f} pixels per megapixel; "
    if not block["crack_free_tiles"]:
        return line + f"no {block['tile_px']} px tile without a crack"
    return (line + f"{block['tile_px']} px tiles without a crack: {block['crack_free_tiles']}, {100 * block['share']:.1f}% with a "
            f"predicted crack pixel ({100 * block['far_share']:.1f}% with a far one)")
