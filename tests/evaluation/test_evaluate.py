from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from conftest import save_maps
from PIL import Image

from crackseg.model.checkpoint import save_model
from crackseg.cli.main import main
from crackseg.model.options import InferenceOptions
from crackseg.core.errors import InputError
from crackseg.evaluation.evaluate import evaluate_checkpoint, evaluate_files
from crackseg.evaluation.options import Scoring
from crackseg.model.networks import build_model




def _truth():
    a = np.zeros((20, 30))
    a[10, 3:27] = 1
    b = np.zeros((20, 30))
    b[2:18, 7] = 1
    return {"a": a, "b": b, "empty": np.zeros((20, 30))}


def test_perfect_masks_score_one_and_report_files_are_written(tmp_path):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", truth)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    assert report["images"] == 3
    for value in [*report["dataset"].values(), *report["per_image_mean"].values(), report["ods"]["f1"], report["ois"]["f1"], report["ap"]]:
        assert value == pytest.approx(1.0)
    assert main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--out", str(tmp_path / "r")]) == 0
    for name in ("report.json", "report.md", "per_image.csv", "pr_curve.csv", "pr_curve.png"):
        assert (tmp_path / "r" / name).exists()
    assert "Definitions" in (tmp_path / "r" / "report.md").read_text()


def test_a_crack_free_test_set_has_no_ap_nor_ois_rather_than_figures_every_model_gets(tmp_path, capsys):
    """Without a true crack pixel recall is undefined: a perfect prediction's curve has no area either."""
    empty = {stem: np.zeros((20, 30)) for stem in ("a", "b")}
    save_maps(tmp_path / "gt", empty)
    save_maps(tmp_path / "pred", empty)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    assert report["ap"] is None and report["ois"]["f1"] is None and report["ods"]["f1"] == pytest.approx(1.0)
    assert main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--out", str(tmp_path / "r")]) == 0
    printed = capsys.readouterr().out
    assert "AP n/a (no true crack pixel)" in printed and "OIS F1 n/a (no true crack pixel)" in printed
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert saved["ap"] is None and saved["ois"]["f1"] is None and (tmp_path / "r" / "pr_curve.png").exists()


def test_ois_averages_the_photos_with_cracks_alone(tmp_path):
    """A crack-free photo's best F1 is 1 at any threshold above its largest probability, whatever false cracks it
    gets below: counted, it raised OIS with every crack-free photo added."""
    truth = {"crack": np.zeros((20, 30)), "free": np.zeros((20, 30))}
    truth["crack"][10, 2:28] = 1
    pred = {"crack": np.zeros((20, 30)), "free": np.zeros((20, 30))}
    pred["crack"][10, 2:15] = 0.9  # half the crack found: best F1 2/3
    pred["free"][5:9, :] = 0.9  # a bar of false crack
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", pred, bits=16)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    rows = {row["image"]: row for row in report["per_image"]}
    assert report["ois"]["f1"] == pytest.approx(rows["crack"]["best_f1"]) == pytest.approx(2 / 3, abs=1e-6)


def test_cli_report_matches_the_api_and_lists_worst_first(tmp_path):
    truth = _truth()
    rng = np.random.default_rng(0)
    probs = {stem: np.clip(0.6 * t + 0.5 * rng.random(t.shape), 0, 1) for stem, t in truth.items()}
    probs["b"] = np.roll(probs["b"], 2, axis=1)  # misplaced: the worst image
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", probs, bits=16)
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
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", {stem: np.roll(t, 1, axis=0) for stem, t in truth.items()})
    strict = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    relaxed = evaluate_files(tmp_path / "pred", tmp_path / "gt", tolerance=2)
    assert relaxed["dataset"]["f1"] > 0.9 > 0.7 > strict["dataset"]["f1"]
    assert relaxed["dataset"]["iou_crack"] == strict["dataset"]["iou_crack"]  # IoU is always strict
    assert not any(math.isnan(v) for v in strict["dataset"].values())


def test_missing_predictions_and_size_mismatches_are_errors(tmp_path):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", {"a": truth["a"], "b": truth["b"]})
    with pytest.raises(InputError, match="1 ground-truth masks have no prediction"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")
    save_maps(tmp_path / "pred", {"empty": np.zeros((10, 10))})
    with pytest.raises(InputError, match="empty.png: prediction is"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")


@pytest.mark.parametrize("folder", ["gt", "pred"])
def test_a_mask_in_a_format_crackseg_does_not_read_is_named_not_passed_over(tmp_path, folder):
    """A ground-truth mask saved as GIF would leave its image out of the scores without a word."""
    save_maps(tmp_path / "gt", _truth())
    save_maps(tmp_path / "pred", _truth())
    first = sorted((tmp_path / folder).iterdir())[0]
    Image.open(first).save(first.with_suffix(".gif"))
    first.unlink()
    with pytest.raises(InputError, match=rf"^{first.with_suffix('.gif')}: a .gif file, a format crackseg does not read"):
        evaluate_files(tmp_path / "pred", tmp_path / "gt")


def test_pred_and_gt_that_are_no_folders_are_named(tmp_path):
    save_maps(tmp_path / "gt", _truth())
    (tmp_path / "model.pt").write_bytes(b"a file")
    with pytest.raises(InputError, match=r"^--pred .*nowhere: no such folder \(a folder of masks\)$"):
        evaluate_files(tmp_path / "nowhere", tmp_path / "gt")
    with pytest.raises(InputError, match=r"^--pred .*model.pt: not a folder"):
        evaluate_files(tmp_path / "model.pt", tmp_path / "gt")
    with pytest.raises(InputError, match=r"^--gt .*model.pt: not a folder"):
        evaluate_files(tmp_path / "gt", tmp_path / "model.pt")


def test_inference_flags_without_a_checkpoint_are_refused_not_ignored(tmp_path, capsys):
    save_maps(tmp_path / "gt", _truth())
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--pred", str(tmp_path / "gt"), "--gt", str(tmp_path / "gt"), "--tta", "flip", "--device", "cpu"])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and "--tta, --device: how --checkpoint predicts" in err, err


@pytest.mark.parametrize("inside", ["gt", "gt/sub", "pred", "data/masks", "data/images"])
def test_an_out_among_the_inputs_is_refused_before_writing(tmp_path, capsys, inside):
    """The report's pr_curve.png among the masks would break the dataset: a mask without an image."""
    save_maps(tmp_path / "gt", _truth())
    save_maps(tmp_path / "pred", _truth())
    flags = ["--checkpoint", str(tmp_path / "model.pt"), "--data", str(tmp_path / "data")] if inside.startswith("data") else \
        ["--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt")]
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", *flags, "--out", str(tmp_path / inside)])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and f"--out {tmp_path / inside}: is --" in err, err
    assert sorted(tmp_path.rglob("*")) == before


def test_existing_report_is_not_overwritten(tmp_path, capsys):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
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
    report = evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "test", tolerance=2, inference=InferenceOptions(device="cpu"))
    assert report["images"] == 3 and report["threshold"] == pytest.approx(0.42, abs=0.005)  # the grid point scored, nearest 0.42
    assert {row["image"] for row in report["per_image"]} == {"00001", "00004", "00007"}
    assert evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "all", inference=InferenceOptions(device="cpu"))["images"] == 12
    with pytest.raises(InputError, match="no val.txt"):
        evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "val", inference=InferenceOptions(device="cpu"))


@pytest.mark.parametrize("threshold", ["0.99999", "1"])
def test_masks_at_the_highest_thresholds_still_mark_their_cracks(tmp_path, threshold):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", truth)
    assert main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--threshold", threshold,
                 "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["dataset"]["f1"] == 1.0 and report["threshold"] > 0.9999


def test_zero_one_ground_truth_scores_like_zero_255(tmp_path):
    truth = _truth()
    save_maps(tmp_path / "pred", truth)
    (tmp_path / "gt01").mkdir()
    for stem, array in truth.items():
        Image.fromarray(array.astype(np.uint8)).save(tmp_path / "gt01" / f"{stem}.png")  # values 0 and 1
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt01")
    assert report["dataset"]["f1"] == pytest.approx(1.0) and report["dataset"]["iou_crack"] == pytest.approx(1.0)


def test_a_zero_one_mask_saved_as_jpeg_is_refused_not_read_as_crack_free(tmp_path, capsys):
    truth = {"a": np.zeros((64, 64))}
    truth["a"][30:34, 5:60] = truth["a"][10:50, 20:22] = 1
    save_maps(tmp_path / "pred", truth)
    (tmp_path / "gt").mkdir()
    Image.fromarray(truth["a"].astype(np.uint8)).save(tmp_path / "gt" / "a.jpg", quality=95)  # 0/1 and JPEG noise
    assert np.asarray(Image.open(tmp_path / "gt" / "a.jpg")).max() > 1
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt")])
    error = capsys.readouterr().err
    assert exit.value.code == 2
    assert error.count("\n") == 1 and "a.jpg" in error and "brightest level is" in error


def test_duplicate_stems_empty_folders_and_bad_split_files_are_refused(tmp_path):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", truth)
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


def test_probability_maps_in_float_16_and_8_bits_score_alike(tmp_path):
    truth = _truth()["a"]
    save_maps(tmp_path / "gt", {"a": truth})
    prob = np.where(truth > 0, 0.875, 0.125).astype(np.float32)  # exact in 8 and 16 bits too
    (tmp_path / "float").mkdir()
    Image.fromarray(prob).save(tmp_path / "float" / "a.tif")  # mode F, as many tools write probabilities
    save_maps(tmp_path / "p16", {"a": prob}, bits=16)
    save_maps(tmp_path / "p8", {"a": prob})
    reports = [evaluate_files(tmp_path / kind, tmp_path / "gt") for kind in ("float", "p16", "p8")]
    assert reports[0]["dataset"]["f1"] == 1.0
    assert all(report["dataset"] == reports[0]["dataset"] and report["ods"]["f1"] == 1.0 for report in reports)


def test_colour_ground_truth_and_floats_outside_zero_one_are_refused_naming_them(tmp_path, capsys):
    truth = _truth()["a"]
    save_maps(tmp_path / "pred", {"a": truth})
    (tmp_path / "gt").mkdir()
    colour = np.zeros((*truth.shape, 3), np.uint8)
    colour[truth > 0] = (0, 200, 0)  # a crack drawn green, whose grey level (117) is below 128
    Image.fromarray(colour).save(tmp_path / "gt" / "a.png")
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt")])
    error = capsys.readouterr().err
    assert exit.value.code == 2
    assert error.count("\n") == 1 and "a.png" in error and "rgb(0, 200, 0)" in error
    save_maps(tmp_path / "gt", {"a": truth})
    (tmp_path / "pred" / "a.png").unlink()
    Image.fromarray((truth * 255).astype(np.float32)).save(tmp_path / "pred" / "a.tif")  # 0..255 floats: not probabilities
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt")])
    error = capsys.readouterr().err
    assert exit.value.code == 2
    assert error.count("\n") == 1 and "a.tif" in error and "[0, 1]" in error


def _crack_free_case(tmp_path):
    """One photo with a crack, three crack-free: a 30 px false crack plus a 3 px speck; a 5 px speck; two 7 px
    pieces 3 px apart on one line (one 17 px crack when joined, two specks apart)."""
    shape = (40, 60)
    truth = {name: np.zeros(shape) for name in ("crack", "free1", "free2", "free3")}
    truth["crack"][20, 5:55] = 1
    pred = {name: np.zeros(shape) for name in truth}
    pred["crack"][20, 5:55] = 1
    pred["free1"][10, 5:35] = 1
    pred["free1"][30, 50:53] = 1
    pred["free2"][20, 5:10] = 1
    pred["free3"][20, 5:12] = 1
    pred["free3"][20, 15:22] = 1
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", pred)
    return shape


def test_crack_free_photos_are_reported_apart_counting_cracks_as_predict_does(tmp_path):
    height, width = _crack_free_case(tmp_path)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt")
    free = report["crack_free"]
    assert free["images"] == 3 and free["with_predicted_cracks"] == 2  # free2's 5 px speck is under --min-length 10
    assert free["false_crack_pixels_per_megapixel"] == pytest.approx(1e6 * (30 + 3 + 5 + 14) / (3 * height * width))
    assert (free["threshold"], free["min_length_px"], free["join_gap_px"]) == (0.5, 10.0, 10.0)
    assert list(report).index("crack_free") == list(report).index("worst_images") + 1 and "crack_free" in report["definitions"]
    rows = {row["image"]: row for row in report["per_image"]}
    assert rows["crack"]["crack_free"] == 0 and "false_cracks" not in rows["crack"]
    assert [(rows[n]["false_cracks"], rows[n]["false_crack_pixels"]) for n in ("free1", "free2", "free3")] == [(1, 33), (0, 5), (1, 14)]
    # The figures over the photos with cracks are those of a report without the crack-free photos' marks.
    assert report["per_image_mean"]["f1"] == pytest.approx(np.mean([row["f1"] for row in report["per_image"]]))
    unjoined = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(join_gap=0))
    assert unjoined["crack_free"]["with_predicted_cracks"] == 1  # free3's pieces apart are each under 10 px
    apart = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(min_length=4, join_gap=0))
    assert apart["crack_free"]["with_predicted_cracks"] == 3  # free2's speck and free3's two pieces now count
    assert [row["false_cracks"] for row in sorted(apart["per_image"], key=lambda r: r["image"]) if row["crack_free"]] == [1, 1, 2]


@pytest.mark.parametrize("protocol, reported", [("omnicrack", True), ("scsegamba", False), ("deepsegmentor", False)])
def test_crack_free_photos_are_reported_apart_only_under_a_protocol_with_an_operating_threshold(tmp_path, protocol, reported):
    """scsegamba and deepsegmentor sweep thresholds of their own: a mask at evaluate's threshold is none of theirs."""
    _crack_free_case(tmp_path)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt", scoring=Scoring(protocol=protocol))
    assert ("crack_free" in report) == reported == ("crack_free" in report["definitions"])
    assert all(("crack_free" in row) == reported for row in report["per_image"])


@pytest.mark.parametrize("threshold, counted", [(0.4, False), (0.39, True)])
def test_every_figure_of_a_report_marks_the_pixels_of_one_threshold(tmp_path, threshold, counted):
    """0.4 asked is scored at the grid's 0.4009, above an 8-bit level of 102 (0.4): no figure may count that line."""
    truth, pred = {name: np.zeros((20, 40)) for name in ("crack", "free")}, {name: np.zeros((20, 40)) for name in ("crack", "free")}
    truth["crack"][5, 5:35] = pred["crack"][5, 5:35] = 1
    pred["free"][10, 5:35] = 102 / 255
    save_maps(tmp_path / "gt", truth)
    save_maps(tmp_path / "pred", pred)
    report = evaluate_files(tmp_path / "pred", tmp_path / "gt", threshold=threshold)
    assert (report["threshold"] <= 102 / 255) == counted
    false_pixels = 30 if counted else 0
    assert report["crack_free"]["with_predicted_cracks"] == int(counted) and report["crack_free"]["threshold"] == report["threshold"]
    assert report["crack_free"]["false_crack_pixels_per_megapixel"] == pytest.approx(1e6 * false_pixels / 800)
    assert report["false_alarms"]["far_pixels"] == false_pixels
    assert report["dataset"]["precision"] == pytest.approx(30 / (30 + false_pixels))


def test_crack_free_figures_reach_the_report_files_and_need_crack_free_truth(tmp_path):
    _crack_free_case(tmp_path)
    args = ["evaluate", "--pred", str(tmp_path / "pred"), "--gt", str(tmp_path / "gt"), "--min-length", "4", "--join-gap", "0"]
    assert main([*args, "--out", str(tmp_path / "r")]) == 0
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert saved["crack_free"]["min_length_px"] == 4.0 and saved["crack_free"]["join_gap_px"] == 0.0
    with open(tmp_path / "r" / "per_image.csv") as file:
        rows = {row["image"]: row for row in csv.DictReader(file)}
    assert rows["crack"]["crack_free"] == "0" and rows["free1"]["crack_free"] == "1" and rows["free1"]["false_cracks"] == "1"
    assert "crack-free" in (tmp_path / "r" / "report.md").read_text()
    (tmp_path / "cracks.txt").write_text("crack\n")
    assert main([*args, "--split", str(tmp_path / "cracks.txt"), "--out", str(tmp_path / "c")]) == 0
    assert "crack_free" not in json.loads((tmp_path / "c" / "report.json").read_text())
    assert (tmp_path / "c" / "per_image.csv").read_text().splitlines()[0] == "image,crack_pixels,precision,recall,f1,iou,best_f1,far_alarm_pixels"


def test_every_protocol_scores_a_checkpoint_and_saved_files_and_names_itself(synth_root, tmp_path):
    import shutil

    shutil.copytree(synth_root, tmp_path / "data")
    Image.fromarray(np.zeros((64, 64), np.uint8)).save(tmp_path / "data" / "masks" / "00003.png")  # a crack-free photo
    torch.manual_seed(0)
    save_model(build_model("mobilenet_v2"), tmp_path / "m.pt")
    for protocol in ("scsegamba", "deepsegmentor", "omnicrack"):
        report = evaluate_checkpoint(tmp_path / "m.pt", tmp_path / "data", "all", inference=InferenceOptions(device="cpu"),
                                     scoring=Scoring(protocol))
        assert report["protocol"] == protocol and report["images"] == 12 and report["source"]["split"] == "all"
        if protocol == "omnicrack":  # the one of them with an operating threshold
            assert report["crack_free"]["images"] == 1 and {row["image"] for row in report["per_image"] if row["crack_free"]} == {"00003"}
        out = tmp_path / protocol
        assert main(["evaluate", "--pred", str(tmp_path / "data" / "masks"), "--gt", str(tmp_path / "data" / "masks"),
                     "--protocol", protocol, "--out", str(out)]) == 0
        saved = json.loads((out / "report.json").read_text())
        assert saved["protocol"] == protocol and f"Protocol: {protocol}, as github.com/" in (out / "report.md").read_text()
        assert (out / "pr_curve.png").exists() == (protocol != "omnicrack")
        perfect = {"scsegamba": saved.get("ois", {}).get("f1"), "deepsegmentor": saved.get("ods", {}).get("f1"), "omnicrack": saved.get("cliou")}
        assert perfect[protocol] < 1.0 if protocol == "scsegamba" else perfect[protocol] == pytest.approx(1.0)  # scsegamba: crack-free score 0


def test_tolerance_belongs_to_the_crackseg_protocol(tmp_path, capsys):
    truth = _truth()
    save_maps(tmp_path / "gt", truth)
    with pytest.raises(SystemExit) as exit:
        main(["evaluate", "--pred", str(tmp_path / "gt"), "--gt", str(tmp_path / "gt"), "--protocol", "scsegamba", "--tolerance", "2"])
    error = capsys.readouterr().err
    assert exit.value.code == 2 and error.count("\n") == 1 and "--tolerance belongs to the crackseg protocol" in error
    with pytest.raises(InputError, match="--protocol must be one of crackseg, .*, got 'nonsense'"):
        evaluate_files(tmp_path / "gt", tmp_path / "gt", scoring=Scoring("nonsense"))
