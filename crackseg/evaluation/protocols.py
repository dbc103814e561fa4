"""The literature's evaluation protocols, each computed as its reference code computes it.

Crack papers score ODS, OIS, F1 and mIoU with their own scripts, and the same probability
maps give very different numbers under each. These reproduce three widely used scripts
(read at the commits named), so crackseg's models can be set beside a paper's table; the
crackseg protocol itself is :mod:`crackseg.evaluation.metrics`. Every protocol takes a crack
probability map (H, W) in [0, 1] and a boolean ground truth, and keeps only small per-image
counts, so images are scored one at a time.

- ``scsegamba``: SCSegamba (github.com/Karl1109/SCSegamba @ cc74c46, ``test.py`` writes each
  map, ``eval/evaluate.py`` scores it) and MixerCSeg (github.com/spiderforest/MixerCSeg
  ``test.py``; its ``eval/evaluate.py``, read from github.com/leiming555/MixerCSeg, defines
  the same figures). Each map is divided by its own maximum and stored as 8 bits
  (``255 * (out / max)`` in float32, rounded to nearest, ties to even, by OpenCV's
  ``imwrite``). At each of 100 thresholds ``t = numpy.arange(0, 1, 0.01)`` a pixel is crack when ``level / 255 > t``.
  Per image: precision 1 when nothing is predicted, recall 0 when nothing is true, F1 0
  when both are 0, so an image without crack pixels scores F1 0 at every threshold. ODS:
  the best over t of the mean over images of F1; OIS: the mean over images of each one's
  best F1; mIoU: the best over t of the mean over images of (crack IoU + background IoU) /
  2, an image with no predicted and no true crack pixel counting 0; precision, recall, F1:
  counts summed over images at t = 0.00, the figures the script prints as P, R, F1.
- ``deepsegmentor``: DeepCrack (Liu et al., Neurocomputing 2019) as its code,
  github.com/yhlleo/DeepSegmentor @ 57164e6, evaluates it: ``models/deepcrack_model.py``
  and ``util/util.py`` write ``((p - 0.5) / 0.5 + 1) / 2 * 255`` in float32, truncated to
  8 bits; ``eval/prf_metrics.py`` and ``eval/segment_metrics.py`` sum TP, FP, FN (and TN)
  over all images at each of the same 100 thresholds with the same ``>``. ODS: the best
  F1 of those summed counts (the first, as ``numpy.argmax`` takes it; ``plots/
  display_curves.py`` reports it so); at that threshold the mean IoU of crack and
  background (I/U), global accuracy (G) and class-average accuracy (C), as the README's
  table gives them beside F. No OIS.
- ``omnicrack``: OmniCrack30k (github.com/ben-z-original/omnicrack30k @ ce2354d,
  ``src/omnicrack30k/evaluation.py``): the centreline IoU. Prediction and ground truth are
  thinned (``skimage.morphology.thin``) and each dilated by a disk of radius 4 px; a true
  centreline pixel is found when the dilated predicted centreline covers it, a predicted
  one is false when the dilated true centreline does not; clIoU = TP / (TP + FP + FN) over
  the pixels of all images together (scikit-learn's ``jaccard_score``, 0 when all are 0).

Where crackseg's input differs from the reference's, what is done is stated here:

- The maps. SCSegamba's and MixerCSeg's heads end without a sigmoid, so their ``test.py``
  divides logits by their maximum; these protocols divide the crack probability map, the
  map crackseg's models, ``predict --save-prob`` and exported models give. On maps those
  ``test.py`` scripts wrote (already divided by their maximum) the normalisation changes
  nothing, so their own outputs score exactly as their ``eval/evaluate.py`` scores them.
- 8-bit maps. A map whose values are all whole 8-bit levels (an 8-bit PNG: DeepSegmentor's
  own ``_fused.png``, ``predict --save-prob 8``) is taken at its levels by
  ``deepsegmentor``: running its truncating conversion again would lower levels 1-63 by
  one (float32 rounding).
- Ground truth. OmniCrack30k ships centreline annotations; crackseg thins the masks with
  the same ``thin`` the reference applies to predictions. The prediction is the mask
  ``predict`` writes, probability >= the operating threshold; the reference takes
  nnU-Net's argmax, probability > 0.5, which ``--threshold 0.5`` gives but for a pixel at
  exactly 0.5.
- 0 / 0. Where a reference would divide 0 by 0 and print NaN (recall with no crack pixel
  in any image, F1 where precision and recall are both 0, the background IoU of an image
  that is crack everywhere and predicted so), these protocols give 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_REFERENCES = {
    "scsegamba": "github.com/Karl1109/SCSegamba @ cc74c4606f03 (test.py, eval/evaluate.py; MixerCSeg's eval/evaluate.py is the same)",
    "deepsegmentor": "github.com/yhlleo/DeepSegmentor @ 57164e680801 (models/deepcrack_model.py, util/util.py, "
                     "eval/prf_metrics.py, eval/segment_metrics.py)",
    "omnicrack": "github.com/ben-z-original/omnicrack30k @ ce2354d2bb62 (src/omnicrack30k/evaluation.py, inference.py)",
}
GRID = np.arange(0.0, 1.0, 0.01)  # the references' 100 thresholds 0.00 .. 0.99: crack where level / 255 > t
CENTRELINE_TOLERANCE = 4  # px: the radius of the disk OmniCrack30k dilates centrelines by
TP, FP, FN, TN = range(4)
# (100, 256): whether 8-bit level L counts as crack at GRID[k], compared in float64 as the references compare.
_CRACK_AT = ((np.arange(256) / 255)[None, :] > GRID[:, None]).astype(np.int64)

_DEFINITIONS = {
    "scsegamba": {
        "maps": "each image's probability map divided by its maximum and stored as 8 bits: 255 * (p / max p) in float32, "
                "rounded to nearest, ties to even (OpenCV's imwrite of SCSegamba's test.py); an all-zero map stays 0",
        "thresholds": "100 thresholds t = 0.00, 0.01, .. 0.99 (numpy.arange(0, 1, 0.01)); a pixel is crack when level / 255 > t",
        "per-image F1": "precision 1 when nothing is predicted, recall 0 when nothing is true, F1 0 when both are 0: an image "
                        "without crack pixels scores 0 at every threshold",
        "ods": "the threshold whose mean of per-image F1 over images is highest (not pooled counts)",
        "ois": "each image's best F1 over the thresholds, averaged over images",
        "miou": "the threshold whose mean over images of (crack IoU + background IoU) / 2 is highest; an image with no "
                "predicted and no true crack pixel counts 0",
        "at_0": "precision, recall and F1 of the counts summed over images at t = 0.00 (every level above 0): what the "
                "reference prints as P, R and F1",
        "pr_curve": "precision and recall of the counts summed over images at each threshold",
    },
    "deepsegmentor": {
        "maps": "each probability map stored as DeepSegmentor writes it: ((p - 0.5) / 0.5 + 1) / 2 * 255 in float32, "
                "truncated to 8 bits; a map already in whole 8-bit levels is taken at its levels",
        "thresholds": "100 thresholds t = 0.00, 0.01, .. 0.99; a pixel is crack when level / 255 > t",
        "ods": "precision, recall and F1 of TP, FP, FN summed over all images, at the threshold with the best such F1 "
               "(the first if several): DeepCrack's P, R, F and bT",
        "miou": "at the ODS threshold, the mean of crack IoU and background IoU of the summed counts (DeepCrack's I/U)",
        "global_accuracy": "at the ODS threshold, correct pixels / all pixels (DeepCrack's G)",
        "class_accuracy": "at the ODS threshold, the mean of crack recall and background recall (DeepCrack's C)",
        "pr_curve": "precision and recall of the counts summed over images at each threshold",
    },
    "omnicrack": {
        "prediction": "the mask predict writes: probability >= the operating threshold (the reference takes an argmax, "
                      "probability > 0.5)",
        "centrelines": "prediction and ground truth thinned (skimage.morphology.thin), each dilated by a disk of radius 4 px",
        "cliou": "centreline IoU TP / (TP + FP + FN), counts summed over images: a true centreline pixel is found (TP) when "
                 "the dilated predicted centreline covers it, else missed (FN); a predicted one is false (FP) when the "
                 "dilated true centreline does not cover it",
        "per_image": "clIoU of each image alone (not in the reference); an image with no centreline pixel on either side scores 1",
    },
}


def scsegamba_levels(prob) -> np.ndarray:
    """(H, W) uint8: ``prob`` divided by its maximum, times 255 in float32, rounded (ties to even) and saturated."""
    prob = np.asarray(prob, np.float32)
    top = prob.max(initial=0.0)
    if not top > 0:  # the reference divides 0 by 0; OpenCV stores the NaNs as 0
        return np.zeros(prob.shape, np.uint8)
    return np.clip(np.rint(255 * (prob / top)), 0, 255).astype(np.uint8)


def deepsegmentor_levels(prob) -> np.ndarray:
    """(H, W) uint8 as DeepSegmentor writes its fused map; a map of whole 8-bit levels keeps them."""
    prob = np.asarray(prob, np.float32)
    levels = np.rint(prob.astype(np.float64) * 255)
    if np.array_equal(levels.astype(np.float32) / np.float32(255), prob):
        return levels.astype(np.uint8)
    fused = (prob - np.float32(0.5)) / np.float32(0.5)  # the network's visual, in [-1, 1]
    return ((fused + np.float32(1)) / np.float32(2) * np.float32(255)).astype(np.uint8)


def grid_counts(levels: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(100, 4) int64 TP, FP, FN, TN of one image's 8-bit ``levels`` at each threshold of GRID."""
    truth = np.asarray(truth, bool)
    crack = np.bincount(levels[truth], minlength=256)
    background = np.bincount(levels[~truth], minlength=256)
    tp, fp = _CRACK_AT @ crack, _CRACK_AT @ background
    return np.stack([tp, fp, crack.sum() - tp, background.sum() - fp], axis=1)


def centreline_counts(mask: np.ndarray, truth: np.ndarray, tolerance: int = CENTRELINE_TOLERANCE) -> np.ndarray:
    """(3,) int64 TP, FP, FN of centreline pixels: true ones covered by the dilated prediction, predicted ones not
    covered by the dilated truth, true ones not covered. The border adds nothing to a dilation."""
    from scipy import ndimage
    from skimage.morphology import thin

    true, pred = thin(np.asarray(truth, bool)), thin(np.asarray(mask, bool))
    yy, xx = np.mgrid[-tolerance : tolerance + 1, -tolerance : tolerance + 1]
    disk = yy**2 + xx**2 <= tolerance**2  # skimage.morphology.disk(tolerance)
    found = int((true & ndimage.binary_dilation(pred, disk)).sum())
    false = int((pred & ~ndimage.binary_dilation(true, disk)).sum())
    return np.array([found, false, int(true.sum()) - found], np.int64)


@dataclass(frozen=True)
class Protocol:
    """One protocol: what --help says of it; for a literature protocol, one image's counts, the figures summed from
    every image's (figures, per-image figures, precision-recall curve), the reference code it reproduces, each
    figure's definition and the per-image figures that put the worst images first. crackseg's own figures come from
    :mod:`crackseg.evaluation.metrics`."""

    summary: str
    counts: Callable[[np.ndarray, np.ndarray, float], np.ndarray] | None = None
    scores: Callable[[list], tuple[dict, list[dict], list[dict] | None]] | None = None
    reference: str | None = None
    definitions: dict[str, str] | None = None
    worst_first: tuple[str, ...] = ()


def image_counts(protocol: str, prob, truth, threshold: float) -> np.ndarray:
    """One image's counts under a literature ``protocol``: (100, 4) for scsegamba and deepsegmentor, (3,) for omnicrack."""
    counts = PROTOCOLS[protocol].counts if protocol in PROTOCOLS else None
    if counts is None:
        raise ValueError(f"no protocol {protocol!r}; one of {', '.join(name for name, p in PROTOCOLS.items() if p.counts)}")
    return counts(np.asarray(prob, np.float32), truth, threshold)


def _ratio(top, bottom) -> np.ndarray:
    """top / bottom, 0 where bottom is 0."""
    top, bottom = np.asarray(top, np.float64), np.asarray(bottom, np.float64)
    return np.divide(top, bottom, out=np.zeros(np.broadcast(top, bottom).shape), where=bottom != 0)


def _prf(tp, fp, fn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision (1 when nothing is predicted), recall (0 when nothing is true), F1 (0 when both are 0), as the references."""
    tp, fp, fn = (np.asarray(v, np.float64) for v in (tp, fp, fn))
    precision = np.where((tp == 0) & (fp == 0), 1.0, _ratio(tp, tp + fp))
    recall = _ratio(tp, tp + fn)
    f1 = _ratio(2 * precision * recall, precision + recall)
    return precision, recall, f1


def _curve(counts: np.ndarray) -> list[dict]:
    """Precision, recall, F1 of (100, 4) summed counts at each threshold (shown to 2 decimals; compared exactly)."""
    precision, recall, f1 = _prf(counts[:, TP], counts[:, FP], counts[:, FN])
    return [{"threshold": round(float(t), 2), "precision": float(p), "recall": float(r), "f1": float(f)}
            for t, p, r, f in zip(GRID, precision, recall, f1)]


def scsegamba_scores(per_image: list[np.ndarray]) -> tuple[dict, list[dict], list[dict]]:
    """(figures, one dict of figures per image, pooled precision-recall curve) from each image's (100, 4) counts."""
    counts = np.stack(per_image)  # (images, 100, 4)
    f1 = _prf(counts[..., TP], counts[..., FP], counts[..., FN])[2]
    union = counts[..., TP] + counts[..., FP] + counts[..., FN]
    both = (_ratio(counts[..., TP], union) + _ratio(counts[..., TN], counts[..., FN] + counts[..., FP] + counts[..., TN])) / 2
    miou_terms = np.where(union > 0, both, 0.0)
    # Means over images per threshold, each of one contiguous column, as the reference takes them.
    mean_f1 = np.array([np.mean(column) for column in np.ascontiguousarray(f1.T)])
    mean_miou = np.array([np.mean(column) for column in np.ascontiguousarray(miou_terms.T)])
    best = f1.max(axis=1)
    ods, miou = int(np.argmax(mean_f1)), int(np.argmax(mean_miou))
    curve = _curve(counts.sum(axis=0))
    figures = {
        "ods": {"f1": float(mean_f1[ods]), "threshold": round(float(GRID[ods]), 2)},
        "ois": {"f1": float(np.sum(best) / len(best))},
        "miou": {"miou": float(mean_miou[miou]), "threshold": round(float(GRID[miou]), 2)},
        "at_0": {key: curve[0][key] for key in ("threshold", "precision", "recall", "f1")},
    }
    rows = [{"f1": float(f1[i, ods]), "best_f1": float(best[i]), "miou": float(miou_terms[i, miou])} for i in range(len(counts))]
    return figures, rows, curve


def deepsegmentor_scores(per_image: list[np.ndarray]) -> tuple[dict, list[dict], list[dict]]:
    """(figures, one dict of figures per image, pooled precision-recall curve) from each image's (100, 4) counts."""
    counts = np.stack(per_image)
    pooled = counts.sum(axis=0)  # (100, 4)
    curve = _curve(pooled)
    k = int(np.argmax([row["f1"] for row in curve]))
    tp, fp, fn, tn = (int(v) for v in pooled[k])
    figures = {
        "ods": {key: curve[k][key] for key in ("f1", "threshold", "precision", "recall")},
        "miou": {"miou": float((_ratio(tn, tn + fn + fp) + _ratio(tp, tp + fp + fn)) / 2), "threshold": curve[k]["threshold"]},
        "global_accuracy": float(_ratio(tp + tn, tp + fp + fn + tn)),
        "class_accuracy": float((_ratio(tn, tn + fp) + _ratio(tp, tp + fn)) / 2),
    }
    precision, recall, f1 = _prf(counts[:, k, TP], counts[:, k, FP], counts[:, k, FN])
    rows = [{"precision": float(p), "recall": float(r), "f1": float(f)} for p, r, f in zip(precision, recall, f1)]
    return figures, rows, curve


def omnicrack_scores(per_image: list[np.ndarray]) -> tuple[dict, list[dict], None]:
    """(figures, one dict of figures per image, None: no curve) from each image's (3,) centreline counts."""
    counts = np.stack(per_image)
    tp, fp, fn = (int(v) for v in counts.sum(axis=0))
    figures = {"cliou": float(_ratio(tp, tp + fp + fn)), "centreline_pixels": {"tp": tp, "fp": fp, "fn": fn},
               "tolerance_px": CENTRELINE_TOLERANCE}
    rows = [{"cl_tp": int(a), "cl_fp": int(b), "cl_fn": int(c), "cliou": float(_ratio(a, a + b + c)) if a + b + c else 1.0}
            for a, b, c in counts]
    return figures, rows, None


PROTOCOLS = {
    "crackseg": Protocol("the figures listed above"),
    "scsegamba": Protocol(
        "SCSegamba / MixerCSeg: each map divided by its maximum, per-image F1 averaged for ODS, mIoU per image",
        lambda prob, truth, threshold: grid_counts(scsegamba_levels(prob), truth), scsegamba_scores,
        _REFERENCES["scsegamba"], _DEFINITIONS["scsegamba"], ("f1", "best_f1")),
    "deepsegmentor": Protocol(
        "DeepCrack: counts summed over images, I/U, G, C at the best of 100 thresholds",
        lambda prob, truth, threshold: grid_counts(deepsegmentor_levels(prob), truth), deepsegmentor_scores,
        _REFERENCES["deepsegmentor"], _DEFINITIONS["deepsegmentor"], ("f1", "recall")),
    "omnicrack": Protocol(
        "OmniCrack30k: centreline IoU within 4 px",
        lambda prob, truth, threshold: centreline_counts(prob >= threshold, truth), omnicrack_scores,
        _REFERENCES["omnicrack"], _DEFINITIONS["omnicrack"], ("cliou",)),
}
