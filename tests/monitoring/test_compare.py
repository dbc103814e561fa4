"""crackseg compare end to end: inspections with known truth (a crack extended, one widened, one added,
one removed, the camera moved), GeoTIFF pairs with different origins, the register over three visits; and what
is refused before any work, what fails one pair only, and the files that predict and datasets really hold."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage
from skimage.draw import line as draw_line
from skimage.transform import SimilarityTransform, warp

from crackseg.cli.main import main
from conftest import predict_cli, read_only_mount
from conftest import assert_soon, browser, loaded_pictures, needs_browser

SIZE = 480
# Cracks of the first visit in its pixels: (row0, col0, row1, col1, width px).
A = (60, 60, 110, 200, 3)  # untouched
B = (260, 60, 260, 200, 3)  # extended by 50 px
C = (320, 300, 440, 420, 3)  # widened to 7 px
D = (80, 330, 200, 440, 3)  # repaired (gone)
F = (380, 60, 440, 200, 3)  # new at the second visit
MOVE = SimilarityTransform(scale=1.04, rotation=np.deg2rad(3), translation=(-18, 9))  # the second photo's viewpoint


def _draw(cracks, shape=(SIZE, SIZE)) -> np.ndarray:
    mask = np.zeros(shape, bool)
    for r0, c0, r1, c1, width in cracks:
        centre = np.zeros(shape, bool)
        rows, cols = draw_line(r0, c0, r1, c1)
        centre[rows, cols] = True
        mask |= ndimage.distance_transform_edt(~centre) <= (width - 1) / 2
    return mask


def _texture(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fine = ndimage.gaussian_filter(rng.random((SIZE, SIZE)), 1.5)
    coarse = ndimage.gaussian_filter(rng.random((SIZE, SIZE)), 12)
    texture = 0.6 * (fine - fine.min()) / np.ptp(fine) + 0.4 * (coarse - coarse.min()) / np.ptp(coarse)
    return 0.35 + 0.55 * texture


def _photo(texture: np.ndarray, mask: np.ndarray) -> np.ndarray:
    grey = np.where(mask, 0.08, texture)
    return (np.repeat(grey[..., None], 3, axis=2) * 255).round().astype(np.uint8)


def _write_visit(root: Path, photo: np.ndarray, mask: np.ndarray, name: str = "wall") -> Path:
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    Image.fromarray(photo).save(root / "images" / f"{name}.png")
    Image.fromarray(mask.astype(np.uint8) * 255).save(root / "masks" / f"{name}.png")
    return root


@pytest.fixture(scope="module")
def two_visits(tmp_path_factory) -> tuple[Path, Path]:
    """The first visit, and the second seen from a moved camera with B longer, C wider, D gone and F new."""
    root = tmp_path_factory.mktemp("visits")
    texture = _texture()
    first = _draw([A, B, C, D])
    second = _draw([A, (B[0], B[1], B[2], B[3] + 50, 3), C[:4] + (7,), F])
    before = _write_visit(root / "before", _photo(texture, first), first)
    moved = warp(_photo(texture, second), MOVE.inverse, preserve_range=True, order=1, mode="edge").round().astype(np.uint8)
    moved_mask = warp(second.astype(float), MOVE.inverse, order=1) > 0.5
    after = _write_visit(root / "after", moved, moved_mask)
    return before, after


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


def _by_status(rows: list[dict]) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for row in rows:
        found.setdefault(row["status"], []).append(row)
    return found


def _near(row: dict, point: tuple[int, int], transform=None) -> bool:
    """Whether the row's AFTER box holds ``point`` (row, col of the first visit, mapped when ``transform``)."""
    r, c = point
    if transform is not None:
        c, r = transform(np.array([[c, r]]))[0]
    return float(row["top"]) - 3 <= r <= float(row["bottom"]) + 3 and float(row["left"]) - 3 <= c <= float(row["right"]) + 3


def test_a_moved_camera_gives_the_true_changes_and_leaves_the_untouched_crack_unchanged(two_visits, tmp_path):
    before, after = two_visits
    out = tmp_path / "changes"
    assert main(["compare", str(before), str(after), "--out", str(out), "--px-size", "0.5"]) == 0
    pairs = _rows(out / "pairs.csv")
    assert len(pairs) == 1 and pairs[0]["status"] == "registered" and pairs[0]["method"] == "orb-similarity"
    assert int(pairs[0]["inliers"]) >= 20 and float(pairs[0]["residual_px"]) < 2 and float(pairs[0]["error_px"]) < 2
    assert float(pairs[0]["tolerance_px"]) == pytest.approx(3 + float(pairs[0]["error_px"]), abs=2e-3)  # the pair's own
    found = _by_status(_rows(out / "changes.csv"))
    assert sorted(found) == ["gone", "longer", "new", "unchanged", "wider"], found.keys()
    assert all(len(rows) == 1 for rows in found.values())
    assert _near(found["unchanged"][0], (85, 130), MOVE)
    longer = found["longer"][0]
    growth = float(longer["length_px_after"]) - float(longer["length_px_before"]) * 1.04
    assert abs(growth - 50 * 1.04) <= 0.15 * 50 * 1.04, growth
    wider = found["wider"][0]
    width_growth = float(wider["mean_width_px_after"]) - float(wider["mean_width_px_before"]) * 1.04
    assert abs(width_growth - 4 * 1.04) <= 1.0, width_growth
    assert found["gone"][0]["crack_after"] == "" and _near(found["gone"][0], (140, 385), MOVE)
    assert found["new"][0]["crack_before"] == "" and _near(found["new"][0], (410, 130), MOVE)
    # mm: the AFTER pixel size, the BEFORE pixels through the registration's scale
    assert float(longer["length_mm_after"]) == pytest.approx(float(longer["length_px_after"]) * 0.5, abs=1e-3)
    assert float(longer["length_mm_before"]) == pytest.approx(float(longer["length_px_before"]) * 0.5 * 1.04, rel=0.01)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["registered"] == 1 and summary["cracks"]["new"] == 1 and summary["cracks"]["gone"] == 1
    assert "tolerance_px" not in summary


def test_predictions_folders_compare_with_the_ids_of_their_cracks_csv(two_visits, dark_checkpoint, tmp_path):
    """Two predict outputs (a model that calls dark pixels cracks): ids and lengths are those of each cracks.csv,
    the change layer and the report are written."""
    pyogrio = pytest.importorskip("pyogrio")
    predictions = []
    for visit in two_visits:
        out = tmp_path / f"predicted-{visit.name}"
        assert predict_cli("--checkpoint", dark_checkpoint, visit / "images", "--out", out) == 0
        predictions.append(out)
    out = tmp_path / "changes"
    assert main(["compare", *map(str, predictions), "--out", str(out), "--vectors", "gpkg", "--report"]) == 0
    changes = _rows(out / "changes.csv")
    # the model also marks dark specks that the moved camera brings in at the border: new, and short
    assert sorted(row["status"] for row in changes if float(row["length_px_after"] or 100) > 30) == ["gone", "longer", "new", "unchanged", "wider"]
    for side, folder in zip(("before", "after"), predictions):
        lengths = {row["crack"]: float(row["length_px"]) for row in _rows(folder / "cracks.csv")}
        for row in changes:
            if row[f"crack_{side}"]:
                assert float(row[f"length_px_{side}"]) == pytest.approx(lengths[row[f"crack_{side}"]], abs=0.01)
    meta, _, geometry, fields = pyogrio.raw.read(out / "vectors" / "wall.gpkg", layer="changes")
    assert sorted(fields[list(meta["fields"]).index("status")]) == sorted(row["status"] for row in changes)
    assert all(geometry) and meta["crs"] is None
    pair = _rows(out / "pairs.csv")[0]
    assert "picture_before" not in pair
    page = (out / "report.html").read_text()
    assert "report/pair0-before.jpg" in page and (out / "report" / "pair0-after.jpg").stat().st_size > 1000


def test_an_unchanged_visit_is_unchanged_everywhere(two_visits, tmp_path, capsys):
    before, _ = two_visits
    again = shutil.copytree(before, tmp_path / "again")
    assert main(["compare", str(before), str(again), "--out", str(tmp_path / "copy")]) == 0
    assert {row["status"] for row in _rows(tmp_path / "copy" / "changes.csv")} == {"unchanged"}
    assert "warning" not in capsys.readouterr().err and "warnings" not in json.loads((tmp_path / "copy" / "summary.json").read_text())


def test_one_folder_given_as_both_visits_is_compared_with_a_warning(two_visits, tmp_path, capsys):
    before, _ = two_visits
    out = tmp_path / "same"
    assert main(["compare", str(before), str(before.parent / ".." / before.parent.name / before.name), "--out", str(out), "--report"]) == 0
    assert {row["status"] for row in _rows(out / "changes.csv")} == {"unchanged"}
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"crackseg: warning: BEFORE and AFTER are the same inspection ({before})")
    assert json.loads((out / "summary.json").read_text())["warnings"] == [line.removeprefix("crackseg: warning: ")]
    assert "the same inspection" in (out / "report.html").read_text()


def test_a_pair_without_features_is_unregistered_and_not_compared(tmp_path, two_visits, capsys):
    before, _ = two_visits
    blank = np.full((SIZE, SIZE, 3), 128, np.uint8)
    after = _write_visit(tmp_path / "after", blank, _draw([A]))
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out)]) == 0
    pair = _rows(out / "pairs.csv")[0]
    assert pair["status"] == "unregistered" and pair["reason"] and pair["error_px"] == ""  # no mapping, so no error either
    assert json.loads((out / "summary.json").read_text())["unregistered"] == ["wall"]
    assert _rows(out / "changes.csv") == []
    assert "0 of 1 pairs compared" in capsys.readouterr().out


def test_names_on_one_side_only_are_listed_and_pairs_csv_pairs_other_names(tmp_path, two_visits):
    before, after = two_visits
    renamed = tmp_path / "renamed"
    for kind in ("images", "masks"):
        (renamed / kind).mkdir(parents=True)
        (renamed / kind / "wall-2026.png").write_bytes((after / kind / "wall.png").read_bytes())
        (renamed / kind / "extra.png").write_bytes((after / kind / "wall.png").read_bytes())
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(f"before,after\n{before / 'images' / 'wall.png'},wall-2026\n")
    out = tmp_path / "out"
    assert main(["compare", str(before), str(renamed), "--out", str(out), "--pairs", str(pairs)]) == 0
    rows = _rows(out / "pairs.csv")
    assert [row["status"] for row in rows] == ["registered", "only after"]
    assert rows[1]["name_after"] == "extra"


@pytest.mark.parametrize("problem", ["empty", "nothing pairs", "bad pairs"])
def test_bad_input_is_one_line(tmp_path, two_visits, capsys, problem):
    before, after = two_visits
    other = tmp_path / "other"
    if problem == "empty":
        (other / "images").mkdir(parents=True)
        (other / "masks").mkdir()
        args = [str(before), str(other)]
    elif problem == "nothing pairs":
        _write_visit(other, np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), bool), name="elsewhere")
        args = [str(before), str(other)]
    else:
        (tmp_path / "pairs.csv").write_text("before,after\nwall,nowhere\n")
        args = [str(before), str(after), "--pairs", str(tmp_path / "pairs.csv")]
    with pytest.raises(SystemExit) as stop:
        main(["compare", *args, "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("crackseg: error:") and err.count("\n") == 1
    assert {"empty": "no image with a mask", "nothing pairs": "nothing pairs", "bad pairs": "nowhere"}[problem] in err


def test_results_are_not_replaced_unasked(tmp_path, two_visits, capsys):
    before, after = two_visits
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out)]) == 0
    first = (out / "changes.csv").read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(before), "--out", str(out)])
    assert stop.value.code == 2 and "--overwrite" in capsys.readouterr().err
    assert (out / "changes.csv").read_bytes() == first
    assert main(["compare", str(before), str(before), "--out", str(out), "--overwrite"]) == 0
    assert (out / "changes.csv").read_bytes() != first


def _write_geotiff(path: Path, array: np.ndarray, origin: tuple[float, float], px: float, crs: str = "EPSG:32633") -> None:
    import rasterio
    from rasterio.transform import from_origin

    path.parent.mkdir(parents=True, exist_ok=True)
    bands = array[None] if array.ndim == 2 else np.moveaxis(array, 2, 0)
    with rasterio.open(path, "w", driver="GTiff", width=array.shape[1], height=array.shape[0], count=len(bands), dtype="uint8",
                       crs=crs, transform=from_origin(*origin, px, px)) as raster:
        raster.write(bands)


def _geo_visit(root: Path, cracks, origin: tuple[float, float], px: float, crs: str = "EPSG:32633") -> Path:
    """A raster visit: cracks given in 10-mm pixels from the map point (500000, 6000000), drawn at this visit's origin and pixel size."""
    def to_pixels(crack):
        r0, c0, r1, c1, width = crack
        row = lambda r: round((origin[1] - (6_000_000 - r * 0.01)) / px)  # noqa: E731
        col = lambda c: round((500_000 + c * 0.01 - origin[0]) / px)  # noqa: E731
        return row(r0), col(c0), row(r1), col(c1), max(1, round(width * 0.01 / px))

    mask = _draw([to_pixels(crack) for crack in cracks])
    _write_geotiff(root / "images" / "ortho.tif", _photo(_texture(), mask), origin, px, crs)
    _write_geotiff(root / "masks" / "ortho.tif", mask.astype(np.uint8) * 255, origin, px, crs)
    return root


def test_geotiff_pairs_align_by_map_coordinates_with_other_origins_and_pixel_sizes(tmp_path):
    """The second orthomosaic starts 0.4 m east and 0.3 m south and has 8 mm pixels instead of 10 mm."""
    before = _geo_visit(tmp_path / "v1", [A, B], (500_000, 6_000_000), 0.01)
    after = _geo_visit(tmp_path / "v2", [A, (B[0], B[1], B[2], B[3] + 50, 3)], (500_000.4, 5_999_999.7), 0.008)
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out), "--vectors", "geojson"]) == 0
    pair = _rows(out / "pairs.csv")[0]
    assert pair["method"] == "map" and pair["status"] == "registered"
    found = _by_status(_rows(out / "changes.csv"))
    assert sorted(found) == ["longer", "unchanged"]
    longer = found["longer"][0]
    assert float(longer["length_mm_after"]) - float(longer["length_mm_before"]) == pytest.approx(500, rel=0.15)  # 50 px of 10 mm
    assert 500_000 < float(longer["x_min"]) < float(longer["x_max"]) < 500_003 and float(longer["y_max"]) < 6_000_000
    layer = json.loads((out / "vectors" / "ortho.geojson").read_text())
    assert {feature["properties"]["status"] for feature in layer["features"]} == {"longer", "unchanged"}
    assert 'type="categorizedSymbol" attr="status"' in (out / "vectors" / "ortho.qml").read_text()  # QGIS's style beside it
    assert "32633" in json.dumps(layer.get("crs", {}))


def test_geotiffs_in_different_crss_are_one_line_naming_them_before_any_work(tmp_path, capsys):
    """The second of two pairs in two CRSs: it stopped the run once the first pair's outputs were written."""
    before = _geo_visit(tmp_path / "v1", [A], (500_000, 6_000_000), 0.01)
    after = _geo_visit(tmp_path / "v2", [A], (500_000, 6_000_000), 0.01)
    for visit, crs in ((before, "EPSG:32634"), (after, "EPSG:32633")):
        _geo_visit(tmp_path / "other", [A], (500_000, 6_000_000), 0.01, crs=crs)
        for folder in ("images", "masks"):
            (tmp_path / "other" / folder / "ortho.tif").rename(visit / folder / "zone.tif")
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(tmp_path / "out"), "--vectors", "gpkg"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert f"{before / 'masks' / 'zone.tif'} is in EPSG:32634 and {after / 'masks' / 'zone.tif'} in EPSG:32633" in err
    assert not (tmp_path / "out").exists()


def test_the_register_accumulates_three_visits(tmp_path):
    """Visit 3 widens B again; the register follows B from visit 1 through 3 in one query."""
    from crackseg.monitoring.history import width_history

    texture = _texture()
    visits = []
    for number, width in enumerate([3, 5, 9], 1):
        mask = _draw([A, B[:4] + (width,)])
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    register = tmp_path / "site.gpkg"
    dates = ["2024-05-01", "2025-05-02", "2026-05-03"]
    for number in (0, 1):
        assert main(["compare", str(visits[number]), str(visits[number + 1]), "--out", str(tmp_path / f"c{number}"),
                     "--register", str(register), "--before-date", dates[number], "--after-date", dates[number + 1]]) == 0
    with sqlite3.connect(register) as db:
        assert [row[0] for row in db.execute("SELECT date FROM surveys ORDER BY date")] == dates
        assert db.execute("SELECT count(*) FROM cracks").fetchone()[0] == 6  # two cracks per visit, the middle one registered once
        assert db.execute("SELECT before_survey, after_survey, before_image, after_image, status FROM pairs").fetchall() == [
            (1, 2, "wall", "wall", "registered"), (2, 3, "wall", "wall", "registered")]
    crack_b = next(int(row["crack_before"]) for row in _rows(tmp_path / "c0" / "changes.csv") if row["status"] == "wider")
    history = width_history(register, dates[0], "wall", crack_b)
    assert [row["date"] for row in history] == dates and [row["status"] for row in history] == [None, "wider", "wider"]
    widths = [row["max_width_px"] for row in history]
    assert widths == sorted(widths) and widths[-1] - widths[0] == pytest.approx(6, abs=1.5)


def test_the_register_keeps_a_crack_outside_the_shared_view_as_not_seen_not_as_gone(tmp_path):
    texture = _texture()
    outside = (300, 430, 330, 470, 3)  # beyond the columns the AFTER photo shows
    mask = _draw([A, B, outside])
    photo = _photo(texture, mask)
    before = _write_visit(tmp_path / "v1", photo, mask)
    after = _write_visit(tmp_path / "v2", photo[:, :400], mask[:, :400])
    register, out = tmp_path / "site.gpkg", tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out), "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    (unseen,) = [row for row in _rows(out / "changes.csv") if row["status"] == "not seen"]
    with closing(sqlite3.connect(register)) as db:
        links = db.execute("SELECT b.crack, l.after_key, l.status FROM links AS l JOIN cracks AS b ON b.crack_key = l.before_key "
                           "WHERE b.survey = 1").fetchall()
    assert (int(unseen["crack_before"]), None, "not seen") in links
    assert sorted(status for _, _, status in links) == ["not seen", "unchanged", "unchanged"]


def test_the_register_needs_dates(tmp_path, two_visits, capsys):
    before, after = two_visits
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(tmp_path / "out"), "--register", str(tmp_path / "site.gpkg")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--before-date" in err and not (tmp_path / "site.gpkg").exists()


def test_a_project_moved_whole_keeps_its_register(tmp_path):
    """Sources are kept relative to the register's folder: the visits and the register moved together still chain."""
    texture = _texture()
    project = tmp_path / "project"
    visits = [_write_visit(project / f"v{number}", _photo(texture, _draw([A, B])), _draw([A, B])) for number in range(3)]
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(project / "c1"), "--register", str(project / "site.gpkg"),
                 "--before-date", "2023-01-01", "--after-date", "2024-01-01"]) == 0
    project.rename(tmp_path / "moved")
    moved = tmp_path / "moved"
    assert main(["compare", str(moved / "v1"), str(moved / "v2"), "--out", str(moved / "c2"), "--register", str(moved / "site.gpkg"),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    with sqlite3.connect(moved / "site.gpkg") as db:
        assert db.execute("SELECT survey, source FROM surveys ORDER BY survey").fetchall() == [(1, "v0"), (2, "v1"), (3, "v2")]


def test_the_register_dates_surveys_by_their_photos_exif(tmp_path, capsys):
    texture = _texture()
    visits = []
    for number, (width, taken) in enumerate([(3, "2023:06:01 10:00:00"), (5, "2024:06:03 11:30:00")]):
        mask = _draw([A, B[:4] + (width,)])
        root = _write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask)
        exif = Image.Exif()
        exif.get_ifd(0x8769)[36867] = taken
        (root / "images" / "wall.png").unlink()
        Image.fromarray(_photo(texture, mask)).save(root / "images" / "wall.jpg", quality=95, exif=exif)
        visits.append(root)
    register = tmp_path / "site.gpkg"
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "out"), "--register", str(register)]) == 0
    with sqlite3.connect(register) as db:
        assert [row[0] for row in db.execute("SELECT date FROM surveys ORDER BY survey")] == ["2023-06-01", "2024-06-03"]
    with pytest.raises(SystemExit) as stop:  # a date that is no date is said so, whatever the photos' dates
        main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "again"), "--register", str(tmp_path / "r.gpkg"),
              "--before-date", "2025-6-1"])
    assert stop.value.code == 2 and "--before-date 2025-6-1: not a date" in capsys.readouterr().err


@needs_browser
def test_the_report_of_a_comparison_renders_in_a_real_browser(two_visits, tmp_path):
    from selenium.webdriver.common.by import By

    out = tmp_path / "out"
    assert main(["compare", *map(str, two_visits), "--out", str(out), "--report", "--px-size", "0.5"]) == 0
    driver = browser()
    try:
        driver.get((out / "report.html").as_uri())
        assert_soon(driver, lambda: [s.get_attribute("id") for s in driver.find_elements(By.CSS_SELECTOR, "section.pair")], ["pair-0"])
        assert loaded_pictures(driver, "section.pair img") == [SIZE, SIZE]
        page = lambda: driver.find_element(By.CSS_SELECTOR, "#pair-0").text  # noqa: E731
        assert_soon(driver, lambda: all(status in page() for status in ("longer", "wider", "new", "gone", "unchanged")), True)
        assert "mm" in page()
        assert not [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    finally:
        driver.quit()


# A pair that cannot be read fails alone; the run goes on.


def _copy_visit(source: Path, target: Path, names: list[str]) -> Path:
    for kind in ("images", "masks"):
        (target / kind).mkdir(parents=True, exist_ok=True)
        for name in names:
            (target / kind / f"{name}.png").write_bytes((source / kind / "wall.png").read_bytes())
    return target


def test_a_pair_whose_photo_cannot_be_decoded_fails_alone_and_the_others_are_compared(tmp_path, two_visits, capsys):
    before = _copy_visit(two_visits[0], tmp_path / "v1", ["wall", "broken"])
    after = _copy_visit(two_visits[0], tmp_path / "v2", ["wall", "broken"])
    (after / "images" / "broken.png").unlink()
    photo = Image.open(after / "images" / "wall.png")
    photo.save(after / "images" / "broken.jpg", quality=90)
    whole = (after / "images" / "broken.jpg").read_bytes()
    (after / "images" / "broken.jpg").write_bytes(whole[: len(whole) // 3])  # the header reads, the pixels do not
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out), "--report"]) == 1  # written, and incomplete
    pairs = {row["name_after"]: row for row in _rows(out / "pairs.csv")}
    assert pairs["wall"]["status"] == "registered" and pairs["broken"]["status"] == "failed"
    assert "broken.jpg" in pairs["broken"]["reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["failed"] == ["broken"] and summary["unregistered"] == [] and summary["registered"] == 1
    assert "broken.jpg" in capsys.readouterr().err


def test_an_image_of_one_visit_the_dataset_reader_cannot_pair_fails_its_pair_instead_of_looking_alone(tmp_path, two_visits, capsys):
    before = _copy_visit(two_visits[0], tmp_path / "v1", ["wall", "unmasked", "twin"])
    after = _copy_visit(two_visits[0], tmp_path / "v2", ["wall", "unmasked", "twin"])
    (after / "masks" / "unmasked.png").unlink()
    Image.open(after / "images" / "twin.png").save(after / "images" / "twin.jpg")
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out)]) == 1
    pairs = {row["name_before"]: row for row in _rows(out / "pairs.csv")}
    assert pairs["wall"]["status"] == "registered"
    assert pairs["unmasked"]["status"] == pairs["twin"]["status"] == "failed"
    assert pairs["unmasked"]["reason"].startswith(f"AFTER {after / 'images' / 'unmasked.png'}: no mask for this image")
    assert pairs["twin"]["name_after"] == "twin" and "shares its stem" in pairs["twin"]["reason"]
    assert json.loads((out / "summary.json").read_text())["only_before"] == []
    assert "unmasked.png: no mask" in capsys.readouterr().err


def test_images_in_a_subfolder_of_a_dataset_are_said_not_compared(tmp_path, two_visits, capsys):
    visits = [_copy_visit(two_visits[0], tmp_path / f"v{number}", ["wall"]) for number in (1, 2)]
    for visit in visits:
        _copy_visit(two_visits[0], visit / "site", ["wall"])
        for kind in ("images", "masks"):
            (visit / "site" / kind).rename(visit / kind / "bridge")
    out = tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    warnings = json.loads((out / "summary.json").read_text())["warnings"]
    assert len(warnings) == 4 and all("1 image in a subfolder" in warning and "not compared" in warning for warning in warnings)
    assert all(f"crackseg: warning: {warning}" in err for warning in warnings)
    assert f"BEFORE {visits[0] / 'images' / 'bridge'}" in warnings[0]


def test_a_photo_predict_failed_on_fails_its_pair_naming_errors_csv(tmp_path, two_visits, dark_checkpoint, capsys):
    photos = []
    for visit in ("v1", "v2"):
        (tmp_path / visit).mkdir()
        for name in ("wall", "broken"):
            shutil.copy(two_visits[0] / "images" / "wall.png", tmp_path / visit / f"{name}.png")
        photos.append(tmp_path / visit)
    (photos[1] / "broken.png").write_bytes(b"not a picture")
    predicted = [tmp_path / "p1", tmp_path / "p2"]
    assert predict_cli("--checkpoint", dark_checkpoint, photos[0], "--out", predicted[0]) == 0
    assert predict_cli("--checkpoint", dark_checkpoint, photos[1], "--out", predicted[1]) == 1
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["compare", *map(str, predicted), "--out", str(out)]) == 1
    pairs = {row["name_before"]: row for row in _rows(out / "pairs.csv")}
    assert pairs["broken"]["status"] == "failed" and pairs["broken"]["path_after"] == str(photos[1] / "broken.png")
    assert "predict failed on it" in pairs["broken"]["reason"] and str(predicted[1] / "errors.csv") in pairs["broken"]["reason"]


def test_a_georeferenced_shot_is_opened_at_most_twice(tmp_path, monkeypatch):
    """Whether a file lies on the map, its facts and its pixels come from one open; the checks before any work (the
    pairs' CRSs, and their pixel sizes for --width-classes without --px-size) read the facts in a second."""
    import rasterio

    before = _geo_visit(tmp_path / "v1", [A, B], (500_000, 6_000_000), 0.01)
    after = _geo_visit(tmp_path / "v2", [A, (B[0], B[1], B[2], B[3] + 50, 3)], (500_000.4, 5_999_999.7), 0.008)
    opened: list[str] = []
    rasterio_open, pillow_open = rasterio.open, Image.open
    monkeypatch.setattr(rasterio, "open", lambda path, *a, **k: opened.append(str(path)) or rasterio_open(path, *a, **k))
    monkeypatch.setattr(Image, "open", lambda path, *a, **k: opened.append(str(path)) or pillow_open(path, *a, **k))
    for run, flags in enumerate(([], ["--width-classes", "bre251"])):
        opened.clear()
        assert main(["compare", str(before), str(after), "--out", str(tmp_path / f"out{run}"), *flags]) == 0
        masks = [str(visit / "masks" / "ortho.tif") for visit in (before, after)]
        assert [opened.count(mask) for mask in masks] == [2, 2]
        assert not any("images" in path for path in opened)  # a raster's image is not opened when its mask is on the map


# Masks are read by the project's mask rules, whatever their format.


@pytest.mark.parametrize("georeferenced", [False, True])
def test_zero_one_tiff_masks_are_read_as_masks_are_everywhere(tmp_path, monkeypatch, georeferenced):
    """A TIFF mask of 0 and 1 is a 0/1 mask (as images.py reads masks), not an empty one; a plain TIFF needs no rasterio."""
    mask = _draw([A, B])
    if georeferenced:
        visit = _geo_visit(tmp_path / "v", [A, B], (500_000, 6_000_000), 0.01)
        _write_geotiff(visit / "masks" / "ortho.tif", mask.astype(np.uint8), (500_000, 6_000_000), 0.01)
    else:
        visit = _write_visit(tmp_path / "v", _photo(_texture(), mask), mask)
        (visit / "masks" / "wall.png").unlink()
        Image.fromarray(mask.astype(np.uint8)).save(visit / "masks" / "wall.tif")
        monkeypatch.setitem(sys.modules, "rasterio", None)  # the geo extra missing: import rasterio raises ImportError
    out = tmp_path / "out"
    assert main(["compare", str(visit), str(visit), "--out", str(out)]) == 0
    assert [row["status"] for row in _rows(out / "changes.csv")] == ["unchanged", "unchanged"]


def test_a_blob_without_a_centreline_link_goes_into_the_layer_and_the_register(tmp_path):
    """A round blob's skeleton is one pixel: no link, so no line; its feature and register row get an empty geometry."""
    pyogrio = pytest.importorskip("pyogrio")
    from skimage.draw import disk

    mask = _draw([A, B])
    mask[disk((400, 400), 7)] = True
    visit = _write_visit(tmp_path / "v", _photo(_texture(), mask), mask)
    again = shutil.copytree(visit, tmp_path / "v-again")  # a register holds each inspection once: a second visit of the same state
    out, register = tmp_path / "out", tmp_path / "site.gpkg"
    assert main(["compare", str(visit), str(again), "--out", str(out), "--vectors", "gpkg", "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    assert len({row["crack_after"] for row in _rows(out / "changes.csv") if row["crack_after"]}) == 3
    geometries = pyogrio.raw.read(out / "vectors" / "wall.gpkg", layer="changes")[2]
    assert len(geometries) >= 3
    with sqlite3.connect(register) as db:
        assert db.execute("SELECT count(*) FROM cracks").fetchone()[0] == 6


# The register: refused before any work, nothing appended without a compared pair, mm and classes of photos.


@pytest.mark.parametrize("case", ["after registered", "not a register", "exif dates out of order"])
def test_what_the_register_would_refuse_is_refused_before_any_work(tmp_path, two_visits, case, capsys):
    before, after = two_visits
    register = tmp_path / "site.gpkg"
    dates = ["--before-date", "2024-01-01", "--after-date", "2025-01-01"]
    if case == "after registered":
        assert main(["compare", str(before), str(after), "--out", str(tmp_path / "first"), "--register", str(register), *dates]) == 0
    elif case == "not a register":
        register.write_text("survey,date\n")
    else:
        exifs = []
        for visit, taken in ((before, "2025:06:01 10:00:00"), (after, "2024:06:01 10:00:00")):
            exif = Image.Exif()
            exif.get_ifd(0x8769)[36867] = taken
            target = _copy_visit(visit, tmp_path / f"exif-{visit.name}", [])
            Image.open(visit / "images" / "wall.png").save(target / "images" / "wall.jpg", quality=95, exif=exif)
            (target / "masks" / "wall.png").write_bytes((visit / "masks" / "wall.png").read_bytes())
            exifs.append(target)
        before, after, dates = *exifs, []
    original = register.read_bytes() if register.exists() else None
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(out), "--register", str(register), *dates])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert {"after registered": "is already registered", "not a register": "not a crack register",
            "exif dates out of order": "BEFORE's photos (EXIF) 2025-06-01 and AFTER's photos (EXIF) 2024-06-01"}[case] in err
    assert not out.exists() and (register.read_bytes() if register.exists() else None) == original


def test_a_comparison_without_a_registered_pair_appends_nothing(tmp_path, two_visits, capsys):
    before, _ = two_visits
    after = _write_visit(tmp_path / "after", np.full((SIZE, SIZE, 3), 128, np.uint8), _draw([A]))
    out, register = tmp_path / "out", tmp_path / "site.gpkg"
    assert main(["compare", str(before), str(after), "--out", str(out), "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    assert not register.exists()
    assert json.loads((out / "summary.json").read_text())["register"] == {"appended": False, "reason": "no pair was registered"}
    assert f"nothing appended to {register}: no pair was registered" in capsys.readouterr().out


def test_the_register_of_photos_has_mm_and_width_classes_with_a_pixel_size(tmp_path):
    """BEFORE cracks in mm through the registration's scale, as changes.csv gives them; AFTER ones by --px-size."""
    texture = _texture()
    visits = []
    for number, width in enumerate([3, 7]):
        mask = _draw([A, B[:4] + (width,)])
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    register, out = tmp_path / "site.gpkg", tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out), "--register", str(register), "--px-size", "0.5",
                 "--width-classes", "bre251", "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    changed = {(row["crack_before"], row["crack_after"]): row for row in _rows(out / "changes.csv")}
    with sqlite3.connect(register) as db:
        rows = db.execute("SELECT survey, crack, max_width_px, max_width_mm, max_width_class FROM cracks").fetchall()
    assert len(rows) == 4 and all(mm is not None and width_class for _, _, _, mm, width_class in rows)
    for survey, crack, _, mm, width_class in rows:
        side = "before" if survey == 1 else "after"
        row = next(row for key, row in changed.items() if key[survey - 1] == str(crack))
        assert mm == pytest.approx(float(row[f"max_width_mm_{side}"]), abs=1e-3)
        assert width_class == row[f"max_width_class_{side}"]


def test_a_class_change_is_judged_on_the_whole_crack_not_on_a_narrow_piece_of_it(tmp_path):
    """The AFTER mask breaks a 7 px crack into pieces, one of them 3 px wide: the crack did not change class, though
    that piece's own class is lower; the crack that widened from 3 to 7 px did."""
    texture = _texture()
    pieces = [(140, 60, 140, 160, 7), (140, 190, 140, 290, 7), (140, 320, 140, 420, 3)]
    visits = []
    for number, cracks in enumerate([[(140, 60, 140, 420, 7), A], [*pieces, A[:4] + (7,)]]):
        mask = _draw(cracks)
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    out = tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out), "--px-size", "0.1", "--width-classes", "0.5"]) == 0
    rows = _rows(out / "changes.csv")
    broken = [row for row in rows if float(row["top"]) > 120]
    assert len(broken) == 3 and len({row["crack_before"] for row in broken}) == 1
    assert {row["max_width_class_after"] for row in broken} == {"<=0.5", ">0.5"}  # each piece's own class
    assert not any(row["class_changed"] == "True" for row in broken)
    (widened,) = [row for row in rows if row not in broken]
    assert (widened["max_width_class_before"], widened["max_width_class_after"], widened["class_changed"]) == ("<=0.5", ">0.5", "True")
    assert json.loads((out / "summary.json").read_text())["width_classes"]["class_changed"] == 1
    assert _rows(out / "pairs.csv")[0]["class_changed"] == "1"


@pytest.mark.parametrize("preset, edge, on_edge", [("ec2", 0.3, "<=0.3"), ("mbei-rc", 0.3048, "CS2"), ("aci224", 0.30, "0.18-0.3")])
def test_a_crack_exactly_on_a_class_edge_has_one_class_in_changes_and_the_register(tmp_path, preset, edge, on_edge):
    """The pixel size puts the AFTER crack's max width on the edge up to float error (1e-12 over): changes.csv, rounded,
    and the register, which keeps the unrounded mm, must class it alike, on the side the standard puts the edge."""
    texture = _texture()
    visits = []
    for number, width in enumerate([3, 7]):
        mask = _draw([A, B[:4] + (width,)])
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    probe = tmp_path / "probe"
    assert main(["compare", *map(str, visits), "--out", str(probe)]) == 0
    widest = max(float(row["max_width_px_after"]) for row in _rows(probe / "changes.csv") if row["max_width_px_after"])
    px_size = edge / widest * (1 + 1e-12)
    register, out = tmp_path / "site.gpkg", tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out), "--register", str(register), "--px-size", repr(px_size),
                 "--width-classes", preset, "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    rows = _rows(out / "changes.csv")
    assert any(row["max_width_class_after"] == on_edge and float(row["max_width_mm_after"]) == edge for row in rows)
    with sqlite3.connect(register) as db:
        classes = dict(((survey, crack), width_class) for survey, crack, width_class in
                       db.execute("SELECT survey, crack, max_width_class FROM cracks").fetchall())
    for row in rows:
        for survey, side in ((1, "before"), (2, "after")):
            if row[f"crack_{side}"]:
                assert classes[(survey, int(row[f"crack_{side}"]))] == row[f"max_width_class_{side}"], (side, row)


def test_a_standard_grading_mean_width_classes_changes_and_the_register_by_mean_width(tmp_path):
    """ASTM D6433 grades a pavement crack by its mean width. A 3 px crack with a 15 px knot widens to 11 px: at 1 mm per
    pixel its max width stays M (the knot), its mean goes from L to M. changes.csv and the register name their class
    columns after the graded width, the class changed, and the summary and the report read those columns."""
    texture, knot = _texture(), (100, 200, 100, 215, 15)
    visits = []
    for number, width in enumerate([3, 11]):
        mask = _draw([(100, 60, 100, 400, width), knot])
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    register, out = tmp_path / "site.gpkg", tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out), "--register", str(register), "--px-size", "1", "--report",
                 "--width-classes", "d6433-ac", "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    (row,) = _rows(out / "changes.csv")
    assert float(row["mean_width_mm_before"]) < 10 <= float(row["mean_width_mm_after"]) and float(row["max_width_mm_before"]) >= 10
    assert (row["mean_width_class_before"], row["mean_width_class_after"], row["class_changed"]) == ("L", "M", "True")
    assert not any(key.startswith("max_width_class") for key in row)
    classes = json.loads((out / "summary.json").read_text())["width_classes"]
    assert (classes["name"], classes["graded"], classes["class_changed"]) == ("d6433-ac", "mean", 1)
    with sqlite3.connect(register) as db:
        assert db.execute("SELECT mean_width_class, max_width_class FROM cracks ORDER BY survey").fetchall() == [("L", None), ("M", None)]
    page = (out / "report.html").read_text(encoding="utf-8")
    data = json.loads(page.split("const DATA = ", 1)[1].split(";\nconst PAGE_ROWS", 1)[0])
    (change,) = data["pairs"][0]["changes"]
    assert (change["class_before"], change["class_after"], change["class_changed"]) == ("L", "M", True)
    assert data["summary"]["classes"] == "ASTM D6433, asphalt, by mean width"


def test_a_register_older_than_the_mean_width_class_gets_the_column(tmp_path):
    """Registers written before the standards that grade mean width have max_width_class alone: an append adds the other."""
    from crackseg.monitoring import history

    texture = _texture()
    visits = [_write_visit(tmp_path / f"v{number}", _photo(texture, _draw([A, B])), _draw([A, B])) for number in range(3)]
    register = tmp_path / "site.gpkg"
    dates = ["2023-01-01", "2024-01-01", "2025-01-01"]
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "o1"), "--register", str(register),
                 "--px-size", "1", "--width-classes", "bre251", "--before-date", dates[0], "--after-date", dates[1]]) == 0
    with sqlite3.connect(register) as db:
        db.execute('ALTER TABLE cracks DROP COLUMN "mean_width_class"')
    assert main(["compare", str(visits[1]), str(visits[2]), "--out", str(tmp_path / "o2"), "--register", str(register),
                 "--px-size", "1", "--width-classes", "bre251", "--before-date", dates[1], "--after-date", dates[2]]) == 0
    with sqlite3.connect(register) as db:
        rows = db.execute("SELECT survey, max_width_class, mean_width_class FROM cracks ORDER BY survey, crack").fetchall()
    assert [(survey, bool(max_class), mean_class) for survey, max_class, mean_class in rows] == \
        [(1, True, None), (1, True, None), (2, True, None), (2, True, None), (3, True, None), (3, True, None)]
    assert len(history.width_history(register, dates[0], "wall", 1)) == 3


@pytest.mark.parametrize("flags", [["--px-size", "1", "--width-classes", "d6433-ac"], ["--px-size", "1"], [],
                                   ["--px-size", "0.5", "--width-classes", "bre251"]])
def test_a_register_refuses_another_unit_or_standard_before_anything_is_written_but_takes_another_camera(tmp_path, capsys, flags):
    """The survey both comparisons share would hold its cracks in one unit and standard, the next survey in another; its
    pixel size is not this comparison's (--px-size is the AFTER photos'): a new camera's is taken."""
    texture = _texture()
    visits = [_write_visit(tmp_path / f"v{number}", _photo(texture, _draw([A, B])), _draw([A, B])) for number in range(3)]
    register = tmp_path / "site.gpkg"
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "o1"), "--register", str(register),
                 "--px-size", "1", "--width-classes", "bre251", "--before-date", "2023-01-01", "--after-date", "2024-01-01"]) == 0
    kept = register.read_bytes()
    capsys.readouterr()
    chained = ["compare", str(visits[1]), str(visits[2]), "--out", str(tmp_path / "o2"), "--register", str(register), *flags,
               "--before-date", "2024-01-01", "--after-date", "2025-01-01"]
    if flags == ["--px-size", "0.5", "--width-classes", "bre251"]:
        assert main(chained) == 0
        surveys = sqlite3.connect(register).execute("SELECT date, px_size_mm FROM surveys ORDER BY date").fetchall()
        assert surveys == [("2023-01-01", 1.0), ("2024-01-01", 1.0), ("2025-01-01", 0.5)]
        return
    with pytest.raises(SystemExit) as exit:
        main(chained)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and "a register holds its site in one" in err, err
    assert register.read_bytes() == kept and not any((tmp_path / "o2").glob("*.csv"))


MADE_WITH = ["--px-size", "1", "--width-classes", "bre251"]


@pytest.mark.parametrize("made_with, flags, message", [
    (MADE_WITH, ["--px-size", "0.5", "--width-classes", "ec2"], "a register holds its site in one standard"),
    (MADE_WITH, ["--px-size", "0.5"], "a register holds its site in one standard"),
    ([], ["--px-size", "0.5"], "a register holds its site in one unit"),
    (["--px-size", "1"], [], "a register holds its site in one unit"),
    (MADE_WITH, ["--px-size", "0.5", "--width-classes", "bre251"], None),  # another camera: another pixel size, the same standard
])
def test_a_later_survey_after_a_gap_keeps_the_registers_standard_and_unit(tmp_path, capsys, made_with, flags, message):
    """A comparison that starts a new, later survey shares no survey with the register, and is held to its standard."""
    texture = _texture()
    visits = [_write_visit(tmp_path / f"v{number}", _photo(texture, _draw([A, B])), _draw([A, B])) for number in range(4)]
    register = tmp_path / "site.gpkg"
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "o1"), "--register", str(register),
                 *made_with, "--before-date", "2023-01-01", "--after-date", "2024-01-01"]) == 0
    kept = register.read_bytes()
    capsys.readouterr()
    later = ["compare", str(visits[2]), str(visits[3]), "--out", str(tmp_path / "o2"), "--register", str(register), *flags,
             "--before-date", "2026-01-01", "--after-date", "2027-01-01"]
    if message is None:
        assert main(later) == 0
        return
    with pytest.raises(SystemExit) as exit:
        main(later)
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert register.read_bytes() == kept and not any((tmp_path / "o2").glob("*.csv"))


def test_a_register_of_photos_from_moving_viewpoints_chains_with_its_pixel_size_and_standard(tmp_path):
    """The shared survey's mm differ between its two comparisons (each measures it in the other photo's scale): the
    register checks the scale given, not those mm."""
    texture, mask = _texture(), _draw([A, B, C])

    def seen(move: SimilarityTransform) -> tuple[np.ndarray, np.ndarray]:
        photo = warp(_photo(texture, mask), move.inverse, preserve_range=True, order=1, mode="edge").round().astype(np.uint8)
        return photo, warp(mask.astype(float), move.inverse, order=1) > 0.5

    visits = [_write_visit(tmp_path / "v0", _photo(texture, mask), mask),
              _write_visit(tmp_path / "v1", *seen(SimilarityTransform(scale=1.03, translation=(-5, 4)))),
              _write_visit(tmp_path / "v2", *seen(SimilarityTransform(scale=1.06, rotation=0.03, translation=(-9, 6))))]
    register, dates = tmp_path / "site.gpkg", ["2023-01-01", "2024-01-01", "2025-01-01"]
    for number in (0, 1):
        assert main(["compare", str(visits[number]), str(visits[number + 1]), "--out", str(tmp_path / f"c{number}"), "--register",
                     str(register), "--px-size", "1", "--width-classes", "bre251", "--before-date", dates[number],
                     "--after-date", dates[number + 1]]) == 0
    with sqlite3.connect(register) as db:
        assert db.execute("SELECT px_size_mm, width_classes FROM surveys").fetchall() == [(1.0, "bre251")] * 3


def test_a_crack_removed_from_the_register_is_refused_before_anything_is_written_and_its_key_never_reused(tmp_path, capsys):
    texture = _texture()
    visits = [_write_visit(tmp_path / f"v{number}", _photo(texture, _draw([A, B])), _draw([A, B])) for number in range(3)]
    register = tmp_path / "site.gpkg"
    assert main(["compare", str(visits[0]), str(visits[1]), "--out", str(tmp_path / "o1"), "--register", str(register),
                 "--before-date", "2023-01-01", "--after-date", "2024-01-01"]) == 0
    with sqlite3.connect(register) as db:  # as QGIS deletes a feature: its links stay
        (last,) = db.execute("SELECT max(crack_key) FROM cracks").fetchone()
        db.execute("DELETE FROM cracks WHERE crack_key = ?", (last,))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit:
        main(["compare", str(visits[1]), str(visits[2]), "--out", str(tmp_path / "o2"), "--register", str(register),
              "--before-date", "2024-01-01", "--after-date", "2025-01-01"])
    assert exit.value.code == 2 and "removed from the register" in capsys.readouterr().err
    assert not any((tmp_path / "o2").glob("*.csv"))
    from crackseg.monitoring import history

    with sqlite3.connect(register) as db:  # the whole survey removed: the next comparison registers it afresh
        db.execute("DELETE FROM surveys WHERE survey = 2")
        db.execute("DELETE FROM cracks WHERE survey = 2")
    assert main(["compare", str(visits[1]), str(visits[2]), "--out", str(tmp_path / "o4"), "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    with sqlite3.connect(register) as db:
        keys = [key for (key,) in db.execute("SELECT crack_key FROM cracks WHERE survey > 1")]
    assert last not in keys  # the deleted crack's links lead to no new crack
    assert len(history.width_history(register, "2023-01-01", "wall", 1)) == 1


def _register_lock(register: Path, pid: int) -> Path:
    """The register's lock as a compare of process ``pid`` on this host leaves it when it is killed (core.locks' record)."""
    import socket

    lock = register.with_name(f".{register.name}.lock")
    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "process_start": None, "since": "earlier",
                                "job": None, "attempt": 0}) + "\n")
    return lock


def test_a_register_lock_of_a_killed_compare_is_taken_over_and_a_live_one_refused(tmp_path, two_visits, capsys):
    before, after = two_visits
    register = tmp_path / "site.gpkg"
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()
    lock = _register_lock(register, killed.pid)
    left = tmp_path / ".site.gpkg.0a1b2c3d.crackseg-tmp.gpkg"  # the register it was building (an older crackseg: its copy)
    left.write_bytes(b"half a register")
    assert main(["compare", str(before), str(after), "--out", str(tmp_path / "first"), "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    assert f"{lock}: left by pid {killed.pid} on this host, which is no longer running; taking it over" in capsys.readouterr().err
    assert not lock.exists() and not left.exists()
    with sqlite3.connect(register) as db:
        assert db.execute("SELECT count(*) FROM surveys").fetchone()[0] == 2
    original = register.read_bytes()

    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        _register_lock(register, running.pid)
        with pytest.raises(SystemExit) as stop:
            main(["compare", str(after), str(before), "--out", str(tmp_path / "second"), "--register", str(register),
                  "--before-date", "2025-01-01", "--after-date", "2026-01-01"])
    finally:
        running.kill()
        running.wait()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1
    assert f"{register}: another crackseg compare is appending to it: pid {running.pid} on " in err and f"delete {lock} " in err
    assert register.read_bytes() == original and lock.exists()


def test_the_register_lock_is_held_while_the_pairs_are_compared(tmp_path, two_visits, monkeypatch):
    """A second compare into the register is refused before its work, not after it."""
    from crackseg.monitoring import compare as compare_module

    register = tmp_path / "site.gpkg"
    lock = register.with_name(f".{register.name}.lock")
    holders = []

    def compare_pair(*args, **kwargs):
        holders.append(json.loads(lock.read_text())["pid"] if lock.exists() else None)
        return real(*args, **kwargs)

    real = compare_module.compare_pair
    monkeypatch.setattr(compare_module, "compare_pair", compare_pair)
    assert main(["compare", *map(str, two_visits), "--out", str(tmp_path / "out"), "--register", str(register),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    assert holders and set(holders) == {os.getpid()}
    assert not lock.exists()
    with sqlite3.connect(register) as db:
        assert db.execute("SELECT count(*) FROM surveys").fetchone()[0] == 2


def test_the_register_names_itself_when_the_geo_libraries_are_missing(tmp_path, two_visits, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyogrio", None)  # import pyogrio raises ImportError
    with pytest.raises(SystemExit):
        main(["compare", *map(str, two_visits), "--out", str(tmp_path / "out"), "--register", str(tmp_path / "site.gpkg")])
    assert "--register needs pyogrio; pip install 'crackseg[geo]'" in capsys.readouterr().err


# --out and what is in it.


def test_out_that_is_another_predictions_folder_is_refused(two_visits, tmp_path, capsys):
    third = _predictions(tmp_path / "third", two_visits[0], "wall", "wall.png", {})
    before = sorted(path for path in third.rglob("*"))
    with pytest.raises(SystemExit) as stop:
        main(["compare", *map(str, two_visits), "--out", str(third), "--overwrite"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and f"--out {third}: a predictions folder" in err
    assert sorted(path for path in third.rglob("*")) == before


def test_out_inside_an_inspection_is_refused(two_visits, capsys):
    before, after = two_visits
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(before / "changes")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "lies in the BEFORE inspection" in err
    assert not (before / "changes").exists()


def test_layers_and_pictures_of_an_earlier_compare_are_refused_and_replaced_with_overwrite_only(tmp_path, two_visits, capsys):
    before, _ = two_visits
    out = tmp_path / "out"
    layer, picture = out / "vectors" / "old.geojson", out / "report" / "pair7-before.jpg"
    temp = out / "vectors" / "site" / ".wall.gpkg.0a1b.crackseg-tmp.gpkg"  # left by an interrupted compare
    mine = [out / "vectors" / "site_outline.geojson", out / "vectors" / "my_style.qml", out / "report" / "pair_photo_of_the_site.jpg",
            out / "report" / "pair0-after-annotated.jpg", out / "report" / "pair7-notes.jpg"]
    for path in (layer, picture, temp, *mine):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"earlier")
    (out / "pairs.csv").write_text("pair,name_before,name_after,status\n7,old,old,registered\n")  # whose layer and pictures those are
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(before), "--out", str(out)])
    assert stop.value.code == 2 and "pairs.csv already exists" in capsys.readouterr().err
    assert main(["compare", str(before), str(before), "--out", str(out), "--report", "--overwrite"]) == 0
    assert not any(path.exists() for path in (layer, picture, temp))
    assert all(path.read_bytes() == b"earlier" for path in mine)  # never claimed, never removed
    assert (out / "report" / "pair0-before.jpg").exists() and (out / "report.html").exists()
    assert main(["compare", str(before), str(before), "--out", str(out), "--overwrite"]) == 0  # no --report this time
    assert not (out / "report.html").exists()
    assert sorted((out / "report").iterdir()) == sorted(path for path in mine if path.parent.name == "report")


@pytest.mark.parametrize("case", ["picture without pairs.csv", "layer without pairs.csv", "geopackage with a layer of mine",
                                  "register in vectors"])
def test_a_file_of_the_users_where_compare_writes_is_refused_even_with_overwrite(tmp_path, two_visits, case, capsys):
    before, after = two_visits
    out = tmp_path / "out"
    flags = ["--report"] if case.startswith("picture") else ["--vectors", "gpkg" if "geopackage" in case or "register" in case else "geojson"]
    if case == "register in vectors":
        assert main(["compare", str(before), str(after), "--out", str(out), "--register", str(out / "vectors" / "wall.gpkg"),
                     "--before-date", "2025-06-01", "--after-date", "2026-06-01"]) == 0
    elif case == "geopackage with a layer of mine":
        assert main(["compare", str(before), str(after), "--out", str(out), *flags]) == 0
        import pyogrio.raw
        import shapely
        pyogrio.raw.write(out / "vectors" / "wall.gpkg", geometry=np.array([shapely.to_wkb(shapely.Point(3, 4))], dtype=object),
                          field_data=[np.array(["spalling"], dtype=object)], fields=["note"], layer="notes", driver="GPKG",
                          geometry_type="Point", crs="EPSG:32633", append=True)
    else:
        path = out / ("report/pair0-before.jpg" if case.startswith("picture") else "vectors/wall.geojson")
        path.parent.mkdir(parents=True)
        path.write_bytes(b"mine")
    mine = {path: path.read_bytes() for path in out.rglob("*") if path.is_file()}
    for overwrite in ([], ["--overwrite"]):
        with pytest.raises(SystemExit) as stop:
            main(["compare", str(before), str(after), "--out", str(out), *flags, *overwrite])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1 and "is not an earlier compare's output" in err
        assert {path: path.read_bytes() for path in out.rglob("*") if path.is_file()} == mine


def test_the_pictures_and_layers_of_an_interrupted_compare_are_its_own_to_replace(tmp_path, two_visits, monkeypatch, capsys):
    import crackseg.monitoring.compare as compare

    before = _copy_visit(two_visits[0], tmp_path / "v1", ["one", "two"])
    after = _copy_visit(two_visits[1], tmp_path / "v2", ["one", "two"])
    out, real = tmp_path / "out", compare.compare_pair

    def interrupted(index, *args):
        if index == 1:
            raise KeyboardInterrupt
        return real(index, *args)

    monkeypatch.setattr(compare, "compare_pair", interrupted)
    assert main(["compare", str(before), str(after), "--out", str(out), "--report", "--vectors", "geojson"]) == 130  # Ctrl-C
    monkeypatch.undo()
    assert (out / "report" / "pair0-before.jpg").is_file() and (out / "vectors" / "one.geojson").is_file()
    assert not (out / "pairs.csv").exists()
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(out), "--report", "--vectors", "geojson"])
    assert stop.value.code == 2 and "already exists; choose another --out or pass --overwrite" in capsys.readouterr().err
    assert main(["compare", str(before), str(after), "--out", str(out), "--report", "--vectors", "geojson", "--overwrite"]) == 0
    assert (out / "report" / "pair1-after.jpg").is_file() and (out / "vectors" / "two.geojson").is_file()
    assert not list(out.glob(".*")), "a hidden file left in --out"


@pytest.mark.parametrize("sub", ["report", "vectors"])
def test_an_output_folder_that_is_a_file_is_one_line_before_any_work(tmp_path, two_visits, sub, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / sub).write_text("mine")
    with pytest.raises(SystemExit) as stop:
        main(["compare", *map(str, two_visits), "--out", str(out), "--report" if sub == "report" else "--vectors=gpkg"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and f"{out / sub} is a file, not a folder" in err
    assert sorted(out.iterdir()) == [out / sub]


def test_the_out_lock_is_released_when_preparing_the_folder_fails(tmp_path, two_visits, monkeypatch, capsys):
    def fail(folder):
        raise OSError("disk gone")

    monkeypatch.setattr("crackseg.monitoring.comparison_folder.remove_orphan_temps", fail)
    with pytest.raises(SystemExit) as stop:
        main(["compare", *map(str, two_visits), "--out", str(tmp_path / "out")])
    assert stop.value.code == 1 and "disk gone" in capsys.readouterr().err
    assert not (tmp_path / "out" / "lock").exists()


# Pixel sizes.


def test_width_classes_without_any_pixel_size_are_refused_before_any_work(tmp_path, two_visits, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["compare", *map(str, two_visits), "--out", str(tmp_path / "out"), "--width-classes", "bre251"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "--width-classes needs the pixel size in mm: give --px-size" in err
    assert not (tmp_path / "out").exists()


def test_px_size_gives_mm_to_rasters_whose_crs_has_no_scale(tmp_path):
    """Degrees have no size in mm: --px-size does, as for photos."""
    mask, visit = _draw([A, B]), tmp_path / "v"
    _write_geotiff(visit / "images" / "ortho.tif", _photo(_texture(), mask), (10.0, 50.0), 1e-7, "EPSG:4326")
    _write_geotiff(visit / "masks" / "ortho.tif", mask.astype(np.uint8) * 255, (10.0, 50.0), 1e-7, "EPSG:4326")
    out = tmp_path / "out"
    assert main(["compare", str(visit), str(visit), "--out", str(out), "--px-size", "2", "--width-classes", "bre251"]) == 0
    rows = _rows(out / "changes.csv")
    assert rows and all(float(row["length_mm_after"]) == pytest.approx(2 * float(row["length_px_after"]), rel=1e-4) for row in rows)
    assert all(row["max_width_class_after"] for row in rows)


# Predictions folders: the paths predictions.csv gives, the settings summary.json gives.


def _predictions(root: Path, visit: Path, name: str, photo: str, summary: dict) -> Path:
    """A predictions folder as predict writes it when run from ``root.parent`` with --out ROOT.name."""
    mask = root / "masks" / f"{name}.png"
    mask.parent.mkdir(parents=True)
    mask.write_bytes((visit / "masks" / "wall.png").read_bytes())
    (root / "predictions.csv").write_text(f"path,mask,status\n{photo},{root.name}/masks/{name}.png,ok\n")
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def test_predictions_folders_find_their_photos_and_names_as_predict_wrote_them(tmp_path, two_visits, monkeypatch, capsys):
    """predict ran in run/ (paths relative to it), names hold a folder called masks, lengths were in mm."""
    run = tmp_path / "run"
    (run / "photos").mkdir(parents=True)
    (run / "photos" / "wall.png").write_bytes((two_visits[0] / "images" / "wall.png").read_bytes())
    predicted = _predictions(run / "preds", two_visits[0], "site/masks/wall", "photos/wall.png", {"join_gap_px": None, "min_length_px": None})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["compare", str(predicted), str(predicted), "--out", "out"]) == 0
    pair = _rows(elsewhere / "out" / "pairs.csv")[0]
    assert pair["name_after"] == "site/masks/wall" and pair["status"] == "registered"
    assert "crack ids may differ from" in capsys.readouterr().err


def test_photos_are_found_where_predict_ran_wherever_compare_and_report_run(tmp_path, two_visits, dark_checkpoint, monkeypatch):
    """Another site's photos under the same relative path, in the folder compare and report run in, are not used."""
    site_a, site_b = tmp_path / "siteA", tmp_path / "siteB"
    for site in (site_a, site_b):
        (site / "photos").mkdir(parents=True)
    photo = np.asarray(Image.open(two_visits[0] / "images" / "wall.png"))
    Image.fromarray(photo).save(site_b / "photos" / "wall.png")
    Image.fromarray(np.full_like(photo, 128)).save(site_a / "photos" / "wall.png")  # featureless: would not register
    monkeypatch.chdir(site_b)
    assert predict_cli("--checkpoint", dark_checkpoint, "photos/wall.png", "--out", "pred") == 0
    monkeypatch.chdir(site_a)
    assert main(["compare", "../siteB/pred", "../siteB/pred/.", "--out", "changes"]) == 0
    assert _rows(site_a / "changes" / "pairs.csv")[0]["status"] == "registered"
    assert main(["report", "../siteB/pred"]) == 0
    shown = np.asarray(Image.open(site_b / "pred" / "report" / "photos" / "wall.jpg").convert("L"), float)
    assert shown.std() > 10  # site B's textured photo, not site A's flat grey


def test_a_predicted_photo_that_is_nowhere_fails_its_pair_and_dates_say_so(tmp_path, two_visits, capsys):
    predicted = _predictions(tmp_path / "preds", two_visits[0], "wall", "gone/wall.png", {})
    out = tmp_path / "out"
    assert main(["compare", str(predicted), str(predicted), "--out", str(out)]) == 1
    pair = _rows(out / "pairs.csv")[0]
    assert pair["status"] == "failed" and pair["reason"] == "photo not found: gone/wall.png"
    with pytest.raises(SystemExit):
        main(["compare", str(predicted), str(predicted), "--out", str(tmp_path / "out2"), "--register", str(tmp_path / "site.gpkg")])
    assert "its photos were not found (e.g. gone/wall.png)" in capsys.readouterr().err


def test_lengths_predict_gave_in_mm_are_converted_by_each_raster_own_pixel_size(tmp_path, monkeypatch):
    from crackseg.monitoring import date_cracks

    visit = _geo_visit(tmp_path / "v", [A], (500_000, 6_000_000), 0.01)  # 10 mm pixels
    root = tmp_path / "preds"
    (root / "masks").mkdir(parents=True)
    (root / "masks" / "ortho.tif").write_bytes((visit / "masks" / "ortho.tif").read_bytes())
    (root / "predictions.csv").write_text(f"path,mask,status\n{visit / 'images' / 'ortho.tif'},{root / 'masks' / 'ortho.tif'},ok\n")
    (root / "summary.json").write_text(json.dumps({"join_gap_px": None, "join_gap_mm": 50, "min_length_px": None, "min_length_mm": 100}))
    measured = []
    measure = date_cracks.measure_date
    monkeypatch.setattr(date_cracks, "measure_date", lambda mask, gap, shortest: measured.append((gap, shortest)) or measure(mask, gap, shortest))
    assert main(["compare", str(root), str(root), "--out", str(tmp_path / "out")]) == 0
    assert measured == [(5.0, 10.0), (5.0, 10.0)]


def test_comparing_prediction_folders_does_not_load_torch(tmp_path, two_visits):
    """compare uses no model: importing torch would triple the start-up of a small job."""
    run = tmp_path / "run"
    (run / "photos").mkdir(parents=True)
    (run / "photos" / "wall.png").write_bytes((two_visits[0] / "images" / "wall.png").read_bytes())
    predicted = _predictions(run / "preds", two_visits[0], "wall", str(run / "photos" / "wall.png"), {})
    code = ("import sys; from crackseg.cli.main import main; "
            f"code = main(['compare', {str(predicted)!r}, {str(predicted)!r}, '--out', {str(tmp_path / 'out')!r}, '--report', '--vectors', 'gpkg']); "
            "sys.exit(10 + code if 'torch' in sys.modules else code)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert _rows(tmp_path / "out" / "pairs.csv")[0]["status"] == "registered"


# The register extended in place: another program holding it, a register inside --out, what cannot take the comparison.


def _three_visits(root: Path) -> list[Path]:
    """Three visits of one wall: B widens from 3 to 5 to 9 px."""
    texture = _texture()
    visits = []
    for number, width in enumerate([3, 5, 9], 1):
        mask = _draw([A, B[:4] + (width,)])
        visits.append(_write_visit(root / f"v{number}", _photo(texture, mask), mask))
    return visits


DATES = ["2024-05-01", "2025-05-02", "2026-05-03"]


def _register_visit(visits: list[Path], number: int, out: Path, register: Path | None, *flags: str) -> int:
    """compare visit ``number`` with the next one into ``out`` (and ``register`` when given)."""
    extra = ["--register", str(register), "--before-date", DATES[number], "--after-date", DATES[number + 1]] if register else []
    return main(["compare", str(visits[number]), str(visits[number + 1]), "--out", str(out), *extra, *flags])


def test_a_register_open_in_qgis_in_wal_mode_keeps_its_saved_edit_and_gets_the_new_survey(tmp_path):
    pyogrio = pytest.importorskip("pyogrio")
    visits, register = _three_visits(tmp_path), tmp_path / "site.gpkg"
    assert _register_visit(visits, 0, tmp_path / "c0", register) == 0
    qgis = sqlite3.connect(register)  # QGIS holds the GeoPackage open in WAL mode, its edit saved (in the -wal file)
    try:
        assert qgis.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        with qgis:
            qgis.execute("UPDATE surveys SET source = 'visit 1, checked on site' WHERE survey = 1")
        assert Path(f"{register}-wal").exists() and Path(f"{register}-shm").exists()
        assert _register_visit(visits, 1, tmp_path / "c1", register) == 0
    finally:
        qgis.close()
    with sqlite3.connect(register) as db:
        assert [row[0] for row in db.execute("SELECT source FROM surveys ORDER BY survey")] == [
            "visit 1, checked on site", visits[1].name, visits[2].name]  # beside the register: relative to its folder
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    info = pyogrio.read_info(register, layer="cracks", force_feature_count=True)
    assert info["features"] == 6 and info["geometry_type"] == "MultiLineString"
    assert len(pyogrio.raw.read(register, layer="cracks")[2]) == 6


def test_a_register_inside_out_survives_a_compare_that_overwrites_out(tmp_path):
    """--overwrite replaces what compare wrote in --out (its tables, pictures and change layers), never a register there,
    whether the later compare names it or not."""
    visits, out = _three_visits(tmp_path), tmp_path / "out"
    register = out / "vectors" / "site.gpkg"
    assert _register_visit(visits, 0, out, register, "--vectors", "gpkg") == 0
    assert _register_visit(visits, 0, out, None, "--vectors", "gpkg", "--overwrite") == 0  # no --register this time
    assert _register_visit(visits, 1, out, register, "--vectors", "gpkg", "--overwrite") == 0
    with sqlite3.connect(register) as db:
        assert [row[0] for row in db.execute("SELECT date FROM surveys ORDER BY survey")] == DATES
    assert sorted(path.name for path in (out / "vectors").iterdir()) == ["site.gpkg", "wall.gpkg"]


@pytest.fixture(scope="module")
def site_register(two_visits, tmp_path_factory) -> Path:
    """A register of the two visits, dated 2024-01-01 and 2025-01-01 (copy it before changing it)."""
    root = tmp_path_factory.mktemp("site")
    assert main(["compare", *map(str, two_visits), "--out", str(root / "out"), "--register", str(root / "site.gpkg"),
                 "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    return root / "site.gpkg"


@pytest.mark.parametrize("case", ["read-only file", "read-only folder", "another crs", "same inspection", "another program writing",
                                  "another compare appending", "a layer of out"])
def test_a_register_that_cannot_take_the_comparison_is_refused_before_any_work(tmp_path, two_visits, site_register, case,
                                                                              monkeypatch, capsys):
    before, after = two_visits[1], shutil.copytree(two_visits[0], tmp_path / "third")  # the next visit, 2026
    register, out, flags = tmp_path / "site" / "site.gpkg", tmp_path / "out", ["--before-date", "2025-01-01", "--after-date", "2026-01-01"]
    register.parent.mkdir()
    shutil.copyfile(site_register, register)
    writer = None
    if case == "read-only file":
        register.chmod(0o444)
        message = f"{register}: is read-only (mode 0444)"
    elif case == "read-only folder":
        if os.geteuid() == 0:  # root writes anywhere but on a read-only mount: the error such a mount gives
            read_only_mount(monkeypatch, register.parent)
        else:
            register.parent.chmod(0o555)
        message = f"{register}: its folder {register.parent} cannot be written"
    elif case == "another crs":
        before = _geo_visit(tmp_path / "g1", [A, B], (500_000, 6_000_000), 0.01)
        after = _geo_visit(tmp_path / "g2", [A, B], (500_000, 6_000_000), 0.01)
        flags = ["--before-date", "2026-01-01", "--after-date", "2027-01-01"]
        message = f"{register}: its cracks are in pixel coordinates (no CRS), this comparison's in EPSG:32633"
    elif case == "same inspection":
        after = before
        message = f"{register}: BEFORE and AFTER are the same inspection {before.resolve()}"
    elif case == "another program writing":
        monkeypatch.setattr("crackseg.monitoring.register_file.BUSY_TIMEOUT_S", 0.2, raising=False)
        writer = sqlite3.connect(register, isolation_level=None)
        writer.execute("BEGIN EXCLUSIVE")  # committing its edits
        message = f"{register}: busy: another program is writing to it (SQLite: database is locked"
    elif case == "another compare appending":
        lock = _register_lock(register, os.getpid())  # a live process: this one
        message = f"{register}: another crackseg compare is appending to it: pid {os.getpid()} on "
    else:
        register = out / "vectors" / "wall.gpkg"
        before, after, flags = *two_visits, ["--vectors", "gpkg", "--before-date", "2024-01-01", "--after-date", "2025-01-01"]
        message = f"--register {register}: is vectors/wall.gpkg, a file this compare writes in --out"
    original = register.read_bytes() if register.exists() else None
    try:
        with pytest.raises(SystemExit) as stop:
            main(["compare", str(before), str(after), "--out", str(out), "--register", str(register), *flags])
    finally:
        if writer is not None:
            writer.close()
        if register.parent.exists():
            register.parent.chmod(0o755)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert not out.exists() and (register.read_bytes() if register.exists() else None) == original
    if case == "read-only file":
        assert stat.S_IMODE(register.stat().st_mode) == 0o444
    if case == "another compare appending":
        assert lock.exists()


def test_the_change_layer_and_the_register_open_in_qgis_styled(tmp_path):
    """The change layer's default style colours its status as the report does, the register's its cracks by the graded
    width class; GDAL reads both back as written. compare --overwrite without --vectors then removes that change layer
    (an earlier compare's, its style table beside it), never the register."""
    pyogrio = pytest.importorskip("pyogrio")
    from crackseg.monitoring.report import STATUS_COLOURS

    texture, visits = _texture(), []
    for number, width in enumerate([3, 7]):
        mask = _draw([A, B[:4] + (width,)])
        visits.append(_write_visit(tmp_path / f"v{number}", _photo(texture, mask), mask))
    register, out = tmp_path / "site.gpkg", tmp_path / "out"
    assert main(["compare", *map(str, visits), "--out", str(out), "--vectors", "gpkg", "--register", str(register), "--px-size",
                 "0.5", "--width-classes", "bre251", "--before-date", "2024-01-01", "--after-date", "2025-01-01"]) == 0
    layer = out / "vectors" / "wall.gpkg"
    renderers = {}
    for path, name in ((layer, "changes"), (register, "cracks")):
        geometry = pyogrio.read_info(path, layer=name)["geometry_name"]
        where = f"f_table_schema = '' AND f_table_name = '{name}' AND f_geometry_column = '{geometry}' AND useAsDefault"
        info, _, _, fields = pyogrio.raw.read(path, layer="layer_styles", where=where, read_geometry=False)
        (qml,) = dict(zip(info["fields"], fields))["styleQML"]
        renderers[name] = ET.fromstring(qml).find("renderer-v2")
        with closing(sqlite3.connect(path)) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    changes = renderers["changes"]
    assert (changes.get("type"), changes.get("attr")) == ("categorizedSymbol", "status")
    assert [category.get("value") for category in changes.iter("category")] == list(STATUS_COLOURS)
    colours = [option.get("value") for option in changes.iter("Option") if option.get("name") == "line_color"]
    assert colours == [",".join(map(str, (*colour, 255))) for colour in STATUS_COLOURS.values()]
    cracks = renderers["cracks"]
    assert cracks.get("attr") == "max_width_class"
    assert [category.get("value") for category in cracks.iter("category")] == ["0", "1", "2", "3", "4", "5", ""]

    assert main(["compare", *map(str, visits), "--out", str(out), "--overwrite"]) == 0
    assert not layer.exists() and register.exists()


def test_the_register_links_a_crack_whose_other_date_is_below_the_minimum_length_with_changes_csv_status(tmp_path):
    """A 7 px crack (no crack of visit 1's tables) grew to 40 px: longer in changes.csv, and not new in the register."""
    texture, short, grown, long = _texture(), (100, 50, 100, 56, 3), (100, 50, 100, 89, 3), (300, 20, 300, 400, 3)
    visits = [_write_visit(tmp_path / f"v{n}", _photo(texture, _draw(cracks)), _draw(cracks))
              for n, cracks in ((1, [short, long]), (2, [grown, long]))]
    assert _register_visit(visits, 0, tmp_path / "c", tmp_path / "site.gpkg") == 0
    grew = [row for row in _rows(tmp_path / "c" / "changes.csv") if row["crack_before"] == ""]
    assert [(row["status"], row["crack_after"]) for row in grew] == [("longer", "2")]
    with sqlite3.connect(tmp_path / "site.gpkg") as db:
        links = db.execute("SELECT l.before_key, a.crack, l.status FROM links AS l JOIN cracks AS a ON a.crack_key = l.after_key "
                           "WHERE l.before_key IS NULL").fetchall()
    assert links == [(None, 2, "longer")]
