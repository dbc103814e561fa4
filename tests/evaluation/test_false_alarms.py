from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
from conftest import csv_rows, predict_cli, save_maps
from PIL import Image

from crackseg.cli.main import main
from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError
from crackseg.data.images import load_mask, read_probability
from crackseg.evaluation.evaluate import evaluate_checkpoint, evaluate_files
from crackseg.evaluation.options import Scoring
from crackseg.evaluation.scoring import build_report, score_one
from crackseg.evaluation.metrics import counts_by_threshold, threshold_histograms, threshold_index




def _alarm_case(tmp_path):
    """Three photos, 32 px tiles, alarms counted beyond 10 px:

    - crack (80 x 100): a true crack along row 28, columns 10-89 (in tile row 0, tile columns 0-2: 9 of its 12 tiles
      crack-free). Predicted: 10 px 3 px below it (near, in a cracked tile); 10 px 30 px below it (far, tile (1, 0));
      one pixel exactly 10 px below it (near, in crack-free tile (1, 1)); one pixel 10 px below and 8 px beyond its end,
      12.8 px away (far, although 10 px away along rows and along columns; in the partial crack-free tile (1, 3)).
    - free (40 x 50): no crack; 10 predicted pixels in tile (0, 0) of its 4 tiles, all far.
    - clean (80 x 100): the crack of ``crack``, predicted exactly.
    """
    truth = {"crack": np.zeros((80, 100)), "free": np.zeros((40, 50)), "clean": np.zeros((80, 100))}
    truth["crack"][28, 10:90] = 1
    truth["clean"][28, 10:90] = 1
    pred = {name: np.zeros(array.shape) for name, array in truth.items()}
    pred["crack"][31, 20:30] = 1
    pred["crack"][58, 20:30] = 1
    pred["crack"][38, 50] = 1
    pred["crack"][38, 97] = 1
    pred["free"][5, 0:10] = 1
    pred["clean"][28, 10:90] = 1
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", pred)


def test_far_alarms_and_crack_free_tiles_are_counted_exactly(tmp_path):
    _alarm_case(tmp_path)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_distance=10, alarm_tile=32))
    block = report["false_alarms"]
    assert block["far_pixels"] == 11 + 10 + 0
    scored = 80 * 100 + 40 * 50 + 80 * 100
    assert block["far_pixels_per_mp"] == pytest.approx(1e6 * 21 / scored)  # 1166.7: counts summed, then divided
    assert block["far_pixels_per_mp"] != pytest.approx(1e6 * np.mean([11 / 8000, 10 / 2000, 0 / 8000]))  # not a mean of images
    assert (block["crack_free_tiles"], block["crack_free_tiles_with_alarm"], block["crack_free_tiles_with_far_alarm"]) == (9 + 4 + 9, 3 + 1, 2 + 1)
    assert block["share"] == pytest.approx(4 / 22) and block["far_share"] == pytest.approx(3 / 22)
    assert (block["distance_px"], block["tile_px"], block["threshold"]) == (10, 32, 0.5)
    assert {row["image"]: row["far_alarm_pixels"] for row in report["per_image"]} == {"crack": 11, "free": 10, "clean": 0}
    assert "false_alarms" in report["definitions"]
    # Beyond 12 px the 12.8 px pixel alone is far; beyond 2 px so are the 10 px pieces and the pixel 10 px off.
    assert evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_distance=12))["false_alarms"]["far_pixels"] == 21
    assert evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_distance=13))["false_alarms"]["far_pixels"] == 20
    assert evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_distance=2))["false_alarms"]["far_pixels"] == 32
    whole = evaluate_files(tmp_path / "pred", tmp_path / "gt")["false_alarms"]  # default: 10 px, 256 px tiles: one tile each
    assert (whole["crack_free_tiles"], whole["crack_free_tiles_with_alarm"], whole["tile_px"], whole["distance_px"]) == (1, 1, 256, 10.0)


def test_counts_add_up_over_images(tmp_path):
    _alarm_case(tmp_path)
    scoring = Scoring(alarm_tile=32)
    blocks = {}
    for stems in (["crack"], ["free", "clean"], ["crack", "free", "clean"]):
        (tmp_path / "split.txt").write_text("\n".join(stems) + "\n")
        blocks[len(stems)] = evaluate_files(tmp_path / "pred", tmp_path / "gt", tmp_path / "split.txt", scoring=scoring)["false_alarms"]
    for key in ("far_pixels", "crack_free_tiles", "crack_free_tiles_with_alarm", "crack_free_tiles_with_far_alarm"):
        assert blocks[1][key] + blocks[2][key] == blocks[3][key]


def test_at_the_tolerance_far_alarms_are_the_false_positives_of_precision(tmp_path):
    """The same rule and the same (grid) threshold as the histograms: beyond T px of the truth is a false positive at tolerance T."""
    truth = {"a": np.zeros((50, 70)), "b": np.zeros((50, 70))}
    truth["a"][25, 5:65] = 1
    truth["b"][5:45, 30:33] = 1
    rng = np.random.default_rng(1)
    probs = {stem: np.clip(0.55 * t + 0.55 * rng.random(t.shape), 0, 1) for stem, t in truth.items()}
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", probs, bits=16)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt", tolerance=2, threshold=0.523, scoring=Scoring(alarm_distance=2))
    histograms = sum(threshold_histograms(read_probability(tmp_path / "pred" / f"{stem}.png"),
                                          load_mask(tmp_path / "gt" / f"{stem}.png")[0].bool(), tolerance=2) for stem in truth)
    false_positives = int(counts_by_threshold(histograms).false_positive[threshold_index(0.523)])
    assert report["false_alarms"]["far_pixels"] == false_positives > 0
    assert report["false_alarms"]["threshold"] == report["threshold"] != 0.523  # the grid point the other figures use


def test_the_new_figures_only_add_to_the_report(tmp_path):
    _alarm_case(tmp_path)
    scoring = Scoring(alarm_tile=32)
    results = []
    for stem in ("clean", "crack", "free"):
        prob = read_probability(tmp_path / "pred" / f"{stem}.png")
        results.append(score_one(stem, prob, load_mask(tmp_path / "gt" / f"{stem}.png")[0].bool(), 0.0, 0.5, scoring))
    report = build_report(results, 0.0, 0.5, scoring)
    without = build_report([dataclasses.replace(r, far_alarms=None) for r in results], 0.0, 0.5, scoring)
    assert "false_alarms" not in without
    stripped = {key: value for key, value in report.items() if key != "false_alarms"}
    stripped["definitions"] = {key: text for key, text in report["definitions"].items() if key != "false_alarms"}
    stripped["per_image"] = [{key: value for key, value in row.items() if key != "far_alarm_pixels"} for row in report["per_image"]]
    assert stripped == without and list(stripped) == list(without)
    assert list(report).index("false_alarms") == list(report).index("crack_free") + 1


def test_false_alarms_reach_the_report_files_and_the_printed_summary(tmp_path, capsys):
    _alarm_case(tmp_path)
    args = ["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--alarm-distance", "10", "--alarm-tile", "32"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert "false alarms > 10 px from any crack: 1166.7 pixels per megapixel; 32 px tiles without a crack: 22, 18.2% with a " \
           "predicted crack pixel (13.6% with a far one)" in printed
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert saved["false_alarms"]["far_pixels"] == 21 and saved["false_alarms"]["tile_px"] == 32
    assert saved["crack_free"]["images"] == 1  # the crack-free figures stay beside the new ones
    rows = csv_rows(tmp_path / "r" / "per_image.csv")
    assert list(rows[0])[-1] == "far_alarm_pixels"  # the new column comes last
    assert {row["image"]: row["far_alarm_pixels"] for row in rows} == {"crack": "11", "free": "10", "clean": "0"}
    assert "**false_alarms**: far alarm pixels: predicted crack pixels" in (tmp_path / "r" / "report.md").read_text()
    for flag, value in (("--alarm-tile", "0"), ("--alarm-distance", "-1")):
        with pytest.raises(SystemExit) as exit:
            main([*args, flag, value])
        assert exit.value.code == 2 and flag in capsys.readouterr().err
    with pytest.raises(InputError, match="--alarm-tile"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_tile=0))


def test_protocols_with_an_operating_threshold_report_false_alarms(tmp_path):
    _alarm_case(tmp_path)
    crackseg = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_tile=32))["false_alarms"]
    omnicrack = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring("omnicrack", alarm_tile=32))
    assert omnicrack["false_alarms"] == crackseg  # a 0/1 mask is the same mask at either threshold
    for protocol in ("scsegamba", "deepsegmentor"):  # no operating threshold: their figures come from a sweep
        report = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(protocol))
        assert "false_alarms" not in report and "far_alarm_pixels" not in report["per_image"][0]


def test_checkpoint_and_saved_masks_give_the_same_false_alarms(synth_root, dark_checkpoint, tmp_path):
    """dark_pixel_model predicts every photo in evaluate, and predict's masks of it are scored as files."""
    shutil.copytree(synth_root, tmp_path / "data")
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(tmp_path / "data" / "masks" / "00003.png")  # a crack-free photo
    scoring = Scoring(alarm_distance=4, alarm_tile=16)
    direct = evaluate_checkpoint(dark_checkpoint, tmp_path / "data", "all", inference=InferenceOptions(device="cpu"), scoring=scoring)
    assert predict_cli("--checkpoint", dark_checkpoint, tmp_path / "data" / "images", "--out", tmp_path / "pred") == 0
    saved = evaluate_files(tmp_path / "pred" / "masks", tmp_path / "data" / "masks", scoring=scoring)
    assert direct["false_alarms"] == saved["false_alarms"]
    assert direct["false_alarms"]["far_pixels"] > 0 and direct["false_alarms"]["crack_free_tiles"] > 0
    assert {r["image"]: r["far_alarm_pixels"] for r in direct["per_image"]} == {r["image"]: r["far_alarm_pixels"] for r in saved["per_image"]}
    code = main(["evaluate", "--checkpoint", str(dark_checkpoint), "--data", str(tmp_path / "data"), "--split", "all", "--device", "cpu",
                 "--alarm-distance", "4", "--alarm-tile", "16", "--out", str(tmp_path / "r")])
    assert code == 0 and json.loads((tmp_path / "r" / "report.json").read_text())["false_alarms"] == direct["false_alarms"]


def test_an_image_without_crack_is_all_far(tmp_path):
    save_maps(tmp_path / "gt", {"a": np.zeros((10, 10))})
    pred = np.zeros((10, 10))
    pred[0, :] = pred[9, :] = 1
    save_maps(tmp_path / "pred", {"a": pred})
    block = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(alarm_tile=3))["false_alarms"]
    assert block["far_pixels"] == 20 and block["far_pixels_per_mp"] == pytest.approx(2e5)
    assert (block["crack_free_tiles"], block["crack_free_tiles_with_alarm"]) == (16, 8)  # 4 x 4 tiles, the last ones 1 px wide
