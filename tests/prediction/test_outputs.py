"""What predict writes per image and per run: ids, joined cracks, width classes, the summary, overlays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import predict_cli
from PIL import Image

from crackseg.core.errors import InputError
from crackseg.cracks.widths import WidthClasses
from crackseg.prediction.outputs import OutputSpec, PredictionsFolder, write_image_outputs
from crackseg.prediction.tables import write_summary
from crackseg.prediction.pictures import overlay_jpeg
from crackseg.cracks.options import Scale
from crackseg.prediction.options import PredictOptions


def _crack_probability() -> torch.Tensor:
    """A wide crack (7 px) broken by a 6 px gap, a thin one (2 px) elsewhere, and a 3 px speck."""
    prob = torch.zeros(120, 200)
    prob[27:34, 10:90] = 0.9
    prob[27:34, 96:190] = 0.9
    prob[90:92, 20:150] = 0.8
    prob[5:7, 180:183] = 0.7
    return prob


def test_cracks_get_ids_classes_and_joined_lengths(tmp_path):
    spec = OutputSpec(overlay=True, px_size=0.5, join_gap_px=8, min_length_px=10, width_classes=WidthClasses.parse("bre251"))
    image = torch.full((3, 120, 200), 128, dtype=torch.uint8)
    row, cracks = write_image_outputs(PredictionsFolder(tmp_path), tmp_path / "a.jpg", "a", image, _crack_probability(), 0.5, spec)
    assert row["cracks"] == 2 and [c["crack"] for c in cracks] == [1, 2]
    wide, thin = cracks
    assert wide["fragments"] == 2 and wide["length_px"] == pytest.approx(180, rel=0.05)
    assert wide["max_width_mm"] == pytest.approx(3.5, rel=0.15) and wide["max_width_class"] == "2"  # 1-5 mm
    assert thin["max_width_mm"] == pytest.approx(1.0, rel=0.25) and thin["max_width_class"] in ("1", "2")
    assert row["length_mm[2]"] == pytest.approx(wide["length_mm"] + (thin["length_mm"] if thin["max_width_class"] == "2" else 0))
    mask = np.asarray(Image.open(tmp_path / "masks" / "a.png"))
    assert mask[5, 181] == 255  # the speck stays in the mask, out of the tables
    overlay = np.asarray(Image.open(tmp_path / "overlays" / "a.jpg")).astype(int)
    assert overlay[5, 181, 0] < 160  # the speck is not tinted: only reported cracks are
    assert overlay[30, 50, 0] > 200 and overlay[30, 50, 1] < 120  # a reported crack is


def test_an_images_mm_are_its_cracks_mm_not_its_rounded_px_scaled(tmp_path):
    spec = OutputSpec(px_size=7.77, join_gap_px=8, min_length_px=10)  # coarse: a px rounded to 0.01 is 0.04 mm off
    image = torch.zeros((3, 120, 200), dtype=torch.uint8)
    prob = _crack_probability()
    for step in range(70):  # a slanting crack: lengths and widths of no round number of px
        prob[40 + step // 2, 20 + step : 23 + step] = 0.9
    row, cracks = write_image_outputs(PredictionsFolder(tmp_path), tmp_path / "a.jpg", "a", image, prob, 0.5, spec)
    assert row["max_width_mm"] == max(c["max_width_mm"] for c in cracks)
    assert row["length_mm"] == pytest.approx(sum(c["length_mm"] for c in cracks), abs=1e-4 * len(cracks))


def test_overlay_writes_each_id_beside_its_crack():
    image = np.full((120, 200, 3), 90, dtype=np.uint8)
    from crackseg.cracks.measure import find_cracks

    mask = (_crack_probability() >= 0.5).numpy()
    _, cracks = find_cracks(mask, 8, 10)
    with_ids = np.asarray(Image.open(__import__("io").BytesIO(overlay_jpeg(image, mask, cracks)))).astype(int)
    without = np.asarray(Image.open(__import__("io").BytesIO(overlay_jpeg(image, mask, [])))).astype(int)
    for crack in cracks:
        row, col = crack.anchor
        patch = with_ids[row + 3 : row + 15, col + 3 : col + 12]
        assert (patch.min(axis=2) > 230).any() and np.abs(patch - without[row + 3 : row + 15, col + 3 : col + 12]).max() > 100


def test_overlay_ids_of_cracks_along_the_right_and_bottom_edges_stay_whole_inside_the_picture():
    from scipy import ndimage

    from crackseg.cracks.measure import find_cracks

    image = np.full((64, 96, 3), 90, dtype=np.uint8)
    mask = np.zeros((64, 96), bool)
    mask[60:63, 10:50] = True  # along the bottom edge
    mask[10:50, 92:95] = True  # along the right edge
    _, cracks = find_cracks(mask, 0, 10)
    assert len(cracks) == 2
    white = np.asarray(Image.open(__import__("io").BytesIO(overlay_jpeg(image, mask, cracks)))).min(axis=2) > 230
    labels, count = ndimage.label(white)
    boxes = [(rows.stop - rows.start, cols.stop - cols.start) for rows, cols in ndimage.find_objects(labels)]
    assert count == 2 and all(height >= 10 and width >= 7 for height, width in boxes), boxes  # each id's box drawn whole


def test_summary_totals_the_run_by_the_graded_width(tmp_path):
    spec = OutputSpec(px_size=0.5, join_gap_px=8, min_length_px=10, width_classes=WidthClasses.parse("aci224"))
    image = torch.zeros((3, 120, 200), dtype=torch.uint8)
    rows, crack_rows = [], []
    for name in ("a", "b"):
        row, cracks = write_image_outputs(PredictionsFolder(tmp_path), tmp_path / f"{name}.jpg", name, image, _crack_probability(), 0.5, spec)
        rows.append(row)
        crack_rows += cracks
    summary = write_summary(PredictionsFolder(tmp_path), rows, crack_rows, spec, ["a warning"])
    assert json.loads((tmp_path / "summary.json").read_text()) == summary and summary["warnings"] == ["a warning"]
    assert summary["images"] == 2 and summary["cracks"] == 4
    assert summary["length_mm"] == pytest.approx(sum(r["length_mm"] for r in crack_rows))
    assert sum(summary["width_classes"]["length_mm"].values()) == pytest.approx(summary["length_mm"])
    assert summary["widest"]["max_width_px"] == max(r["max_width_px"] for r in crack_rows)
    classes = summary["width_classes"]
    assert (classes["title"], classes["graded"], classes["by"]) == ("ACI 224R", "max", "max width")
    assert classes["cracks"] == {label: sum(r["max_width_class"] == label for r in crack_rows) for label in classes["labels"]}


def _pavement_crack_probability() -> torch.Tensor:
    """A 4 px crack 220 px long with a 14 px wide knot: at 1 mm per pixel its mean width is under ASTM D6433's 10 mm
    (L), its max width over it (M)."""
    prob = torch.zeros(60, 240)
    prob[28:32, 10:230] = 0.9
    prob[23:37, 100:116] = 0.9
    return prob


def test_a_standard_grading_mean_width_totals_lengths_by_the_mean_width_class(tmp_path):
    spec = OutputSpec(px_size=1.0, join_gap_px=8, min_length_px=10, width_classes=WidthClasses.parse("d6433-ac"))
    image = torch.zeros((3, 60, 240), dtype=torch.uint8)
    row, cracks = write_image_outputs(PredictionsFolder(tmp_path), tmp_path / "a.jpg", "a", image, _pavement_crack_probability(), 0.5, spec)
    (crack,) = cracks
    assert crack["mean_width_mm"] < 10 <= crack["max_width_mm"] < 75
    assert (crack["mean_width_class"], crack["max_width_class"]) == ("L", "M")  # cracks.csv keeps both
    assert (row["length_mm[L]"], row["length_mm[M]"], row["length_mm[H]"]) == (crack["length_mm"], 0.0, 0.0)
    classes = write_summary(PredictionsFolder(tmp_path), [row], cracks, spec, [])["width_classes"]
    assert (classes["graded"], classes["by"], classes["title"]) == ("mean", "mean width", "ASTM D6433, asphalt")
    assert classes["cracks"] == {"L": 1, "M": 0, "H": 0} and classes["length_mm"]["L"] == crack["length_mm"]
    assert classes["ranges_mm"] == {"L": "w < 10", "M": "10 <= w < 75", "H": "w >= 75"}


@pytest.mark.parametrize("preset, px_size, needed", [
    ("mbei-psc", 0.05, "0.0339 mm"),  # narrowest band 0.1016 mm: 2 px
    ("mbei-psc", 0.0338, None),
    ("ec2", 0.1, "0.0333 mm"),  # 0.3-0.4 mm: 1 px
    ("d6433-ac", 3.3, None),  # 10 mm: 3 px
    ("d6433-ac", 5.0, "3.33 mm"),
    ("0.5,1", 0.2, "0.167 mm"),  # custom edges: named without a standard
])
def test_a_pixel_size_too_coarse_for_three_pixels_per_band_names_the_pixel_size_needed(tmp_path, preset, px_size, needed):
    from crackseg.prediction.predict import _resolution_warnings

    warnings = _resolution_warnings(OutputSpec.of(PredictOptions(out=tmp_path, scale=Scale(px_size=px_size, width_classes=preset))))
    if needed is None:
        assert warnings == []
        return
    classes = WidthClasses.parse(preset)
    (warning,) = warnings
    assert warning.startswith(f"width classes {classes.described}: the narrowest band is {classes.narrowest_band_mm():g} mm")
    assert f"at {px_size:g} mm per pixel" in warning and f"the classes need a pixel size of {needed} or finer (3 px per band)" in warning
    assert "\n" not in warning


@pytest.mark.parametrize("options, message", [
    (dict(join_gap="ten"), "--join-gap must be a length like 12px or 3mm, got 'ten'$"),
    (dict(scale=dict(px_size=0.2, width_classes="0.3,0.1")), "--width-classes widths must be positive and increasing"),
])
def test_deliverable_options_are_checked_before_work(tmp_path, options, message):
    with pytest.raises(InputError, match=message):
        PredictOptions(out=tmp_path, **{key: Scale(**value) if key == "scale" else value for key, value in options.items()})
    assert OutputSpec.of(PredictOptions(out=tmp_path, scale=Scale(px_size=0.25), min_length="2.5mm")).min_length_px == 10
    own_scale = PredictOptions(out=tmp_path, min_length="3mm", scale=Scale(width_classes="bre251"))  # checked per image, see test_streamed
    assert OutputSpec.of(own_scale).min_length_px is None and OutputSpec.of(own_scale, 0.5).min_length_px == 6
    assert own_scale.scale_needed_by() == "--width-classes" and PredictOptions(out=tmp_path).scale_needed_by() is None


def test_uncertainty_is_the_share_of_pixels_nearer_the_threshold_than_a_sure_answer():
    from crackseg.prediction.uncertainty import uncertainty

    # threshold 0.4: unsure in [0.2, 0.7); crack from 0.4
    prob = np.array([[0.0, 0.19, 0.2, 0.39], [0.4, 0.69, 0.7, 1.0]], np.float32)
    assert uncertainty(prob, 0.4) == {"uncertainty": 0.5, "unsure_crack_share": 0.5}
    assert uncertainty(np.zeros((3, 3), np.float32), 0.5) == {"uncertainty": 0.0, "unsure_crack_share": 0.0}


def test_saved_probabilities_add_the_uncertainty_and_the_summary_names_the_threshold(tmp_path):
    spec = OutputSpec(save_prob=16, measure=False)
    folder = PredictionsFolder(tmp_path)
    row, _ = write_image_outputs(folder, tmp_path / "a.jpg", "a", torch.zeros((3, 120, 200), dtype=torch.uint8),
                                 _crack_probability(), 0.5, spec)
    assert row["uncertainty"] == pytest.approx(6 / (120 * 200), abs=1e-6)  # unsure in [0.25, 0.75): the 0.7 speck, 2x3 px
    assert row["unsure_crack_share"] == pytest.approx(6 / (7 * 174 + 2 * 130 + 6), abs=1e-6)
    assert list(row)[-1] == "status"
    assert write_summary(folder, [row], [], spec, [], threshold=0.5)["threshold"] == 0.5
    assert "uncertainty" not in write_image_outputs(folder, tmp_path / "a.jpg", "a", torch.zeros((3, 120, 200), dtype=torch.uint8),
                                                    _crack_probability(), 0.5, OutputSpec(measure=False))[0]


def _predicted(tmp_path: Path, monkeypatch, checkpoint: Path, names: list[str]) -> PredictionsFolder:
    """The predictions folder of photos with these names (one dark crack across each), predicted as
    ``crackseg predict .`` from their folder, so that each name starts its row's path."""
    (tmp_path / "in").mkdir()
    for name in names:
        photo = np.full((40, 60, 3), 200, np.uint8)
        photo[20:23, 5:55] = 20
        Image.fromarray(photo).save(tmp_path / "in" / name)
    monkeypatch.chdir(tmp_path / "in")
    assert predict_cli("--checkpoint", checkpoint, ".", "--out", tmp_path / "pred", "--save-prob", "8") == 0
    return PredictionsFolder(tmp_path / "pred")


def test_every_reader_of_the_tables_gets_the_names_predict_was_given(tmp_path, monkeypatch, dark_checkpoint):
    """The tables guard a name a spreadsheet would run ('=x.jpg); what reads them back (labels export and rank
    read through the folder too) gets =x.jpg, and a name that merely starts with a quote keeps it."""
    from crackseg.labels.loop import export_labels, rank_predictions

    names = ["=x.jpg", "+1.jpg", "'quoted.jpg", "plain.jpg"]
    folder = _predicted(tmp_path, monkeypatch, dark_checkpoint, names)
    for table in (folder.predictions_csv, folder.cracks_csv):
        assert "\n'=x.jpg," in table.read_text(encoding="utf-8") and "\n'+1.jpg," in table.read_text(encoding="utf-8")
    assert sorted(row["path"] for row in folder.read_predictions()) == sorted(names)
    assert sorted(row["path"] for row in folder.read_cracks()) == sorted(names)  # one crack each
    export_labels(folder.root, "coco", tmp_path / "pre.json")
    assert sorted(image["file_name"] for image in json.loads((tmp_path / "pre.json").read_text())["images"]) == sorted(names)
    assert sorted(row["path"] for row in rank_predictions(folder.root)[0]) == sorted(names)
    assert ",'=x.jpg," in folder.rank_csv.read_text(encoding="utf-8")  # guarded again where it is written again


def test_the_tables_are_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch, dark_checkpoint):
    folder = _predicted(tmp_path, monkeypatch, dark_checkpoint, ["fissure-é.jpg"])
    code = ("import json, locale; from crackseg.prediction.outputs import PredictionsFolder; "
            f"folder = PredictionsFolder({str(folder.root)!r}); "
            "print(json.dumps([locale.getpreferredencoding(False), *(row['path'] for row in folder.read_predictions() + folder.read_cracks())]))")
    ascii_locale = {**os.environ, "LANG": "C", "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    encoding, *paths = json.loads(subprocess.run([sys.executable, "-c", code], env=ascii_locale, capture_output=True, text=True,
                                                 check=True).stdout)
    assert "utf" not in encoding.lower() and paths == ["fissure-é.jpg", "fissure-é.jpg"]


def test_errors_are_listed_in_the_inputs_order_whatever_order_processes_report_them(tmp_path):
    """Ray's actors and torchrun's processes report failures as they come; errors.csv keeps the inputs' order."""
    from conftest import csv_rows

    from crackseg.prediction.outputs import Records

    parts = [Records(), Records()]
    parts[1].fail(4, Path("e.jpg"), "e", "cannot decode", on_stderr=False)
    parts[0].fail(2, Path("c.jpg"), "c", "file not found", on_stderr=False)
    parts[1].fail(1, Path("b.jpg"), "b", "cannot decode", on_stderr=False)
    folder = PredictionsFolder(tmp_path / "pred")
    folder.root.mkdir()
    folder.write_tables(Records.joined(parts), OutputSpec(measure=False), [], False, 0.5)
    assert [(row["path"], row["name"]) for row in csv_rows(folder.errors_csv)] == [("b.jpg", "b"), ("c.jpg", "c"), ("e.jpg", "e")]
