"""Crack segmentation metrics from counts that add up across images, batches and processes.

Probabilities are histogrammed once into ``BINS`` bins, separately for crack and
background pixels. Cumulating the histograms from the top gives the confusion counts at
every threshold ``k / BINS`` at once (a pixel is predicted crack when p >= threshold),
so a threshold sweep costs one pass. Histograms are int64 and are summed, never
averaged, across processes: the result is exact for any process count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BINS = 100


def probability_histograms(probs: torch.Tensor, masks: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(2, BINS) int64: row 0 counts crack pixels, row 1 background pixels, by probability bin."""
    bins = (probs.float() * BINS).long().clamp_(0, BINS - 1).flatten()
    crack = masks.bool().flatten()
    keep = torch.ones_like(crack) if valid is None else valid.bool().flatten()
    index = bins + BINS * (~crack).long()
    return torch.bincount(index[keep], minlength=2 * BINS).view(2, BINS)


@dataclass(frozen=True)
class Scores:
    threshold: float
    precision: float
    recall: float
    f1: float
    iou: float


def confusion_by_threshold(histograms: torch.Tensor) -> torch.Tensor:
    """(BINS + 1, 4) int64 [tp, fp, fn, tn] for thresholds 0, 1/BINS, ..., 1."""
    crack, background = histograms.long()
    above_crack = torch.cat([crack.flip(0).cumsum(0).flip(0), crack.new_zeros(1)])
    above_background = torch.cat([background.flip(0).cumsum(0).flip(0), background.new_zeros(1)])
    tp, fp = above_crack, above_background
    return torch.stack([tp, fp, crack.sum() - tp, background.sum() - fp], dim=1)


def scores_from_counts(tp: int, fp: int, fn: int, tn: int, threshold: float = float("nan")) -> Scores:
    """Precision, recall, F1 and crack IoU; an empty prediction of an empty truth scores 1."""
    precision = tp / (tp + fp) if tp + fp else float(fn == 0)
    recall = tp / (tp + fn) if tp + fn else float(fp == 0)
    f1 = 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0
    iou = tp / (tp + fp + fn) if tp + fp + fn else 1.0
    return Scores(threshold, precision, recall, f1, iou)


def sweep(histograms: torch.Tensor) -> list[Scores]:
    """Scores at every threshold k / BINS for k = 1 .. BINS - 1."""
    counts = confusion_by_threshold(histograms).tolist()
    return [scores_from_counts(*counts[k], threshold=k / BINS) for k in range(1, BINS)]


def best_f1(histograms: torch.Tensor) -> Scores:
    """The threshold with the best F1 (ties go to the threshold nearest 0.5)."""
    return max(sweep(histograms), key=lambda s: (s.f1, -abs(s.threshold - 0.5)))


def scores_at(histograms: torch.Tensor, threshold: float) -> Scores:
    k = min(BINS, max(0, round(threshold * BINS)))
    return scores_from_counts(*confusion_by_threshold(histograms)[k].tolist(), threshold=k / BINS)
