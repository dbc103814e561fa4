"""Each image scored, and the scores summed into a report, under the default protocol or a paper's.

Under the default protocol, ``crackseg``, every figure comes from the per-threshold histograms of
:mod:`crackseg.evaluation.metrics`, the code that also scores validation during training; the other
protocols (:mod:`crackseg.evaluation.protocols`) reproduce a paper's evaluation code, to set crackseg
beside its table. Photos whose ground truth has no crack are also reported apart: how many
get a predicted crack, counted as ``predict`` counts cracks; and false alarms far from any
crack, in every photo (:mod:`crackseg.evaluation.false_alarms`). The report states each
definition next to its number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from crackseg.core.errors import InputError
from crackseg.cracks.measure import find_cracks
from crackseg.evaluation.false_alarms import OPERATING_PROTOCOLS, add_false_alarms, image_alarms
from crackseg.evaluation.metrics import (
    average_precision,
    background_iou,
    best_f1,
    operating_mask,
    optimal_image_scale,
    scores_at,
    sweep,
    threshold_histograms,
)
from crackseg.evaluation.options import Scoring
from crackseg.evaluation.protocols import PROTOCOLS, image_counts

DEFINITIONS = {
    "precision, recall, f1": "dataset level: counts summed over all images, then divided, at the operating threshold; "
    "with tolerance T a predicted crack pixel is correct if a true crack pixel lies within T px, and a true crack "
    "pixel is found if a predicted one lies within T px",
    "iou_crack": "strict pixel IoU of the crack class (tolerance 0), dataset level",
    "iou_background": "strict pixel IoU of the background class (tolerance 0), dataset level",
    "miou": "mean of iou_crack and iou_background",
    "per_image_mean": "F1 (with tolerance) and strict crack IoU computed per image at the operating threshold, then "
    "averaged; an image with no true and no predicted crack pixels scores 1",
    "ods": "optimal dataset scale: the single threshold (of 499, evenly spaced in logit: 0.01 apart near 0.5, finer towards 0 and 1) with the best dataset-level F1",
    "ois": "optimal image scale: each image's best F1 over the 499 thresholds, averaged over the images with true crack "
    "pixels, as crack papers' Python evaluation code computes it (SCSegamba's, CrackFormer's; a crack-free image, which "
    "any threshold above its largest probability scores 1, is left out: crack_free reports those); null (n/a) when no "
    "image has a crack pixel; the BSDS edges toolbox (HED) instead sums each image's counts at its own best threshold, "
    "which weighs images by their crack pixels",
    "ap": "average precision: area under the dataset-level precision-recall curve over the 499 thresholds; null "
    "(n/a) when the ground truth has no crack pixel, where recall is undefined",
}
CRACK_FREE_DEFINITION = (
    "images whose ground truth has no crack pixel, also reported apart: how many get at least one predicted crack (the mask "
    "at the operating threshold the other figures use, cut into cracks as predict counts them: pieces joined across gaps up to "
    "join_gap_px, cracks shorter than min_length_px left out), and the mask's crack pixels per megapixel of these images; "
    "every other figure counts them as before"
)
@dataclass(frozen=True)
class ImageScore:
    """One image's contribution to a report."""

    name: str
    crack_pixels: int  # in its ground truth
    scores: object  # crackseg: (strict, tolerant) histograms; other protocols: crackseg.evaluation.protocols.image_counts
    false_alarm: dict | None  # a crack-free image, under a protocol with an operating threshold: the cracks and crack pixels predicted on it
    far_alarms: dict | None = None  # crackseg.evaluation.false_alarms.image_alarms' counts; None under protocols without them


def score_image(prob: torch.Tensor, truth: torch.Tensor, tolerance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Strict (tolerance 0) and tolerant (3, BINS) histograms of one (H, W) image."""
    if prob.shape != truth.shape:
        raise InputError(f"prediction is {tuple(prob.shape)} px but its ground truth is {tuple(truth.shape)}")
    strict = threshold_histograms(prob, truth)
    return strict, (threshold_histograms(prob, truth, tolerance=tolerance) if tolerance > 0 else strict)


def score_one(name: str, prob: torch.Tensor, truth: torch.Tensor, tolerance: float, threshold: float,
              scoring: Scoring = Scoring()) -> ImageScore:
    """Score one (H, W) probability map against its (H, W) bool ground truth as ``scoring`` says."""
    if prob.shape != truth.shape:
        raise InputError(f"prediction is {tuple(prob.shape)} px but its ground truth is {tuple(truth.shape)}")
    if scoring.protocol == "crackseg":
        scores = score_image(prob, truth, tolerance)
    else:
        scores = image_counts(scoring.protocol, prob.cpu().numpy(), truth.cpu().numpy(), threshold)
    crack_pixels = int(truth.sum())
    far_alarms = image_alarms(prob, truth, threshold, scoring.protocol, scoring.alarm_distance, scoring.alarm_tile)
    alarm = None if crack_pixels or scoring.protocol not in OPERATING_PROTOCOLS else _false_alarm(prob, threshold, scoring)
    return ImageScore(name, crack_pixels, scores, alarm, far_alarms)


def _false_alarm(prob: torch.Tensor, threshold: float, scoring: Scoring) -> dict:
    """The cracks predict would count on a crack-free photo, and the crack pixels of its mask."""
    mask = operating_mask(prob, threshold, scoring.protocol).cpu().numpy()
    cracks = find_cracks(mask, scoring.join_gap, scoring.min_length)[1]
    return {"cracks": len(cracks), "crack_pixels": int(mask.sum()), "pixels": int(mask.size)}


def build_report(results: list[ImageScore], tolerance: float, threshold: float, scoring: Scoring = Scoring()) -> dict:
    """The report of ``scoring.protocol`` from each image's scores, with crack-free photos reported apart and,
    under a protocol with an operating threshold, false alarms far from any crack."""
    if scoring.protocol == "crackseg":
        report = _crackseg_report(results, tolerance, threshold)
    else:
        report = _protocol_report(results, threshold, scoring.protocol)
    report = _with_crack_free(report, results, threshold, scoring)
    alarms = {r.name: r.far_alarms for r in results if r.far_alarms is not None}
    return add_false_alarms(report, alarms, scoring.alarm_distance, scoring.alarm_tile)


def _crackseg_report(results: list[ImageScore], tolerance: float, threshold: float) -> dict:
    strict = torch.stack([r.scores[0] for r in results]).sum(0)
    tolerant = torch.stack([r.scores[1] for r in results]).sum(0)
    operating = scores_at(tolerant, threshold)
    crack_iou = scores_at(strict, threshold).iou
    back_iou = background_iou(strict, threshold)
    ods = best_f1(tolerant)
    ois = optimal_image_scale([r.scores[1] for r in results if r.crack_pixels])
    rows = []
    for name, (image_strict, image_tolerant) in ((r.name, r.scores) for r in results):
        at = scores_at(image_tolerant, threshold)
        rows.append({
            "image": name,
            "crack_pixels": int(image_strict[2].sum()),
            "precision": round(at.precision, 6), "recall": round(at.recall, 6), "f1": round(at.f1, 6),
            "iou": round(scores_at(image_strict, threshold).iou, 6),
            "best_f1": round(best_f1(image_tolerant).f1, 6),  # this image's OIS term
        })
    rows.sort(key=lambda row: (row["f1"], row["iou"], row["image"]))
    return {
        "protocol": "crackseg",
        "images": len(results),
        "tolerance_px": tolerance,
        "threshold": operating.threshold,  # the grid threshold scored, the nearest to the one asked for
        "dataset": {
            "precision": operating.precision, "recall": operating.recall, "f1": operating.f1,
            "iou_crack": crack_iou, "iou_background": back_iou, "miou": (crack_iou + back_iou) / 2,
        },
        "per_image_mean": {"f1": float(np.mean([r["f1"] for r in rows])), "iou": float(np.mean([r["iou"] for r in rows]))},
        "ods": {"f1": ods.f1, "threshold": ods.threshold, "precision": ods.precision, "recall": ods.recall},
        "ois": {"f1": ois},
        "ap": average_precision(tolerant),
        "worst_images": [row["image"] for row in rows[:10]],
        "definitions": DEFINITIONS,
        "per_image": rows,
        "pr_curve": [{"threshold": s.threshold, "precision": s.precision, "recall": s.recall, "f1": s.f1} for s in sweep(tolerant)],
    }


def _protocol_report(results: list[ImageScore], threshold: float, protocol: str) -> dict:
    """The report of a literature protocol (crackseg.evaluation.protocols) from each image's counts."""
    entry = PROTOCOLS[protocol]
    figures, image_figures, curve = entry.scores([r.scores for r in results])
    rows = [{"image": r.name, "crack_pixels": r.crack_pixels, **{key: round(value, 6) if isinstance(value, float) else value
                                                                  for key, value in values.items()}}
            for r, values in zip(results, image_figures)]
    rows.sort(key=lambda row: (*(row[key] for key in entry.worst_first), row["image"]))
    return {
        "protocol": protocol,
        "reference": entry.reference,
        "images": len(results),
        **({"threshold": threshold} if protocol == "omnicrack" else {}),
        **figures,
        "worst_images": [row["image"] for row in rows[:10]],
        "definitions": entry.definitions,
        "per_image": rows,
        **({"pr_curve": curve} if curve else {}),
    }


def _with_crack_free(report: dict, results: list[ImageScore], threshold: float, scoring: Scoring) -> dict:
    """``report`` with ``crack_free`` (after worst_images) and its definition, and the per-image rows marked,
    when some ground truth is crack-free; unchanged otherwise."""
    free = {r.name: r.false_alarm for r in results if r.false_alarm is not None}
    if not free:
        return report
    summary = {
        "images": len(free),
        "with_predicted_cracks": sum(alarm["cracks"] > 0 for alarm in free.values()),
        "false_crack_pixels_per_megapixel": 1e6 * sum(a["crack_pixels"] for a in free.values()) / sum(a["pixels"] for a in free.values()),
        "threshold": report.get("threshold", threshold),  # under crackseg's protocol, the grid threshold scored
        "min_length_px": scoring.min_length,
        "join_gap_px": scoring.join_gap,
    }
    for row in report["per_image"]:
        alarm = free.get(row["image"])
        row["crack_free"] = int(alarm is not None)
        if alarm is not None:
            row["false_cracks"], row["false_crack_pixels"] = alarm["cracks"], alarm["crack_pixels"]
    marked = {}
    for key, value in report.items():
        marked[key] = {**value, "crack_free": CRACK_FREE_DEFINITION} if key == "definitions" else value
        if key == "worst_images":
            marked["crack_free"] = summary
    return marked

