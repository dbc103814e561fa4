"""What predict writes per image and per run: ids, joined cracks, width classes, the summary, overlays."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from crackseg.errors import InputError
from crackseg.measure import WidthClasses
from crackseg.outputs import OutputSpec, PredictionsFolder, overlay_jpeg, write_image_outputs, write_summary
from crackseg.predict import PredictOptions


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


def test_overlay_writes_each_id_beside_its_crack():
    image = np.full((120, 200, 3), 90, dtype=np.uint8)
    from crackseg.measure import find_cracks

    mask = (_crack_probability() >= 0.5).numpy()
    _, cracks = find_cracks(mask, 8, 10)
    with_ids = np.asarray(Image.open(__import__("io").BytesIO(overlay_jpeg(image, mask, cracks)))).astype(int)
    without = np.asarray(Image.open(__import__("io").BytesIO(overlay_jpeg(image, mask, [])))).astype(int)
    for crack in cracks:
        row, col = crack.anchor
        patch = with_ids[row + 3 : row + 15, col + 3 : col + 12]
        assert (patch.min(axis=2) > 230).any() and np.abs(patch - without[row + 3 : row + 15, col + 3 : col + 12]).max() > 100


def test_summary_totals_the_run_and_warns_about_sub_pixel_classes(tmp_path):
    spec = OutputSpec(px_size=0.5, join_gap_px=8, min_length_px=10, width_classes=WidthClasses.parse("aci224"))
    image = torch.zeros((3, 120, 200), dtype=torch.uint8)
    rows, crack_rows = [], []
    for name in ("a", "b"):
        row, cracks = write_image_outputs(PredictionsFolder(tmp_path), tmp_path / f"{name}.jpg", name, image, _crack_probability(), 0.5, spec)
        rows.append(row)
        crack_rows += cracks
    options = PredictOptions(out=tmp_path, px_size=0.5, width_classes="aci224")
    from crackseg.predict import _resolution_warnings

    warnings = _resolution_warnings(options.output_spec())
    assert len(warnings) == 1 and "less than one pixel (0.5 mm)" in warnings[0]
    summary = write_summary(PredictionsFolder(tmp_path), rows, crack_rows, spec, warnings)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["images"] == 2 and summary["cracks"] == 4
    assert summary["length_mm"] == pytest.approx(sum(r["length_mm"] for r in crack_rows))
    assert sum(summary["width_classes"]["length_mm"].values()) == pytest.approx(summary["length_mm"])
    assert summary["widest"]["max_width_px"] == max(r["max_width_px"] for r in crack_rows)


@pytest.mark.parametrize("options, message", [
    (dict(join_gap="ten"), "--join-gap must be a length like 12px or 3mm"),
    (dict(px_size=0.2, width_classes="0.3,0.1"), "--width-classes widths must be positive and increasing"),
])
def test_deliverable_options_are_checked_before_work(tmp_path, options, message):
    with pytest.raises(InputError, match=message):
        PredictOptions(out=tmp_path, **options)
    assert PredictOptions(out=tmp_path, px_size=0.25, min_length="2.5mm").output_spec().min_length_px == 10
    own_scale = PredictOptions(out=tmp_path, min_length="3mm", width_classes="bre251")  # checked per image, see test_streamed
    assert own_scale.output_spec().min_length_px is None and own_scale.output_spec(0.5).min_length_px == 6
    assert own_scale.scale_needed_by() == "--width-classes" and PredictOptions(out=tmp_path).scale_needed_by() is None


def test_uncertainty_is_the_share_of_pixels_nearer_the_threshold_than_a_sure_answer():
    from crackseg.outputs import uncertainty

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
