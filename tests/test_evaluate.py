from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from crackseg.checkpoint import save_model
from crackseg.cli import main
from crackseg.errors import InputError
from crackseg.evaluate import evaluate_checkpoint, evaluate_files
from crackseg.models import build_model


def _masks(folder, arrays: dict[str, np.ndarray], bits: int = 8):
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():
        if bits == 16:
            Image.fromarray((array * 65535).round().astype(np.uint16)).save(folder / f"{stem}.png")
        else:
            Image.fromarray((array * 255).round().astype(np.uint8)).save(folder / f"{stem}.png")


def _truth():
    a = np.zeros((20, 30))
    a[10, 3:27] = 1
    b = np.zeros((20, 30))
    b[2:18, 7] = 1
    return {"a": a, "b": b, "empty": np.zeros((20, 30))}


def test_perfect_masks_score_one_and_report_files_are_written(tmp_path):
    truth = _truth()
    _masks(tmp_path / "gt", truth)
    _masks(tmp_path / "pred", truth)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    assert report["images"] == 3
    for value in [*report["dataset"].values(), *report["per_image_mean"].values(), report["ods"]["f1"], report["ois"]["f1"], report["ap"]]:
        assert value == pytest.approx(1.0)
    assert main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--out", str(tmp_path / "r")]) == 0
    for name in ("report.json", "report.md", "per_image.csv", "pr_curve.csv", "pr_curve.png"):
        assert (tmp_path / "r" / name).exists()
    assert "Definitions" in (tmp_path / "r" / "report.md").read_text()


def test_cli_report_matches_the_api_and_lists_worst_first(tmp_path):
    truth = _truth()
    rng = np.random.default_rng(0)
    probs = {stem: np.clip(0.6 * t + 0.5 * rng.random(t.shape), 0, 1) for stem, t in truth.items()}
    probs["b"] = np.roll(probs["b"], 2, axis=1)  # misplaced: the worst image
    _masks(tmp_path / "gt", truth)
    _masks(tmp_path / "pred", probs, bits=16)
    (tmp_path / "split.txt").write_text("a\nb\n")
    api = evaluate_files(tmp_path / "pred", tmp_path / "gt", tmp_path / "split.txt", tolerance=1.0, threshold=0.6)
    code = main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--split", str(tmp_path / "split.txt"),
                 "--tolerance", "1", "--threshold", "0.6", "--out", str(tmp_path / "r")])
    assert code == 0
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert saved["dataset"] == pytest.approx(api["dataset"]) and saved["ods"] == pytest.approx(api["ods"])
    assert saved["ap"] == pytest.approx(api["ap"]) and saved["images"] == 2
    with open(tmp_path / "r" / "per_image.csv") as file:
        rows = list(csv.DictReader(file))
    assert rows[0]["image"] == "b" and float(rows[0]["f1"]) <= float(rows[1]["f1"])
    assert saved["worst_images"][0] == "b"


def test_tolerance_helps_a_one_pixel_offset(tmp_path):
    truth = _truth()
    _masks(tmp_path / "gt", truth)
    _masks(tmp_path / "pred", {stem: np.roll(t, 1, axis=0) for stem, t in truth.items()})
    strict = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    relaxed = evaluate_files(tmp_path / "pred", tmp_path / "gt", tolerance=2)
    assert relaxed["dataset"]["f1"] > 0.9 > 0.7 > strict["dataset"]["f1"]
    assert relaxed["dataset"]["iou_crack"] == strict["dataset"]["iou_crack"]  # IoU is always strict
    assert not any(math.isnan(v) for v in strict["dataset"].values())


def test_missing_predictions_and_size_mismatches_are_errors(tmp_path):
    truth = _truth()
    _masks(tmp_path / "gt", truth)
    _masks(tmp_path / "pred", {"a": truth["a"], "b": truth["b"]})
    with pytest.raises(InputError, match="1 ground-truth masks have no prediction"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")
    _masks(tmp_path / "pred", {"empty": np.zeros((10, 10))})
    with pytest.raises(InputError, match="empty.png: prediction is"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")


def test_existing_report_is_not_overwritten(tmp_path, capsys):
    truth = _truth()
    _masks(tmp_path / "gt", truth)
    args = ["evaluate", "--pred", str(tmp_path / "gt"), "--gt", str(tmp_path / "gt"), "--out", str(tmp_path / "r")]
    assert main(args) == 0
    with pytest.raises(SystemExit) as exit:
        main(args)
    assert exit.value.code == 2 and "already exists" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0


def test_checkpoint_mode_predicts_the_split_and_scores_it(synth_root, tmp_path):
    torch.manual_seed(0)
    model = build_model("mobilenet_v2")
    model.threshold = 0.42
    save_model(model, tmp_path / "m.pt")
    import shutil

    shutil.copytree(synth_root, tmp_path / "data")
    (tmp_path / "data" / "test.txt").write_text("00001\n00004\n00007\n")
    report = evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "test", tolerance=2, device="cpu")
    assert report["images"] == 3 and report["threshold"] == pytest.approx(0.42, abs=0.005)  # the grid point scored, nearest 0.42
    assert {row["image"] for row in report["per_image"]} == {"00001", "00004", "00007"}
    assert evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "all", device="cpu")["images"] == 12
    with pytest.raises(InputError, match="no val.txt"):
        evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "val", device="cpu")


def test_zero_one_ground_truth_scores_like_zero_255(tmp_path):
    truth = _truth()
    _masks(tmp_path / "pred", truth)
    (tmp_path / "gt01").mkdir()
    for stem, array in truth.items():
        Image.fromarray(array.astype(np.uint8)).save(tmp_path / "gt01" / f"{stem}.png")  # values 0 and 1
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt01")
    assert report["dataset"]["f1"] == pytest.approx(1.0) and report["dataset"]["iou_crack"] == pytest.approx(1.0)


def test_duplicate_stems_empty_folders_and_bad_split_files_are_refused(tmp_path):
    truth = _truth()
    _masks(tmp_path / "gt", truth)
    _masks(tmp_path / "pred", truth)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no ground-truth masks"):
        evaluate_files(tmp_path / "pred", tmp_path / "empty")
    (tmp_path / "blank.txt").write_text("\n")
    with pytest.raises(InputError, match="blank.txt: lists no stems"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt", tmp_path / "blank.txt")
    (tmp_path / "twice.txt").write_text("a\nb\na\n")
    with pytest.raises(InputError, match="twice.txt: lists 'a' more than once"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt", tmp_path / "twice.txt")
    Image.fromarray((truth["a"] * 255).astype(np.uint8)).save(tmp_path / "gt" / "a.bmp")
    with pytest.raises(InputError, match=r"a.bmp: shares its stem with a.png"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")


def test_tiles_smaller_than_the_default_overlap_work_with_evaluates_own_overlap(synth_root, tmp_path, capsys):
    torch.manual_seed(0)
    save_model(build_model("mobilenet_v2"), tmp_path / "m.pt")
    args = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--data", str(synth_root), "--split", "all", "--device", "cpu",
            "--tile", "32"]
    with pytest.raises(SystemExit) as exit:
        main(args)
    assert exit.value.code == 2 and "--overlap (128 px) must be smaller than --tile (32 px)" in capsys.readouterr().err
    assert main([*args, "--overlap", "8"]) == 0
