"""Rasters predicted by windows: the same pixels as in memory, georeferenced outputs, nodata, bands and limits."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest
import torch
from torch import nn

from crackseg.cli import main
from crackseg.inference import Predictor, part_rows, tile_starts
from crackseg.models import CrackSegModel
from crackseg.rasters import RasterSource

rasterio = pytest.importorskip("rasterio")
from affine import Affine  # noqa: E402

from conftest import dark_pixel_model  # noqa: E402
from test_report import browser, needs_browser  # noqa: E402

TRANSFORM = Affine(0.002, 0.0, 500000.0, 0.0, -0.002, 5000000.0)  # 2 mm pixels in UTM 33N, north up


def _write(path, bands: np.ndarray, crs="EPSG:32633", transform=TRANSFORM, **extra) -> None:
    """A tiled GeoTIFF with 512 px blocks, as survey software writes them."""
    count, height, width = bands.shape
    with rasterio.open(path, "w", driver="GTiff", width=width, height=height, count=count, dtype=bands.dtype,
                       crs=crs, transform=transform, tiled=True, blockxsize=512, blockysize=512, compress="deflate", **extra) as out:
        out.write(bands)


def _pavement(height: int, width: int, seed: int = 0) -> np.ndarray:
    """(3, H, W) uint8 grey texture with dark lines: across the middle, and one slanting over many rows."""
    rng = np.random.default_rng(seed)
    image = rng.integers(150, 230, (height, width), dtype=np.uint8)
    image[height // 2 : height // 2 + 3, 50 : width - 50] = 30
    for col in range(100, min(width, 1300)):
        row = 40 + (col - 100) * (height - 80) // 1200
        image[row : row + 2, col] = 25
    return np.repeat(image[None], 3, axis=0)


def _context_model() -> CrackSegModel:
    """A small random CNN: its output depends on a neighbourhood, so tile seams and blending matter."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 5, padding=2), nn.ReLU(), nn.Conv2d(4, 1, 5, padding=2))
    return CrackSegModel(net, "unet", "tiny-cnn", size_divisor=1).eval()


@pytest.fixture(scope="module")
def dark_checkpoint(tmp_path_factory):
    return dark_pixel_model(tmp_path_factory.mktemp("dark"))


def _predict(*args) -> int:
    try:
        return main(["predict", *map(str, args), "--device", "cpu", "--workers", "0", "--tile", "256", "--overlap", "32"])
    except SystemExit as exit:
        return exit.code


def _mask(path) -> tuple[np.ndarray, np.ndarray, dict]:
    with rasterio.open(path) as raster:
        return raster.read(1), raster.dataset_mask(), {"crs": raster.crs, "transform": raster.transform, "tiled": raster.profile.get("tiled")}


def test_streamed_probabilities_are_the_in_memory_bits_and_hold_only_the_overlap_rows(tmp_path):
    pixels = _pavement(2000, 3000)
    _write(tmp_path / "ortho.tif", pixels)
    model = _context_model()
    predictor = Predictor(model, torch.device("cpu"), tile=256, overlap=32, batch_size=3)
    streamed = torch.full((2000, 3000), -1.0)
    with RasterSource(tmp_path / "ortho.tif") as source:
        for top, left, prob, valid in predictor.blocks(source.read, source.height, source.width):
            assert (streamed[top : top + prob.shape[0], left : left + prob.shape[1]] == -1).all() and valid.all()
            streamed[top : top + prob.shape[0], left : left + prob.shape[1]] = prob
    ((_, whole),) = list(Predictor(model, torch.device("cpu"), tile=256, overlap=32).probabilities([(0, torch.from_numpy(pixels))]))
    assert torch.equal(streamed, whole)  # every pixel written once, and the same bits
    # Weighted sums and weights of one tile, and of the rows a tile row shares with the rows above and
    # below: 38 each, the overlap of tiles spread evenly (9 tile rows, 218 apart, the last flush with the bottom).
    assert tile_starts(2000, 256, 32) == list(range(0, 1745, 218))
    assert predictor.floats_held == 2 * ((38 + 38) * 3000 + 256 * 256)


@pytest.mark.parametrize("overlap", [32, 160])  # 160: each row of pixels lies in up to three tile rows
def test_parts_of_a_raster_are_the_bits_of_the_whole(tmp_path, overlap):
    pixels = _pavement(1100, 700)
    _write(tmp_path / "ortho.tif", pixels)
    predictor = Predictor(_context_model(), torch.device("cpu"), tile=256, overlap=overlap)
    with RasterSource(tmp_path / "ortho.tif") as source:
        whole = {(top, left): prob for top, left, prob, _ in predictor.blocks(source.read, source.height, source.width)}
        for count in (2, 3, 40):  # 40: more processes than tile rows, most of them with nothing to do
            parts = [list(predictor.blocks(source.read, source.height, source.width, (index, count))) for index in range(count)]
            assert [(top, left) for part in parts for top, left, _, _ in part] == list(whole)
            assert all(torch.equal(prob, whole[(top, left)]) for part in parts for top, left, prob, _ in part)
            spans = [part_rows(1100, 256, overlap, (index, count)) for index in range(count)]
            assert spans[0][0] == 0 and spans[-1][1] == 1100 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_joined_parts_and_their_pixel_counts_equal_the_whole(tmp_path):
    from crackseg.streamed import merge_parts, predict_raster

    pixels = _pavement(1100, 700)
    pixels[:, 900:, :] = 0
    _write(tmp_path / "ortho.tif", pixels, nodata=0)
    predictor = Predictor(_context_model(), torch.device("cpu"), tile=256, overlap=32)
    whole = [tmp_path / "whole" / "mask.tif", tmp_path / "whole" / "prob.tif"]
    counts = predict_raster(tmp_path / "ortho.tif", whole, predictor, 0.5, 16, progress=False)
    joined = [tmp_path / "joined" / "mask.tif", tmp_path / "joined" / "prob.tif"]
    parts = [predict_raster(tmp_path / "ortho.tif", joined, predictor, 0.5, 16, part=(index, 3), progress=False) for index in range(3)]
    merge_parts(tmp_path / "ortho.tif", joined, 256, 32, 3)
    mask, valid, _ = _mask(whole[0])
    assert counts == tuple(map(sum, zip(*parts))) == (int((mask > 0).sum()), int((valid > 0).sum())) and 0 < counts[0] < counts[1] < 1100 * 700
    for a, b in zip(whole, joined):
        assert np.array_equal(_mask(a)[0], _mask(b)[0]) and np.array_equal(_mask(a)[1], _mask(b)[1])
    assert sorted(p.name for p in (tmp_path / "joined").iterdir()) == ["mask.tif", "prob.tif"]


def test_processes_sharing_a_raster_write_what_one_process_writes(tmp_path, dark_checkpoint):
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "ortho.tif", _pavement(1300, 900))
    common = ["--model", str(dark_checkpoint), str(tmp_path / "in"), "--save-prob", "16", "--vectors", "geojson", "--overviews"]
    assert _predict(*common, "--out", tmp_path / "one") == 0
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")} | {"PYTHON": sys.executable}
    launch = Path(__file__).resolve().parents[1] / "launch.sh"
    result = subprocess.run(["bash", str(launch), "--nproc", "2", "predict", *common, "--out", str(tmp_path / "two"), "--device", "cpu",
                             "--workers", "0", "--tile", "256", "--overlap", "32"],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for kind in ("masks", "probs"):
        with rasterio.open(tmp_path / "one" / kind / "ortho.tif") as one, rasterio.open(tmp_path / "two" / kind / "ortho.tif") as two:
            assert np.array_equal(one.read(), two.read()) and np.array_equal(one.dataset_mask(), two.dataset_mask())
            assert (one.crs, one.transform, one.overviews(1)) == (two.crs, two.transform, two.overviews(1)) and two.overviews(1)
    for table in ("predictions.csv", "cracks.csv"):
        assert (tmp_path / "one" / table).read_text().replace("/one/", "/") == (tmp_path / "two" / table).read_text().replace("/two/", "/")
    assert (tmp_path / "one" / "vectors" / "ortho.geojson").read_text() == (tmp_path / "two" / "vectors" / "ortho.geojson").read_text()
    assert sorted(p.name for p in (tmp_path / "two").rglob("*") if p.name.startswith(".")) == []


def test_geotiff_outputs_keep_the_georeferencing_and_the_photo_path_keeps_png(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "ortho.tif", _pavement(700, 900))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--save-prob", "16") == 0
    mask, valid, info = _mask(tmp_path / "out" / "masks" / "ortho.tif")
    assert info["crs"].to_epsg() == 32633 and info["transform"] == TRANSFORM and info["tiled"]
    expected = _pavement(700, 900)[0] < 100
    assert np.array_equal(mask > 0, expected) and set(np.unique(mask)) == {0, 255} and valid.all()
    with rasterio.open(tmp_path / "out" / "probs" / "ortho.tif") as probs:
        assert probs.dtypes[0] == "uint16" and probs.crs.to_epsg() == 32633
    (row,) = csv.DictReader(open(tmp_path / "out" / "predictions.csv"))
    assert float(row["px_size_mm"]) == pytest.approx(2.0) and row["crs"] == "EPSG:32633"
    assert int(row["area_px"]) == expected.sum()
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    assert len(cracks) == int(row["cracks"]) == 1 and float(cracks[0]["length_mm"]) == pytest.approx(2 * float(cracks[0]["length_px"]))
    for crack in cracks:  # the box in map coordinates: UTM metres from the geotransform
        assert float(crack["x_min"]) == pytest.approx(500000.0 + 0.002 * int(crack["left"]))
        assert float(crack["y_max"]) == pytest.approx(5000000.0 - 0.002 * int(crack["top"]))


def test_nodata_and_alpha_areas_are_neither_predicted_nor_counted(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    pixels = _pavement(600, 800)
    pixels[:, :, :300] = 0  # black, which the model would call crack, but declared nodata
    _write(tmp_path / "in" / "nodata.tif", pixels, nodata=0)
    alpha = np.full((1, 600, 800), 255, np.uint8)
    alpha[:, 400:, :] = 0
    _write(tmp_path / "in" / "rgba.tif", np.concatenate([_pavement(600, 800), alpha]), photometric="RGB", alpha="YES")
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    mask, valid, _ = _mask(tmp_path / "out" / "masks" / "nodata.tif")
    assert not mask[:, :300].any() and not valid[:, :300].any() and valid[:, 300:].all() and mask[:, 300:].any()
    mask, valid, _ = _mask(tmp_path / "out" / "masks" / "rgba.tif")
    assert not mask[400:].any() and not valid[400:].any() and np.array_equal(mask[:400] > 0, (_pavement(600, 800)[0] < 100)[:400])
    rows = {row["path"].rsplit("/", 1)[1]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    assert int(rows["nodata.tif"]["valid_px"]) == 600 * 500
    assert int(rows["nodata.tif"]["area_px"]) == int((_pavement(600, 800)[0, :, 300:] < 100).sum())


def test_sixteen_bit_and_single_band_rasters_read_like_their_eight_bit_rgb(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    pixels = _pavement(300, 500)
    _write(tmp_path / "in" / "rgb8.tif", pixels)
    _write(tmp_path / "in" / "rgb16.tif", pixels.astype(np.uint16) * 257)
    _write(tmp_path / "in" / "rgb12.tif", ((pixels.astype(np.uint32) * 4095 + 127) // 255).astype(np.uint16))
    _write(tmp_path / "in" / "grey.tif", pixels[:1])
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    masks = {name: _mask(tmp_path / "out" / "masks" / f"{name}.tif")[0] for name in ("rgb8", "rgb16", "rgb12", "grey")}
    assert masks["rgb8"].any()
    for name in ("rgb16", "rgb12", "grey"):
        assert np.array_equal(masks[name], masks["rgb8"]), name


def test_limits_and_georeferencing_without_a_scale_are_one_line(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "big.tif", _pavement(300, 400))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--max-pixels", "100000") == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "big.tif" in error and "--max-pixels" in error
    (tmp_path / "geo").mkdir()
    _write(tmp_path / "geo" / "lonlat.tif", _pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "geo", "--out", tmp_path / "out2", "--no-measure") == 0
    assert "not projected" in capsys.readouterr().err
    (row,) = csv.DictReader(open(tmp_path / "out2" / "predictions.csv"))
    assert row["px_size_mm"] == "" and "area_mm2" not in row


def test_px_size_overrides_the_scale_of_the_georeferencing(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "utm.tif", _pavement(300, 400))  # 2 mm pixels
    _write(tmp_path / "in" / "lonlat.tif", _pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", "5") == 0
    assert "warning" not in capsys.readouterr().err
    rows = list(csv.DictReader(open(tmp_path / "out" / "predictions.csv")))
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    assert len(rows) == 2 and len(cracks) >= 2
    for row in rows:
        assert float(row["px_size_mm"]) == 5.0 and float(row["area_mm2"]) == pytest.approx(25 * int(row["area_px"]))
    for crack in cracks:
        assert float(crack["length_mm"]) == pytest.approx(5 * float(crack["length_px"]), abs=1e-3)


def test_width_classes_and_lengths_in_mm_use_each_rasters_own_scale(tmp_path, dark_checkpoint, capsys):
    import json

    from PIL import Image

    from crackseg.measure import WidthClasses

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "fine.tif", _pavement(300, 400))  # 2 mm pixels
    _write(tmp_path / "in" / "coarse.tif", _pavement(300, 400), transform=Affine(0.004, 0.0, 500000.0, 0.0, -0.004, 5000000.0))
    flags = ["--width-classes", "5,10", "--min-length", "200mm"]
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", *flags) == 0
    rows = {row["path"].rsplit("/", 1)[1]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    classes = WidthClasses.parse("5,10")
    for name, scale in (("fine.tif", 2.0), ("coarse.tif", 4.0)):
        assert float(rows[name]["px_size_mm"]) == scale
        own = [crack for crack in cracks if crack["path"].endswith(name)]
        assert own and all(float(crack["length_px"]) * scale >= 200 for crack in own)  # 100 px fine, 50 px coarse
        for crack in own:
            assert float(crack["length_mm"]) == pytest.approx(scale * float(crack["length_px"]), abs=1e-3)
            assert crack["max_width_class"] == classes.classify(float(crack["max_width_mm"]))
    assert {c["max_width_class"] for c in cracks if "fine" in c["path"]} != {c["max_width_class"] for c in cracks if "coarse" in c["path"]}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["px_size_mm"] is None and summary["min_length_px"] is None  # two scales: no one figure in px
    assert summary["length_mm"] == pytest.approx(sum(float(c["length_mm"]) for c in cracks), abs=1e-2)
    assert sum(summary["width_classes"]["length_mm"].values()) == pytest.approx(summary["length_mm"])

    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in" / "fine.tif", "--out", tmp_path / "one", *flags) == 0
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["px_size_mm"] == 2.0 and summary["min_length_px"] == 100.0 and "pixel size 2 mm" in capsys.readouterr().out

    Image.fromarray(_pavement(300, 400).transpose(1, 2, 0)).save(tmp_path / "in" / "photo.png")
    _write(tmp_path / "in" / "lonlat.tif", _pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    for source, name in ((tmp_path / "in" / "photo.png", "a photo"), (tmp_path / "in" / "lonlat.tif", "a raster without")):
        out = tmp_path / f"refused-{source.stem}"
        assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in" / "fine.tif", source, "--out", out, *flags) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and "--width-classes needs the pixel size in mm: give --px-size" in error
        assert f"{source} is {name}" in error and not out.exists()
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in" / "photo.png", "--out", tmp_path / "photo", "--min-length", "2mm") == 2
    assert "--min-length 2mm needs the pixel size in mm" in capsys.readouterr().err


@needs_browser
def test_the_report_of_rasters_in_two_scales_gives_metres_and_says_whose_scale(tmp_path, dark_checkpoint):
    from selenium.webdriver.common.by import By

    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "fine.tif", _pavement(300, 400))
    _write(tmp_path / "in" / "coarse.tif", _pavement(300, 400), transform=Affine(0.004, 0.0, 500000.0, 0.0, -0.004, 5000000.0))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--width-classes", "5,10", "--report") == 0
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    driver = browser()
    try:
        driver.get((tmp_path / "out" / "report.html").as_uri())
        text = lambda css: driver.find_element(By.CSS_SELECTOR, css).text  # noqa: E731
        assert text("#sum-length") == f"{sum(float(c['length_mm']) for c in cracks) / 1000:.3f} m"
        assert text("#scale").startswith("each raster in its own pixel size") and driver.find_element(By.ID, "classes")
    finally:
        driver.quit()


def test_rasters_without_the_geo_extra_are_one_line_and_plain_tiffs_read_as_photos(tmp_path, dark_checkpoint, monkeypatch, capsys):
    from PIL import Image

    (tmp_path / "geo").mkdir()
    _write(tmp_path / "geo" / "ortho.tif", _pavement(100, 100))
    (tmp_path / "plain").mkdir()
    Image.fromarray(_pavement(100, 100).transpose(1, 2, 0)).save(tmp_path / "plain" / "scan.tif")
    monkeypatch.setitem(sys.modules, "rasterio", None)  # makes `import rasterio` fail
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "geo", "--out", tmp_path / "out") == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "ortho.tif" in error and "pip install 'crackseg[geo]'" in error
    assert not (tmp_path / "out" / "masks").exists()
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "plain", "--out", tmp_path / "out2", "--no-measure") == 0
    assert (tmp_path / "out2" / "masks" / "scan.png").exists()


def test_a_photo_too_large_to_decode_whole_says_how_to_convert_it(tmp_path, dark_checkpoint, monkeypatch, capsys):
    from PIL import Image

    (tmp_path / "in").mkdir()
    Image.fromarray(_pavement(200, 300).transpose(1, 2, 0)).save(tmp_path / "in" / "huge.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20_000)  # Pillow refuses images over twice this
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 1
    (row,) = csv.DictReader(open(tmp_path / "out" / "errors.csv"))
    assert row["path"].endswith("huge.png") and "tiled GeoTIFF" in row["error"] and "gdal_translate" in row["error"]
    assert "gdal_translate" in capsys.readouterr().err


def test_cracks_across_bands_are_measured_as_on_the_whole_mask(tmp_path):
    from skimage.draw import line

    from crackseg.measure import find_cracks
    from crackseg.streamed import summarize_raster

    mask = np.zeros((700, 500), bool)
    for (r0, c0, r1, c1), width in [((5, 10, 690, 400), 3), ((20, 450, 680, 470), 5), ((640, 5, 690, 200), 1)]:
        rows, cols = line(r0, c0, r1, c1)
        for offset in range(width):
            mask[rows, np.minimum(cols + offset, 499)] = True
    mask[400:406, 455:480] = False  # a 6 px gap in the second crack, on a band border below
    mask[600:603, 100:103] = True  # a speck, shorter than the minimum length
    _write(tmp_path / "mask.tif", (mask * np.uint8(255))[None])
    expected = find_cracks(mask, join_gap=10, min_length=10)[1]
    for band_rows in (64, 100, 700):  # 64 and 100 rows: every crack crosses several bands, the gap one too
        counts, cracks, _ = summarize_raster(tmp_path / "mask.tif", True, join_gap=10, min_length=10, band_pixels=band_rows * 500)
        assert counts["area_px"] == mask.sum()
        assert len(cracks) == len(expected) == 3, band_rows
        for got, want in zip(cracks, expected):
            assert (got.id, got.area_px, got.bbox, got.fragments) == (want.id, want.area_px, want.bbox, want.fragments), band_rows
            assert got.length_px == pytest.approx(want.length_px, rel=1e-9)
            assert (got.max_width_px, got.mean_width_px) == pytest.approx((want.max_width_px, want.mean_width_px), rel=1e-9)


@pytest.mark.parametrize("fmt", ["gpkg", "geojson"])
def test_vectors_have_one_centreline_per_crack_in_map_or_pixel_coordinates(tmp_path, dark_checkpoint, fmt):
    pyogrio = pytest.importorskip("pyogrio")
    shapely = pytest.importorskip("shapely")
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "ortho.tif", _pavement(700, 900))
    photo = np.full((120, 200, 3), 200, np.uint8)
    photo[40:43, 20:180] = 20  # one crack, 3 px wide, its centre on row 41
    photo[90:93, 20:60] = 20
    from PIL import Image

    Image.fromarray(photo).save(tmp_path / "in" / "photo.png")
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", fmt) == 0
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    for name in ("ortho", "photo"):
        mine = [row for row in cracks if row["path"].endswith(name + (".tif" if name == "ortho" else ".png"))]
        info, _, geometries, fields = pyogrio.raw.read(tmp_path / "out" / "vectors" / f"{name}.{fmt}")
        attributes = dict(zip(info["fields"], fields))
        lines = shapely.from_wkb(geometries)
        assert len(lines) == len(mine) >= 1 and [int(v) for v in attributes["crack"]] == [int(row["crack"]) for row in mine]
        for key in ("length_px", "mean_width_px", "max_width_px"):
            assert [float(v) for v in attributes[key]] == [float(row[key]) for row in mine], key
        assert list(attributes["source"]) == [row["path"] for row in mine]
        if name == "ortho":  # UTM metres: 2 mm pixels from (500000, 5000000) down and right
            assert info["crs"] == "EPSG:32633"
            assert [float(v) for v in attributes["max_width_mm"]] == [float(row["max_width_mm"]) for row in mine]
            mask = _mask(tmp_path / "out" / "masks" / "ortho.tif")[0]
            for line, row in zip(lines, mine):
                x0, y0, x1, y1 = line.bounds
                assert 500000 <= x0 <= x1 <= 500000 + 900 * 0.002 and 5000000 - 700 * 0.002 <= y0 <= y1 <= 5000000
                # a polyline through pixel centres runs longer than the length estimator on slanted cracks (stairs)
                assert line.length * 1000 == pytest.approx(float(row["length_mm"]), rel=0.1)
                # every vertex is the centre of a crack pixel of the mask
                xy = shapely.get_coordinates(line)
                cols, rows = (xy[:, 0] - 500000) / 0.002 - 0.5, (5000000 - xy[:, 1]) / 0.002 - 0.5
                assert np.allclose(cols, cols.round(), atol=1e-6) and np.allclose(rows, rows.round(), atol=1e-6)
                assert (mask[rows.round().astype(int), cols.round().astype(int)] == 255).all()
        else:  # pixels: the first crack's centreline runs along row 41 (pixel centres at 41.5), within a pixel at its ends
            x0, y0, x1, y1 = lines[0].bounds
            assert 40.5 <= y0 <= y1 <= 42.5 and x1 - x0 == pytest.approx(float(mine[0]["length_px"]), rel=0.05)


def test_vectors_without_the_geo_libraries_stop_before_any_work(tmp_path, dark_checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyogrio", None)  # makes `import pyogrio` fail
    (tmp_path / "in").mkdir()
    _write(tmp_path / "in" / "ortho.tif", _pavement(100, 100))
    assert _predict("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", "geojson") == 2
    assert "pip install 'crackseg[geo]'" in capsys.readouterr().err and not (tmp_path / "out" / "masks").exists()
