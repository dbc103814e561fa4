"""Crack segmentation metrics from counts that add up across images, batches and processes.

Probabilities are histogrammed once into ``BINS`` bins between the ``THRESHOLDS``;
cumulating from the top gives the counts at every threshold at once (a pixel is predicted
crack when p >= threshold), so a threshold sweep costs one pass. The thresholds are evenly
spaced in logit, from sigmoid(-10) to sigmoid(10): 0.01 apart around 0.5 and ever finer
towards 0 and 1, where a weighted loss pushes the best threshold (the best of a grid 0.01
apart used to land on its last point, 0.99). Three histograms per image:

- ``near``: probabilities of pixels within ``tolerance`` px of a true crack pixel
  (predicted there, they count as correct);
- ``far``: probabilities of the other pixels (predicted there, false positives);
- ``reach``: for each true crack pixel, the highest probability within ``tolerance`` px
  (at threshold t the pixel is found when that value is >= t).

With tolerance 0, ``near`` and ``reach`` are both the histogram of crack pixels, and the
counts are the usual confusion matrix. Histograms are int64 and are summed, never
averaged, across processes, so results are exact for any process count. The tolerance
convention is CrackForest's / FPHBN's: a predicted crack pixel is correct if a true one
lies within T px, and a true crack pixel is found if a predicted one lies within T px.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

BINS = 500
LOGIT_RANGE = 10.0
# THRESHOLDS[k], k = 0 .. BINS: 0, then sigmoid of BINS - 1 logits evenly spaced over
# [-LOGIT_RANGE, LOGIT_RANGE] (0.5 among them), then 1. Float32 values, as probabilities are.
THRESHOLDS = torch.cat([
    torch.zeros(1), torch.sigmoid(torch.linspace(-LOGIT_RANGE, LOGIT_RANGE, BINS - 1, dtype=torch.float64)).float(), torch.ones(1)
])
NEAR, FAR, REACH = 0, 1, 2


def bin_of(probs: torch.Tensor) -> torch.Tensor:
    """Each probability's bin k: how many of the inner thresholds THRESHOLDS[1 .. BINS - 1] it reaches."""
    inner = THRESHOLDS[1:BINS].to(probs.device)
    return torch.bucketize(probs.float().contiguous(), inner, right=True)


def threshold_index(threshold: float) -> int:
    """The index of the grid threshold nearest ``threshold``, of those a pixel can reach: not the closing 1, which no bin
    starts at, so that p >= 1 still marks sure pixels."""
    return int(torch.argmin((THRESHOLDS[:BINS].double() - float(threshold)).abs()))


def operating_mask(probs: torch.Tensor, threshold: float, protocol: str = "crackseg") -> torch.Tensor:
    """The crack mask at a report's operating threshold: under crackseg's protocol p >= the grid threshold nearest
    ``threshold``, exactly as the histograms count, so that every figure of a report marks the same pixels; under a
    paper's, p >= ``threshold``."""
    return bin_of(probs) >= threshold_index(threshold) if protocol == "crackseg" else probs >= threshold


def threshold_histograms(
    probs: torch.Tensor, truth: torch.Tensor, valid: torch.Tensor | None = None, tolerance: float = 0.0
) -> torch.Tensor:
    """(3, BINS) int64 histograms ``near``, ``far``, ``reach`` of one image or a batch (bin k: THRESHOLDS[k] <= p < THRESHOLDS[k + 1]).

    ``probs`` in [0, 1] and ``truth`` (bool or 0/1) of any matching shape; ``valid`` marks
    the pixels that count (padding excluded). A positive ``tolerance`` takes one image (H, W).
    """
    truth = truth.bool()
    bins = bin_of(probs)
    keep = torch.ones_like(truth) if valid is None else valid.bool()
    if tolerance > 0:
        near, reach_bins = _tolerance_maps(probs, truth, tolerance)
    else:
        near, reach_bins = truth, bins
    # Weighted bincount instead of boolean indexing: no device-to-host sync on CUDA.
    index = torch.where(near, bins, bins + BINS).flatten()
    near_far = torch.bincount(index, weights=keep.flatten().double(), minlength=2 * BINS).view(2, BINS)
    reach = torch.bincount(reach_bins.flatten(), weights=(truth & keep).flatten().double(), minlength=BINS)
    return torch.cat([near_far, reach[None]]).round().long()


def _tolerance_maps(probs: torch.Tensor, truth: torch.Tensor, tolerance: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixels within ``tolerance`` of the truth, and the bin of the highest probability within it."""
    if probs.ndim != 2:
        raise ValueError("a positive tolerance takes one (H, W) image at a time")
    truth_np = truth.cpu().numpy()
    near = ndimage.distance_transform_edt(~truth_np) <= tolerance if truth_np.any() else np.zeros_like(truth_np)
    radius = int(np.floor(tolerance))
    yy, xx = np.mgrid[-radius : radius + 1, -radius : radius + 1]
    disk = yy**2 + xx**2 <= tolerance**2
    highest = ndimage.maximum_filter(probs.float().cpu().numpy(), footprint=disk, mode="constant", cval=0.0)
    return torch.from_numpy(near).to(truth.device), bin_of(torch.from_numpy(highest)).to(truth.device)


@dataclass(frozen=True)
class Counts:
    """Counts at every threshold THRESHOLDS[k], k = 0 .. BINS (each a (BINS + 1,) int64 tensor)."""

    correct: torch.Tensor  # predicted crack pixels that are correct
    false_positive: torch.Tensor
    found: torch.Tensor  # true crack pixels that are found
    truth: torch.Tensor  # true crack pixels (the same at every threshold)
    true_negative: torch.Tensor  # exact at tolerance 0


def counts_by_threshold(histograms: torch.Tensor) -> Counts:
    def at_or_above(row: torch.Tensor) -> torch.Tensor:
        return torch.cat([row.flip(0).cumsum(0).flip(0), row.new_zeros(1)])

    histograms = histograms.long().cpu()
    correct, false_positive, found = (at_or_above(histograms[row]) for row in (NEAR, FAR, REACH))
    truth = histograms[REACH].sum().expand(BINS + 1)
    true_negative = histograms[FAR].sum() - false_positive
    return Counts(correct, false_positive, found, truth, true_negative)


@dataclass(frozen=True)
class Scores:
    threshold: float
    precision: float
    recall: float
    f1: float
    iou: float  # crack IoU; strict pixel IoU when the histograms have tolerance 0


def scores_from_counts(correct: int, false_positive: int, found: int, truth: int, threshold: float = float("nan")) -> Scores:
    """Precision, recall, F1, IoU; an empty prediction of an empty truth scores 1 (never NaN)."""
    predicted = correct + false_positive
    missed = truth - found
    precision = correct / predicted if predicted else float(truth == 0)
    recall = found / truth if truth else float(predicted == 0)
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    union = predicted + missed
    iou = correct / union if union else float(truth == 0)
    return Scores(threshold, precision, recall, f1, iou)


def sweep(histograms: torch.Tensor) -> list[Scores]:
    """Scores at every inner threshold THRESHOLDS[k], k = 1 .. BINS - 1."""
    c = counts_by_threshold(histograms)
    columns = [t.tolist() for t in (c.correct, c.false_positive, c.found, c.truth)]
    thresholds = THRESHOLDS.tolist()
    return [scores_from_counts(*(col[k] for col in columns), threshold=thresholds[k]) for k in range(1, BINS)]


def best_f1(histograms: torch.Tensor) -> Scores:
    """The threshold with the best F1 (ties go to the threshold nearest 0.5)."""
    return max(sweep(histograms), key=lambda s: (s.f1, -abs(s.threshold - 0.5)))


def scores_at(histograms: torch.Tensor, threshold: float) -> Scores:
    """Scores at the grid threshold nearest ``threshold`` (the one reported)."""
    return _scores_at_index(counts_by_threshold(histograms), threshold_index(threshold))


def _scores_at_index(c: Counts, k: int) -> Scores:
    return scores_from_counts(int(c.correct[k]), int(c.false_positive[k]), int(c.found[k]), int(c.truth[k]), THRESHOLDS[k].item())


def background_iou(histograms: torch.Tensor, threshold: float) -> float:
    """IoU of the background class at tolerance 0: TN / (TN + FP + FN)."""
    k = threshold_index(threshold)
    c = counts_by_threshold(histograms)
    union = int(c.true_negative[k] + c.false_positive[k] + c.truth[k] - c.found[k])
    return int(c.true_negative[k]) / union if union else 1.0


def average_precision(histograms: torch.Tensor) -> float | None:
    """Area under the precision-recall curve, summed over the recall steps as thresholds fall; None without a true crack
    pixel, where recall, and so the curve, is undefined (every model would score 0)."""
    counts = counts_by_threshold(histograms)
    if not int(counts.truth[0]):
        return None
    curve = [_scores_at_index(counts, k) for k in range(BINS + 1)]  # down to the closing 1, where nothing is marked
    return float(sum((curve[k].recall - curve[k + 1].recall) * curve[k].precision for k in range(BINS)))


def optimal_image_scale(per_image: list[torch.Tensor]) -> float | None:
    """OIS as crack benchmarks compute it: each image's best F1 over the thresholds, averaged; None for no image. A
    crack-free image has no such F1 (any threshold above its largest probability scores it 1): leave it out."""
    return float(np.mean([best_f1(histograms).f1 for histograms in per_image])) if per_image else None


def improves(monitor: str, score: float, best: float | None) -> bool:
    """Whether ``score`` of metric ``monitor`` beats ``best``: lower for ``loss``, higher for the rest; NaN never does."""
    if math.isnan(score):
        return False
    return best is None or (score < best if monitor == "loss" else score > best)
