from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from crackseg.evaluation.metrics import (
    BINS,
    THRESHOLDS,
    average_precision,
    background_iou,
    best_f1,
    counts_by_threshold,
    optimal_image_scale,
    scores_at,
    scores_from_counts,
    threshold_histograms,
)


def _hist(pred, truth, tolerance=0.0):
    return threshold_histograms(torch.tensor(pred, dtype=torch.float32), torch.tensor(truth, dtype=torch.bool), tolerance=tolerance)


def test_hand_computed_3x3():
    truth = [[0, 1, 0], [0, 1, 0], [0, 1, 0]]
    pred = [[0, 1, 1], [0, 0, 0], [0, 1, 0]]  # tp 2, fp 1, fn 1, tn 5
    scores = scores_at(_hist(pred, truth), 0.5)
    assert (scores.precision, scores.recall, scores.f1, scores.iou) == pytest.approx((2 / 3, 2 / 3, 2 / 3, 2 / 4))
    assert background_iou(_hist(pred, truth), 0.5) == pytest.approx(5 / 7)


def test_hand_computed_5x5_with_tolerance():
    truth = np.zeros((5, 5), int)
    truth[:, 2] = 1
    shifted = np.zeros((5, 5), int)
    shifted[:, 3] = 1  # one pixel beside the truth everywhere
    strict = scores_at(_hist(shifted, truth), 0.5)
    assert (strict.precision, strict.recall, strict.f1) == (0.0, 0.0, 0.0)
    relaxed = scores_at(_hist(shifted, truth, tolerance=1), 0.5)
    assert (relaxed.precision, relaxed.recall, relaxed.f1) == (1.0, 1.0, 1.0)
    assert scores_at(_hist(shifted, truth, tolerance=0.9), 0.5).f1 == 0.0
    half = shifted.copy()
    half[3:, 3] = 0  # 3 predicted pixels find 3 of 5 truth pixels within 1 px: (3, 2) is sqrt(2) from (2, 3)
    scores = scores_at(_hist(half, truth, tolerance=1), 0.5)
    assert scores.precision == 1.0 and scores.recall == pytest.approx(3 / 5)


def test_thresholds_sweep_a_probability_map():
    truth = np.zeros((5, 5), int)
    truth[2] = 1
    prob = np.full((5, 5), 0.1)
    prob[2] = [0.9, 0.9, 0.6, 0.6, 0.3]
    prob[0, 0] = 0.7
    hist = _hist(prob, truth)
    assert scores_at(hist, 0.8).recall == pytest.approx(2 / 5) and scores_at(hist, 0.8).precision == 1.0
    at_05 = scores_at(hist, 0.5)
    assert at_05.recall == pytest.approx(4 / 5) and at_05.precision == pytest.approx(4 / 5)
    assert scores_at(hist, 0.2).recall == 1.0 and scores_at(hist, 0.2).precision == pytest.approx(5 / 6)
    best = best_f1(hist)
    assert best.f1 == pytest.approx(2 * (5 / 6) / (1 + 5 / 6)) and 0.1 < best.threshold <= 0.3


def _brute_force(prob: np.ndarray, truth: np.ndarray, threshold: float, tolerance: float):
    """Plain loops, no distance transforms: (correct, false positive, found, truth pixels)."""
    height, width = truth.shape
    predicted = prob >= threshold
    truth_points = [(y, x) for y in range(height) for x in range(width) if truth[y, x]]
    predicted_points = [(y, x) for y in range(height) for x in range(width) if predicted[y, x]]

    def near(point, others):
        return any(math.hypot(point[0] - o[0], point[1] - o[1]) <= tolerance for o in others)

    correct = sum(near(p, truth_points) for p in predicted_points)
    found = sum(near(t, predicted_points) for t in truth_points)
    return correct, len(predicted_points) - correct, found, len(truth_points)


@pytest.mark.parametrize("tolerance", [0.0, 1.0, 1.5, 2.0])
def test_fast_counts_match_plain_loops_on_random_maps(tolerance):
    rng = np.random.default_rng(int(tolerance * 10))
    for _ in range(3):
        truth = rng.random((14, 17)) < 0.15
        prob = np.clip(truth * 0.4 + rng.random((14, 17)) * 0.6, 0, 0.999)
        counts = counts_by_threshold(_hist(prob, truth, tolerance))
        for k in (5, 23, 50, 71, 90):
            expected = _brute_force(prob, truth, THRESHOLDS[k].item(), tolerance)
            fast = (int(counts.correct[k]), int(counts.false_positive[k]), int(counts.found[k]), int(counts.truth[k]))
            assert fast == expected, (k, tolerance)


def test_batched_histograms_with_padding_equal_the_sum_over_images():
    rng = np.random.default_rng(1)
    probs = torch.tensor(rng.random((3, 1, 8, 9)), dtype=torch.float32)
    truth = torch.tensor(rng.random((3, 1, 8, 9)) < 0.2)
    valid = torch.ones_like(truth)
    valid[1, :, 5:] = False
    batched = threshold_histograms(probs, truth, valid)
    separate = sum(threshold_histograms(probs[i, 0][valid[i, 0]], truth[i, 0][valid[i, 0]]) for i in range(3))
    assert torch.equal(batched, separate)


def test_perfect_prediction_scores_one_everywhere():
    truth = np.zeros((9, 9), int)
    truth[4] = 1
    hist = _hist(truth.astype(float), truth)
    scores = scores_at(hist, 0.5)
    assert (scores.precision, scores.recall, scores.f1, scores.iou) == (1.0, 1.0, 1.0, 1.0)
    assert background_iou(hist, 0.5) == 1.0
    assert best_f1(hist).f1 == 1.0 and optimal_image_scale([hist]) == 1.0 and average_precision(hist) == pytest.approx(1.0)


def test_empty_prediction_on_a_crack_image_has_recall_zero_without_errors():
    truth = np.zeros((6, 6), int)
    truth[2, 1:5] = 1
    scores = scores_at(_hist(np.zeros((6, 6)), truth, tolerance=2), 0.5)
    assert scores.recall == 0.0 and scores.f1 == 0.0 and scores.precision == 0.0


def test_crack_free_images_never_give_nan():
    empty = np.zeros((6, 6), int)
    for pred in (np.zeros((6, 6)), np.eye(6)):
        hist = _hist(pred, empty, tolerance=1)
        values = [*vars(scores_at(hist, 0.5)).values(), background_iou(hist, 0.5), best_f1(hist).f1]
        assert not any(math.isnan(v) for v in values)
        assert average_precision(hist) is None  # no true crack pixel: no recall, no curve
    assert scores_at(_hist(np.zeros((6, 6)), empty), 0.5).f1 == 1.0
    assert scores_at(_hist(np.eye(6), empty), 0.5).f1 == 0.0
    assert scores_from_counts(0, 0, 0, 0).f1 == 1.0


def _realistic_maps(seed: int, count: int = 6, misplaced: bool = True):
    """Probability maps that follow thin true cracks loosely, with noise and (optionally) 1 px offsets."""
    rng = np.random.default_rng(seed)
    maps = []
    for _ in range(count):
        truth = np.zeros((40, 40), bool)
        truth[rng.integers(5, 35), 5:35] = True
        truth[5:30, rng.integers(5, 35)] = True
        prob = rng.random((40, 40)) * 0.5
        shift = rng.integers(-1, 2) if misplaced else 0
        prob[np.roll(truth, shift, axis=0)] += 0.3 + rng.random() * 0.2
        maps.append((np.clip(prob, 0, 0.999), truth))
    return maps


def test_tolerance_never_lowers_f1_and_ods_bounds_every_fixed_threshold():
    maps = _realistic_maps(3)
    previous = -1.0
    for tolerance in (0, 1, 1.5, 2, 3, 5):
        per_image = [_hist(p, t, tolerance) for p, t in maps]
        total = sum(per_image)
        f1 = scores_at(total, 0.5).f1
        assert f1 >= previous - 1e-12
        previous = f1
        ods = best_f1(total)
        assert all(ods.f1 >= scores_at(total, THRESHOLDS[k].item()).f1 for k in range(1, BINS))
        # OIS is a mean of per-image bests: never below the per-image mean at any shared threshold.
        ois = optimal_image_scale(per_image)
        assert all(ois >= np.mean([scores_at(h, THRESHOLDS[k].item()).f1 for h in per_image]) - 1e-12 for k in range(1, BINS, 7))


def test_ois_is_at_least_ods_when_images_behave_alike():
    for seed in range(3):
        per_image = [_hist(p, t, 2) for p, t in _realistic_maps(seed, misplaced=False)]
        assert optimal_image_scale(per_image) >= best_f1(sum(per_image)).f1


def test_a_best_threshold_beyond_the_old_grid_is_found_and_stored_at_full_resolution():
    """Crack pixels at 0.9975-0.999, background up to 0.996: a grid 0.01 apart stopped at 0.99,
    where some background still counts as crack; the logit grid separates them exactly."""
    rng = np.random.default_rng(0)
    truth = np.zeros((64, 64), bool)
    truth[30:34] = True
    prob = np.where(truth, rng.uniform(0.9975, 0.999, truth.shape), rng.uniform(0.0, 0.996, truth.shape)).astype(np.float32)
    assert (prob[~truth] >= 0.99).sum() > 10
    best = best_f1(_hist(prob, truth))
    assert best.f1 == 1.0 and prob[~truth].max() < best.threshold <= prob[truth].min()
    assert scores_at(_hist(prob, truth), best.threshold).f1 == 1.0  # a stored threshold scores as it was found
    assert ((prob >= best.threshold) == truth).all()  # and predict, comparing in float32, draws the same mask
    mirror = (1 - prob).astype(np.float32)  # the best threshold below 0.01
    low = best_f1(_hist(mirror, ~truth))
    assert low.f1 == 1.0 and mirror[truth].max() < low.threshold <= mirror[~truth].min() < 0.01
    assert THRESHOLDS[1] < 1e-4 and THRESHOLDS[BINS - 1] > 1 - 1e-4 and (np.diff(THRESHOLDS.numpy()) > 0).all()
