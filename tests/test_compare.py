"""crackseg compare end to end: inspections with known truth (a crack extended, one widened, one added,
one removed, the camera moved), GeoTIFF pairs with different origins, the register over three visits."""

from __future__ import annotations

import csv
import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage
from skimage.draw import line as draw_line
from skimage.transform import SimilarityTransform, warp

from crackseg.cli import main
from conftest import predict_cli
from test_report import browser, needs_browser

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


def test_an_unchanged_visit_is_unchanged_everywhere(two_visits, tmp_path):
    before, _ = two_visits
    out = tmp_path / "same"
    assert main(["compare", str(before), str(before), "--out", str(out)]) == 0
    statuses = {row["status"] for row in _rows(out / "changes.csv")}
    assert statuses == {"unchanged"}


def test_a_pair_without_features_is_unregistered_and_not_compared(tmp_path, two_visits, capsys):
    before, _ = two_visits
    blank = np.full((SIZE, SIZE, 3), 128, np.uint8)
    after = _write_visit(tmp_path / "after", blank, _draw([A]))
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out)]) == 0
    pair = _rows(out / "pairs.csv")[0]
    assert pair["status"] == "unregistered" and pair["reason"]
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
    assert "32633" in json.dumps(layer.get("crs", {}))


def test_geotiffs_in_different_crss_are_one_line(tmp_path, capsys):
    before = _geo_visit(tmp_path / "v1", [A], (500_000, 6_000_000), 0.01)
    after = _geo_visit(tmp_path / "v2", [A], (500_000, 6_000_000), 0.01, crs="EPSG:32634")
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "EPSG:32633" in err and "EPSG:32634" in err and err.count("\n") == 1


def test_the_register_accumulates_three_visits(tmp_path):
    """Visit 3 widens B again; the register follows B from visit 1 through 3 in one query."""
    from crackseg.history import width_history

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
    crack_b = next(int(row["crack_before"]) for row in _rows(tmp_path / "c0" / "changes.csv") if row["status"] == "wider")
    history = width_history(register, dates[0], "wall", crack_b)
    assert [row["date"] for row in history] == dates and [row["status"] for row in history] == [None, "wider", "wider"]
    widths = [row["max_width_px"] for row in history]
    assert widths == sorted(widths) and widths[-1] - widths[0] == pytest.approx(6, abs=1.5)


def test_the_register_needs_dates(tmp_path, two_visits, capsys):
    before, after = two_visits
    with pytest.raises(SystemExit) as stop:
        main(["compare", str(before), str(after), "--out", str(tmp_path / "out"), "--register", str(tmp_path / "site.gpkg")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--before-date" in err and not (tmp_path / "site.gpkg").exists()


def test_the_register_dates_surveys_by_their_photos_exif(tmp_path):
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


@needs_browser
def test_the_report_of_a_comparison_renders_in_a_real_browser(two_visits, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    out = tmp_path / "out"
    assert main(["compare", *map(str, two_visits), "--out", str(out), "--report", "--px-size", "0.5"]) == 0
    driver = browser()
    try:
        driver.get((out / "report.html").as_uri())
        assert [s.get_attribute("id") for s in driver.find_elements(By.CSS_SELECTOR, "section.pair")] == ["pair-0"]
        for picture in driver.find_elements(By.CSS_SELECTOR, "section.pair img"):
            driver.execute_script("arguments[0].scrollIntoView()", picture)
            WebDriverWait(driver, 10).until(lambda _: driver.execute_script("return arguments[0].complete", picture))
        assert driver.execute_script("return [...document.querySelectorAll('section.pair img')].map(i => i.naturalWidth)") == [SIZE, SIZE]
        page = driver.find_element(By.CSS_SELECTOR, "#pair-0").text
        assert all(status in page for status in ("longer", "wider", "new", "gone", "unchanged")) and "mm" in page
        assert not [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    finally:
        driver.quit()
