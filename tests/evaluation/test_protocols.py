"""Each literature protocol pinned by small cases computed by hand from its reference code's definitions."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from crackseg.evaluation.evaluate import evaluate_files
from crackseg.evaluation.options import Scoring
from crackseg.evaluation.protocols import (
    GRID,
    PROTOCOLS,
    centreline_counts,
    deepsegmentor_levels,
    deepsegmentor_scores,
    grid_counts,
    image_counts,
    omnicrack_scores,
    scsegamba_levels,
    scsegamba_scores,
)


def test_the_grid_is_the_references_hundred_thresholds_and_levels_on_it_are_not_crack():
    assert len(GRID) == 100 and GRID[0] == 0.0 and GRID[-1] == pytest.approx(0.99)
    # 51 / 255 is exactly GRID[20] (0.2): with the references' strict > it is crack up to 0.19, not at 0.20.
    assert 51 / 255 == GRID[20]
    counts = grid_counts(np.array([[51, 52]], np.uint8), np.array([[True, True]]))
    assert counts[19, 0] == 2 and counts[20, 0] == 1 and counts[21, 0] == 0  # 52 / 255 = 0.2039
    assert (counts[:, 2] == 2 - counts[:, 0]).all() and (counts[:, 1] == 0).all() and (counts[:, 3] == 0).all()
    # Level 0 is never crack, level 255 always (1.0 > 0.99).
    edges = grid_counts(np.array([[0, 255]], np.uint8), np.array([[False, True]]))
    assert (edges[:, 0] == 1).all() and (edges[:, 1] == 0).all()


def test_scsegamba_divides_each_map_by_its_maximum_and_rounds_ties_to_even():
    prob = np.array([[0.1, 0.2], [0.4, 0.0]], np.float32)
    # / 0.4 -> 0.25, 0.5, 1, 0; * 255 -> 63.75, 127.5 (a tie: to even, 128), 255, 0
    assert scsegamba_levels(prob).tolist() == [[64, 128], [255, 0]]
    never = np.array([[0.3, 0.15, 0.0]], np.float32)  # never reaches 0.5: its top pixel still becomes 255
    assert scsegamba_levels(never).tolist() == [[255, 128, 0]]
    assert scsegamba_levels(np.zeros((2, 3), np.float32)).tolist() == [[0, 0, 0]] * 2
    written = np.array([[255, 17, 0]], np.float32) / 255  # a map the reference already divided by its maximum
    assert scsegamba_levels(written).tolist() == [[255, 17, 0]]


def _scsegamba_case():
    # A: levels 255, 153 (0.6 = GRID[60]), 51 (0.2 = GRID[20]), 0; two crack pixels.
    a = image_counts("scsegamba", np.array([[1.0, 0.6, 0.2, 0.0]], np.float32), np.array([[1, 1, 0, 0]], bool), 0.5)
    # B: crack-free, never reaches 0.5: levels 255, 128 (0.502), 0, 0.
    b = image_counts("scsegamba", np.array([[0.3, 0.15, 0.0, 0.0]], np.float32), np.zeros((1, 4), bool), 0.5)
    return a, b


def test_scsegamba_ods_ois_miou_and_its_p_r_f1_by_hand():
    figures, rows, curve = scsegamba_scores(list(_scsegamba_case()))
    # Per-image F1 of A: 0.8 up to 0.19 (2 TP, 1 FP), 1 from 0.20 to 0.59, 2/3 from 0.60 (1 TP, 1 FN).
    # B has no crack pixel: F1 0 everywhere. Mean: 0.4, 0.5, 1/3 -> ODS 0.5 at its first threshold, 0.20.
    assert figures["ods"] == {"f1": pytest.approx(0.5), "threshold": 0.2}
    assert figures["ois"]["f1"] == pytest.approx((1.0 + 0.0) / 2)
    # (crack IoU + background IoU) / 2 of A: 7/12, then 1 from 0.20 to 0.59, then 7/12; of B: (0 + 2/4) / 2 = 0.25
    # while 128 counts (to 0.50), then (0 + 3/4) / 2 = 0.375. Mean over images: best 0.6875 from 0.51.
    assert figures["miou"] == {"miou": pytest.approx((1 + 0.375) / 2), "threshold": 0.51}
    # At 0.00, counts summed over images: TP 2, FP 1 + 2, FN 0 -> P 0.4, R 1, F1 4/7.
    assert figures["at_0"] == {"threshold": 0.0, "precision": pytest.approx(0.4), "recall": 1.0, "f1": pytest.approx(4 / 7)}
    assert rows[0] == {"f1": 1.0, "best_f1": 1.0, "miou": 1.0} and rows[1] == {"f1": 0.0, "best_f1": 0.0, "miou": 0.375}
    # The summed curve at 0.51: A's 2 TP, B's one FP left (level 255).
    assert len(curve) == 100 and curve[51] == {"threshold": 0.51, "precision": pytest.approx(2 / 3), "recall": 1.0, "f1": pytest.approx(0.8)}


def test_scsegamba_an_empty_truth_predicted_empty_scores_zero_not_one():
    empty = image_counts("scsegamba", np.zeros((3, 3), np.float32), np.zeros((3, 3), bool), 0.5)
    figures, rows, _ = scsegamba_scores([empty])
    assert figures["ods"]["f1"] == 0.0 and figures["ois"]["f1"] == 0.0 and figures["miou"]["miou"] == 0.0


def test_deepsegmentor_truncates_its_float32_conversion_and_keeps_whole_levels():
    # 254.745, 127.5, 0.765, 178.5 -> truncated, never rounded up.
    assert deepsegmentor_levels(np.array([[0.999, 0.5, 0.003, 0.7]], np.float32)).tolist() == [[254, 127, 0, 178]]
    # Its conversion of 1/255 alone truncates to 0 (float32); a map of whole 8-bit levels keeps them.
    assert deepsegmentor_levels(np.array([[1 / 255, 0.5004]], np.float32)).tolist() == [[0, 127]]
    levels = np.array([[1, 51, 52, 255, 0]], np.uint8)
    assert deepsegmentor_levels(levels.astype(np.float32) / 255.0).tolist() == levels.tolist()


def test_deepsegmentor_pools_counts_and_reports_i_u_g_c_at_the_best_threshold():
    a = image_counts("deepsegmentor", np.array([[255, 153, 51, 0, 0]], np.float32) / 255, np.array([[1, 1, 0, 0, 1]], bool), 0.5)
    b = image_counts("deepsegmentor", np.array([[128, 0, 0, 0]], np.float32) / 255, np.zeros((1, 4), bool), 0.5)
    figures, rows, curve = deepsegmentor_scores([a, b])
    # Summed: to 0.19 TP 2 FP 2 FN 1 (F 4/7); 0.20-0.50 TP 2 FP 1 FN 1 (2/3); 0.51-0.59 TP 2 FP 0 FN 1 (0.8); then 0.5.
    assert figures["ods"] == {"f1": pytest.approx(0.8), "threshold": 0.51, "precision": 1.0, "recall": pytest.approx(2 / 3)}
    # At 0.51: TN 6 -> I/U (6/7 + 2/3) / 2, G 8/9, C (6/6 + 2/3) / 2.
    assert figures["miou"] == {"miou": pytest.approx((6 / 7 + 2 / 3) / 2), "threshold": 0.51}
    assert figures["global_accuracy"] == pytest.approx(8 / 9) and figures["class_accuracy"] == pytest.approx(5 / 6)
    assert "ois" not in figures
    assert curve[19]["f1"] == pytest.approx(4 / 7) and curve[50]["f1"] == pytest.approx(2 / 3) and curve[60]["f1"] == pytest.approx(0.5)
    assert rows[1] == {"precision": 1.0, "recall": 0.0, "f1": 0.0}  # B at 0.51: nothing predicted, nothing true


def _line(shape, row, cols=slice(5, 25), width=1):
    mask = np.zeros(shape, bool)
    mask[row : row + width, cols] = True
    return mask


def test_omnicrack_centrelines_count_within_a_4_px_disk():
    truth = _line((30, 30), 10)
    assert centreline_counts(truth, truth).tolist() == [20, 0, 0]
    assert centreline_counts(_line((30, 30), 14), truth).tolist() == [20, 0, 0]  # 4 px away: covered
    assert centreline_counts(_line((30, 30), 15), truth).tolist() == [0, 20, 20]  # 5 px away: found nothing
    assert centreline_counts(_line((30, 30), 8, width=5), truth)[1:].tolist() == [0, 0]  # a wide prediction: its centreline
    assert centreline_counts(np.zeros((30, 30), bool), np.zeros((30, 30), bool)).tolist() == [0, 0, 0]


def test_omnicrack_pools_counts_over_images_and_predicts_at_the_operating_threshold():
    truth = _line((30, 30), 10)
    hit = image_counts("omnicrack", truth.astype(np.float32), truth, 0.5)
    miss = image_counts("omnicrack", _line((30, 30), 20).astype(np.float32), truth, 0.5)
    figures, rows, curve = omnicrack_scores([hit, miss])
    assert figures["cliou"] == pytest.approx(20 / (20 + 20 + 20)) and curve is None  # pooled, not the mean of 1 and 0
    assert figures["centreline_pixels"] == {"tp": 20, "fp": 20, "fn": 20} and figures["tolerance_px"] == 4
    assert [row["cliou"] for row in rows] == [1.0, 0.0]
    half = np.where(truth, 0.5, 0.0).astype(np.float32)  # the mask predict writes: probability >= threshold
    assert image_counts("omnicrack", half, truth, 0.5).tolist() == [20, 0, 0]
    assert image_counts("omnicrack", half, truth, 0.51).tolist() == [0, 0, 20]
    empty = image_counts("omnicrack", np.zeros((30, 30), np.float32), np.zeros((30, 30), bool), 0.5)
    assert omnicrack_scores([empty])[0]["cliou"] == 0.0 and omnicrack_scores([empty])[1][0]["cliou"] == 1.0


def _save(folder, arrays):
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():
        if array.dtype == bool:
            Image.fromarray(array.astype(np.uint8) * 255).save(folder / f"{stem}.png")
        else:
            Image.fromarray(array.astype(np.float32), mode="F").save(folder / f"{stem}.tif")


def test_the_same_maps_score_differently_under_each_protocol(tmp_path):
    """An image that never reaches 0.5 is found by scsegamba's normalisation, by no threshold of crackseg's at 0.5."""
    truth = {"a": _line((16, 16), 8, slice(2, 14)), "b": _line((16, 16), 4, slice(2, 14))}
    prob = {"a": np.where(truth["a"], 0.9, 0.1), "b": np.where(truth["b"], 0.4, 0.1)}  # b never reaches 0.5
    _save(tmp_path / "gt", truth)
    _save(tmp_path / "prob", prob)
    reports = {name: evaluate_files(tmp_path / "prob", tmp_path / "gt", scoring=Scoring(name)) for name in PROTOCOLS}
    assert reports["crackseg"]["dataset"]["recall"] == pytest.approx(0.5)  # b's crack is missed at 0.5
    assert reports["scsegamba"]["ods"]["f1"] == 1.0 and reports["scsegamba"]["ois"]["f1"] == 1.0  # b stretched to 1.0
    assert reports["deepsegmentor"]["ods"]["f1"] == 1.0  # one threshold below 0.4 separates both
    assert reports["omnicrack"]["cliou"] == pytest.approx(0.5)  # b predicts nothing at 0.5
    for name, report in reports.items():
        assert report["protocol"] == name and report["images"] == 2 and report["definitions"]
    assert {"reference", "ods", "ois", "miou", "at_0"} <= reports["scsegamba"].keys()
    assert {"reference", "ods", "miou", "global_accuracy", "class_accuracy"} <= reports["deepsegmentor"].keys()
    assert {"reference", "cliou", "threshold"} <= reports["omnicrack"].keys() and "ods" not in reports["omnicrack"]
