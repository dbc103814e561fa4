"""Rasters read by windows (crackseg/data/rasters.py): 16-bit and grey bands, nodata and alpha, georeferenced
outputs, limits, and each raster's own pixel size in mm."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import shapely
import shapely.geometry
from PIL import Image

rasterio = pytest.importorskip("rasterio")
from affine import Affine  # noqa: E402
from conftest import cli_result, pavement, predict_tiled, read_mask, utm_transform, write_geotiff  # noqa: E402


def test_geotiff_outputs_keep_the_georeferencing_and_the_photo_path_keeps_png(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(700, 900))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--save-prob", "16") == 0
    mask, valid, info = read_mask(tmp_path / "out" / "masks" / "ortho.tif")
    assert info["crs"].to_epsg() == 32633 and info["transform"] == utm_transform() and info["tiled"]
    expected = pavement(700, 900)[0] < 100
    assert np.array_equal(mask > 0, expected) and set(np.unique(mask)) == {0, 255} and valid.all()
    with rasterio.open(tmp_path / "out" / "probs" / "ortho.tif") as probs:
        assert probs.dtypes[0] == "uint16" and probs.crs.to_epsg() == 32633
    (row,) = csv.DictReader(open(tmp_path / "out" / "predictions.csv"))
    assert float(row["px_size_mm"]) == pytest.approx(2.0) and row["crs"] == "EPSG:32633"
    assert int(row["area_px"]) == expected.sum()
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    assert len(cracks) == int(row["cracks"]) == 1
    assert float(cracks[0]["length_mm"]) == pytest.approx(2 * float(cracks[0]["length_px"]), abs=2 * 0.0051)  # px written to 2 decimals
    for crack in cracks:  # the box in map coordinates: UTM metres from the geotransform
        assert float(crack["x_min"]) == pytest.approx(500000.0 + 0.002 * int(crack["left"]))
        assert float(crack["y_max"]) == pytest.approx(5000000.0 - 0.002 * int(crack["top"]))


def test_a_tiff_placed_by_a_world_file_and_aux_xml_or_masked_by_a_msk_file_is_predicted_so(tmp_path, dark_checkpoint):
    """ArcGIS's and many survey tools' export: georeferencing, CRS and nodata in files beside the TIFF."""
    (tmp_path / "in").mkdir()
    pixels = pavement(600, 800)
    pixels[:, :, :300] = 0  # nodata, as the .aux.xml says
    Image.fromarray(pixels.transpose(1, 2, 0)).save(tmp_path / "in" / "ortho.tif")
    transform = utm_transform()
    (tmp_path / "in" / "ortho.tfw").write_text("\n".join(str(value) for value in (
        transform.a, transform.d, transform.b, transform.e, transform.c + transform.a / 2, transform.f + transform.e / 2)) + "\n")
    bands = "".join(f'<PAMRasterBand band="{band}"><NoDataValue>0</NoDataValue></PAMRasterBand>' for band in (1, 2, 3))
    srs = rasterio.crs.CRS.from_epsg(32633).to_wkt().replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    (tmp_path / "in" / "ortho.tif.aux.xml").write_text(f"<PAMDataset><SRS>{srs}</SRS>{bands}</PAMDataset>\n")
    with rasterio.Env(GDAL_TIFF_INTERNAL_MASK=False):  # gdal_translate's .msk beside the file, as some tools keep it
        write_geotiff(tmp_path / "in" / "masked.tif", pavement(600, 800))
        with rasterio.open(tmp_path / "in" / "masked.tif", "r+") as masked:
            masked.write_mask(np.arange(800)[None, :].repeat(600, 0) >= 300)
    assert (tmp_path / "in" / "masked.tif.msk").exists()
    sidecars = {path.name: path.read_bytes() for path in (tmp_path / "in").iterdir()}
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    mask, valid, info = read_mask(tmp_path / "out" / "masks" / "ortho.tif")
    assert info["crs"].to_epsg() == 32633 and info["transform"].almost_equals(transform)
    assert not valid[:, :300].any() and valid[:, 300:].all() and not mask[:, :300].any()
    _, valid, _ = read_mask(tmp_path / "out" / "masks" / "masked.tif")
    assert not valid[:, :300].any() and valid[:, 300:].all()
    assert {path.name: path.read_bytes() for path in (tmp_path / "in").iterdir()} == sidecars  # nothing written beside it


def test_geojson_of_a_crs_without_an_epsg_code_is_said_to_lose_it_and_gpkg_keeps_it(tmp_path, dark_checkpoint, capsys):
    """GDAL's GeoJSON writer names a CRS by its EPSG code alone: readers take a layer without one for WGS84."""
    pyogrio = pytest.importorskip("pyogrio")
    (tmp_path / "in").mkdir()
    local = "+proj=tmerc +lat_0=0 +lon_0=10.5 +k=1 +x_0=0 +y_0=0 +ellps=GRS80 +units=m +no_defs"  # a site's own grid
    write_geotiff(tmp_path / "in" / "site.tif", pavement(300, 400), crs=local)
    capsys.readouterr()
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "json", "--vectors", "geojson") == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "GeoJSON" in line]
    assert len(warned) == 1 and "site.geojson" in warned[0] and "use --vectors gpkg" in warned[0], warned
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "gpkg", "--vectors", "gpkg") == 0
    assert "GeoJSON" not in capsys.readouterr().err
    kept = rasterio.crs.CRS.from_user_input(pyogrio.read_info(tmp_path / "gpkg" / "vectors" / "site.gpkg")["crs"])
    assert kept == rasterio.crs.CRS.from_user_input(local)


def test_bands_are_read_as_red_green_blue_by_their_colour_interpretation(tmp_path):
    from rasterio.enums import ColorInterp

    from crackseg.data.rasters import RasterSource

    rgb = pavement(64, 96)
    rgb[0] += 20  # red unlike green and blue
    rgb[2] -= 40
    write_geotiff(tmp_path / "bgr.tif", rgb[::-1].copy())
    with rasterio.open(tmp_path / "bgr.tif", "r+") as bgr:
        bgr.colorinterp = [ColorInterp.blue, ColorInterp.green, ColorInterp.red]
    write_geotiff(tmp_path / "rgb.tif", rgb)
    for name in ("bgr.tif", "rgb.tif"):
        with RasterSource(tmp_path / name) as source:
            assert np.array_equal(source.read(0, 0, 64, 96)[0].numpy(), rgb), name


def test_nodata_and_alpha_areas_are_neither_predicted_nor_counted(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    pixels = pavement(600, 800)
    pixels[:, :, :300] = 0  # black, which the model would call crack, but declared nodata
    write_geotiff(tmp_path / "in" / "nodata.tif", pixels, nodata=0)
    alpha = np.full((1, 600, 800), 255, np.uint8)
    alpha[:, 400:, :] = 0
    write_geotiff(tmp_path / "in" / "rgba.tif", np.concatenate([pavement(600, 800), alpha]), photometric="RGB", alpha="YES")
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    mask, valid, _ = read_mask(tmp_path / "out" / "masks" / "nodata.tif")
    assert not mask[:, :300].any() and not valid[:, :300].any() and valid[:, 300:].all() and mask[:, 300:].any()
    mask, valid, _ = read_mask(tmp_path / "out" / "masks" / "rgba.tif")
    assert not mask[400:].any() and not valid[400:].any() and np.array_equal(mask[:400] > 0, (pavement(600, 800)[0] < 100)[:400])
    rows = {row["path"].rsplit("/", 1)[1]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    assert int(rows["nodata.tif"]["valid_px"]) == 600 * 500
    assert int(rows["nodata.tif"]["area_px"]) == int((pavement(600, 800)[0, :, 300:] < 100).sum())


def test_a_plain_tiff_with_transparent_pixels_is_masked_there_and_not_counted(tmp_path, dark_checkpoint):
    """No map and no nodata value, only alpha: read as a photo, its transparent pixels were predicted and counted."""
    (tmp_path / "in").mkdir()
    rgba = np.concatenate([pavement(200, 300), np.full((1, 200, 300), 255, np.uint8)]).transpose(1, 2, 0)
    rgba[:, :120, :3], rgba[:, :120, 3] = 0, 0  # black under the alpha, which the model would call crack
    Image.fromarray(rgba, "RGBA").save(tmp_path / "in" / "cutout.tif")
    Image.fromarray(np.ascontiguousarray(rgba[..., :3])).save(tmp_path / "in" / "opaque.tif")
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    mask, valid, info = read_mask(tmp_path / "out" / "masks" / "cutout.tif")
    assert info["crs"] is None and not valid[:, :120].any() and valid[:, 120:].all() and not mask[:, :120].any()
    assert np.array_equal(mask[:, 120:] > 0, pavement(200, 300)[0, :, 120:] < 100)
    assert (tmp_path / "out" / "masks" / "opaque.png").is_file()  # black where the other is transparent: a crack there
    rows = {row["path"].rsplit("/", 1)[1]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    assert (int(rows["cutout.tif"]["valid_px"]), int(rows["cutout.tif"]["area_px"])) == (200 * 180, int((mask > 0).sum()))
    assert float(rows["cutout.tif"]["crack_fraction"]) == pytest.approx((mask > 0).sum() / (200 * 180), abs=1e-6)


def test_sixteen_bit_and_single_band_rasters_read_like_their_eight_bit_rgb(tmp_path, dark_checkpoint):
    (tmp_path / "in").mkdir()
    pixels = pavement(300, 500)
    write_geotiff(tmp_path / "in" / "rgb8.tif", pixels)
    write_geotiff(tmp_path / "in" / "rgb16.tif", pixels.astype(np.uint16) * 257)
    write_geotiff(tmp_path / "in" / "rgb12.tif", ((pixels.astype(np.uint32) * 4095 + 127) // 255).astype(np.uint16))
    write_geotiff(tmp_path / "in" / "grey.tif", pixels[:1])
    palette = {index: (255 - index,) * 3 + (255,) for index in range(256)}  # colours the inverse of their numbers
    write_geotiff(tmp_path / "in" / "palette.tif", 255 - pixels[:1], photometric="palette")
    with rasterio.open(tmp_path / "in" / "palette.tif", "r+") as raster:
        raster.write_colormap(1, palette)
    twelve_bits = ((pixels[0].astype(np.uint32) * 4095 + 127) // 255).astype(np.uint16)
    Image.fromarray(twelve_bits).save(tmp_path / "in" / "grey12.png")  # a photo: 12-bit data in 16-bit grey
    assert Image.open(tmp_path / "in" / "grey12.png").mode.startswith("I")
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--no-measure") == 0
    masks = {name: read_mask(tmp_path / "out" / "masks" / f"{name}.tif")[0] for name in ("rgb8", "rgb16", "rgb12", "grey", "palette")}
    masks["grey12"] = np.asarray(Image.open(tmp_path / "out" / "masks" / "grey12.png"))
    assert masks["rgb8"].any()
    for name in ("rgb16", "rgb12", "grey", "palette", "grey12"):
        assert np.array_equal(masks[name], masks["rgb8"]), name


def test_limits_and_georeferencing_without_a_scale_are_one_line(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "big.tif", pavement(300, 400))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--max-pixels", "100000") == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "big.tif" in error and "--max-pixels" in error
    (tmp_path / "geo").mkdir()
    write_geotiff(tmp_path / "geo" / "lonlat.tif", pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "geo", "--out", tmp_path / "out2", "--no-measure") == 0
    assert "not projected" in capsys.readouterr().err
    (row,) = csv.DictReader(open(tmp_path / "out2" / "predictions.csv"))
    assert row["px_size_mm"] == "" and "area_mm2" not in row
    (tmp_path / "huge").mkdir()  # 10 km pixels: a scale no crack is measured at, which would overflow areas in mm
    write_geotiff(tmp_path / "huge" / "km.tif", pavement(300, 400), transform=Affine(1e4, 0.0, 500000.0, 0.0, -1e4, 5e6))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "huge", "--out", tmp_path / "out3", "--width-classes", "ec2") == 2
    assert "km.tif: its georeferenced pixel size 1e+07 mm is not in [0.0001, 1000] mm" in capsys.readouterr().err


def test_px_size_overrides_the_scale_of_the_georeferencing(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "utm.tif", pavement(300, 400))  # 2 mm pixels
    write_geotiff(tmp_path / "in" / "lonlat.tif", pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--px-size", "5") == 0
    assert "warning" not in capsys.readouterr().err
    rows = list(csv.DictReader(open(tmp_path / "out" / "predictions.csv")))
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    assert len(rows) == 2 and len(cracks) >= 2
    for row in rows:
        assert float(row["px_size_mm"]) == 5.0 and float(row["area_mm2"]) == pytest.approx(25 * int(row["area_px"]))
    for crack in cracks:
        assert float(crack["length_mm"]) == pytest.approx(5 * float(crack["length_px"]), abs=5 * 0.0051)  # px written to 2 decimals


def _mercator(lon: float, lat: float) -> tuple[float, float]:
    """EPSG:3857 coordinates of a point in degrees (Web Mercator on WGS84's semi-major axis)."""
    import math

    return 6378137.0 * math.radians(lon), 6378137.0 * math.log(math.tan(math.pi / 4 + math.radians(lat) / 2))


def test_a_web_mercator_raster_is_measured_on_the_ground_and_says_so(tmp_path, dark_checkpoint, capsys):
    """EPSG:3857 stretches lengths by 1 / cos(latitude): at 52 degrees north a 2 mm map pixel is 1.23 mm on the ground."""
    import math

    (tmp_path / "in").mkdir()
    x, y = _mercator(13.4, 52.0)
    write_geotiff(tmp_path / "in" / "web.tif", pavement(300, 400), crs="EPSG:3857", transform=Affine(0.002, 0.0, x, 0.0, -0.002, y))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--width-classes", "5,10") == 0
    err = capsys.readouterr().err
    assert "web.tif: CRS EPSG:3857 stretches lengths by 1.62 here; its pixels are measured on the ground, 1.23" in err
    (row,) = csv.DictReader(open(tmp_path / "out" / "predictions.csv"))
    assert float(row["px_size_mm"]) == pytest.approx(2.0 * math.cos(math.radians(52.0)), rel=0.005)
    for crack in csv.DictReader(open(tmp_path / "out" / "cracks.csv")):
        assert float(crack["length_mm"]) == pytest.approx(float(row["px_size_mm"]) * float(crack["length_px"]), abs=0.01)


def test_a_map_within_a_percent_of_the_ground_keeps_its_pixel_size():
    """UTM draws lengths 0.9996 times as long on its central meridian: a 2 mm pixel stays 2 mm, as its survey states it."""
    from crackseg.data.ground_scale import ground_scale

    utm = ground_scale(rasterio.crs.CRS.from_epsg(32633), utm_transform(), 400, 300)
    assert utm == pytest.approx((1 / 0.9996, 1 / 0.9996), abs=1e-5)  # ground / map
    x, y = _mercator(13.4, 52.0)
    web = ground_scale(rasterio.crs.CRS.from_epsg(3857), Affine(0.002, 0.0, x, 0.0, -0.002, y), 400, 300)
    assert web == pytest.approx((0.6157, 0.6157), rel=0.003)  # east and north differ by the ellipsoid's radii only


def test_width_classes_and_lengths_in_mm_use_each_rasters_own_scale(tmp_path, dark_checkpoint, capsys):
    import json

    from PIL import Image

    from crackseg.cracks.widths import WidthClasses

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "fine.tif", pavement(300, 400))  # 2 mm pixels
    write_geotiff(tmp_path / "in" / "coarse.tif", pavement(300, 400), transform=utm_transform(0.004))
    flags = ["--width-classes", "5,10", "--min-length", "200mm"]
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", *flags) == 0
    rows = {row["path"].rsplit("/", 1)[1]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    cracks = list(csv.DictReader(open(tmp_path / "out" / "cracks.csv")))
    classes = WidthClasses.parse("5,10")
    for name, scale in (("fine.tif", 2.0), ("coarse.tif", 4.0)):
        assert float(rows[name]["px_size_mm"]) == scale
        own = [crack for crack in cracks if crack["path"].endswith(name)]
        assert own and all(float(crack["length_px"]) * scale >= 200 for crack in own)  # 100 px fine, 50 px coarse
        for crack in own:
            assert float(crack["length_mm"]) == pytest.approx(scale * float(crack["length_px"]), abs=scale * 0.0051)
            assert crack["max_width_class"] == classes.classify(float(crack["max_width_mm"]))
    assert {c["max_width_class"] for c in cracks if "fine" in c["path"]} != {c["max_width_class"] for c in cracks if "coarse" in c["path"]}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["px_size_mm"] is None and summary["min_length_px"] is None  # two scales: no one figure in px
    assert summary["length_mm"] == pytest.approx(sum(float(c["length_mm"]) for c in cracks), abs=1e-2)
    assert sum(summary["width_classes"]["length_mm"].values()) == pytest.approx(summary["length_mm"])

    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in" / "fine.tif", "--out", tmp_path / "one", *flags) == 0
    summary = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert summary["px_size_mm"] == 2.0 and summary["min_length_px"] == 100.0 and "pixel size 2 mm" in capsys.readouterr().out

    Image.fromarray(pavement(300, 400).transpose(1, 2, 0)).save(tmp_path / "in" / "photo.png")
    write_geotiff(tmp_path / "in" / "lonlat.tif", pavement(300, 400), crs="EPSG:4326", transform=Affine(1e-7, 0.0, 15.0, 0.0, -1e-7, 48.0))
    for source, why in ((tmp_path / "in" / "photo.png", " is a photo"), (tmp_path / "in" / "lonlat.tif", ": CRS EPSG:4326 is not projected")):
        out = tmp_path / f"refused-{source.stem}"
        assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in" / "fine.tif", source, "--out", out, *flags) == 2
        error = capsys.readouterr().err.strip()
        assert "\n" not in error and "--width-classes needs the pixel size in mm: give --px-size" in error
        assert f"{source}{why}" in error and not out.exists()
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in" / "photo.png", "--out", tmp_path / "photo", "--min-length", "2mm") == 2
    assert "--min-length 2mm needs the pixel size in mm" in capsys.readouterr().err


def test_a_raster_without_a_crs_keeps_its_nodata_out_and_its_geotransform(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    pixels = pavement(300, 400)
    pixels[:, :, :100] = 0  # black, which the model calls crack, but declared nodata
    write_geotiff(tmp_path / "in" / "nocrs.tif", pixels, crs=None, nodata=0)
    write_geotiff(tmp_path / "in" / "plain.tif", pixels, crs=None, transform=Affine.identity(), nodata=0)
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", "geojson") == 0
    assert "nocrs.tif: a geotransform without a CRS" in capsys.readouterr().err
    for name in ("nocrs", "plain"):
        mask, valid, info = read_mask(tmp_path / "out" / "masks" / f"{name}.tif")
        assert not valid[:, :100].any() and valid[:, 100:].all() and not mask[:, :100].any()
    assert read_mask(tmp_path / "out" / "masks" / "nocrs.tif")[2]["transform"] == utm_transform()
    rows = {row["path"]: row for row in csv.DictReader(open(tmp_path / "out" / "predictions.csv"))}
    assert all(int(row["valid_px"]) == 300 * 300 and row["px_size_mm"] == "" for row in rows.values())
    # centrelines lie on the mask as a GIS places it: by the geotransform, CRS or not
    for name, transform in (("nocrs", utm_transform()), ("plain", Affine.identity())):
        features = json.loads((tmp_path / "out" / "vectors" / f"{name}.geojson").read_text())["features"]
        col, row = ~transform @ tuple(shapely.get_coordinates(shapely.geometry.shape(features[0]["geometry"]))[0])
        assert 100 <= col <= 400 and 0 <= row <= 300


def test_a_tiff_placed_by_ground_control_points_alone_is_a_warning(tmp_path, dark_checkpoint, capsys):
    import rasterio
    from rasterio.control import GroundControlPoint

    (tmp_path / "in").mkdir()
    gcps = [GroundControlPoint(row, col, 500000.0 + col / 500, 5e6 - row / 500) for row, col in ((0, 0), (0, 400), (300, 0))]
    with rasterio.open(tmp_path / "in" / "gcps.tif", "w", driver="GTiff", width=400, height=300, count=3, dtype="uint8",
                       gcps=gcps, crs="EPSG:32633") as out:
        out.write(pavement(300, 400))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 0
    assert "gcps.tif: placed on the map by ground control points only" in capsys.readouterr().err
    assert "ground control points" in json.loads((tmp_path / "out" / "summary.json").read_text())["warnings"][0]


def test_resize_with_a_raster_is_one_line_before_any_photo_is_predicted(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(200, 160))
    Image.fromarray(pavement(64, 64).transpose(1, 2, 0)).save(tmp_path / "in" / "photo.png")
    code, err = cli_result(["predict", "--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--resize", "64"])
    assert code == 2 and err.count("\n") == 1 and "ortho.tif: --resize cannot be used with rasters" in err, err
    assert not (tmp_path / "out").exists()


def test_skip_existing_predicts_a_raster_again_whose_saved_mask_is_damaged(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(200, 160))
    out = tmp_path / "out"
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", out) == 0
    whole = (out / "masks" / "ortho.tif").read_bytes()
    (out / "masks" / "ortho.tif").write_bytes(whole[: len(whole) // 2])  # cut short by a crash or a full disk
    capsys.readouterr()
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", out, "--skip-existing") == 0
    err = capsys.readouterr().err
    assert "ortho.tif: the mask an earlier run wrote is not readable" in err and "Warning" not in err, err
    assert (out / "masks" / "ortho.tif").read_bytes() == whole
    assert [row["status"] for row in csv.DictReader(open(out / "predictions.csv"))] == ["ok"]


def test_a_crack_joined_across_a_gap_is_one_centreline_in_a_photos_layer_as_in_a_rasters(tmp_path, dark_checkpoint):
    """The layer draws the skeleton the length was measured on, bridges included, for photos as for rasters."""
    image = np.full((3, 64, 160), 200, np.uint8)
    image[:, 30:34, 20:70] = 20
    image[:, 30:34, 76:140] = 20  # a 6 px gap, which the join bridges
    (tmp_path / "in").mkdir()
    Image.fromarray(image.transpose(1, 2, 0)).save(tmp_path / "in" / "photo.png")
    write_geotiff(tmp_path / "in" / "ortho.tif", image, transform=utm_transform(0.001))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", "geojson",
                         "--join-gap", "10") == 0
    rows = {row["path"].rsplit("/", 1)[-1]: row for row in csv.DictReader(open(tmp_path / "out" / "cracks.csv"))}
    assert rows["photo.png"]["fragments"] == rows["ortho.tif"]["fragments"] == "2"
    lines = {}
    for name, unit in (("photo", 1.0), ("ortho", 1000.0)):  # px; m of 1 mm pixels
        (feature,) = json.loads((tmp_path / "out" / "vectors" / f"{name}.geojson").read_text())["features"]
        line = shapely.geometry.shape(feature["geometry"])
        lines[name] = (len(getattr(line, "geoms", [line])), round(line.length * unit, 6))
    assert lines["photo"] == lines["ortho"] and lines["photo"][0] == 1, lines


def test_a_damaged_tile_is_one_line_naming_the_raster_and_the_rest_is_written(tmp_path, dark_checkpoint, capsys):
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "damaged.tif", pavement(1100, 900))
    write_geotiff(tmp_path / "in" / "whole.tif", pavement(300, 400))
    with rasterio.open(tmp_path / "in" / "damaged.tif") as raster:
        offset = int(raster.get_tag_item("BLOCK_OFFSET_1_1", "TIFF", bidx=1))
    with open(tmp_path / "in" / "damaged.tif", "r+b") as file:
        file.seek(offset)
        file.write(b"\xff" * 64)  # the deflate stream of one tile
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out") == 1
    error = capsys.readouterr().err
    lines = [line for line in error.splitlines() if line.startswith("crackseg: error:")]
    assert len(lines) == 1 and "damaged.tif" in lines[0] and "cannot be decoded" in lines[0] and "Traceback" not in error
    assert "previous exception" not in lines[0]
    assert (tmp_path / "out" / "masks" / "whole.tif").exists() and not (tmp_path / "out" / "masks" / "damaged.tif").exists()
    (failed,) = csv.DictReader(open(tmp_path / "out" / "errors.csv"))
    assert failed["path"].endswith("damaged.tif")


@pytest.mark.slow
def test_a_geotiff_torn_by_a_full_disk_never_takes_the_outputs_name(tmp_path, dark_checkpoint):
    """RLIMIT_FSIZE fails large writes as a full disk would, and libtiff reports some failures on stderr only."""
    import os
    import resource
    import signal
    import subprocess
    import sys

    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(1100, 900))

    def small_files_only():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    command = [sys.executable, "-m", "crackseg", "predict", str(tmp_path / "in"), "--checkpoint", str(dark_checkpoint),
               "--out", str(tmp_path / "out"), "--save-prob", "16", "--tile", "256", "--overlap", "32", "--workers", "0"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, preexec_fn=small_files_only)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "out" / "probs" / "ortho.tif").exists() and not list((tmp_path / "out").rglob("*crackseg-tmp*"))
    (failed,) = csv.DictReader(open(tmp_path / "out" / "errors.csv"))
    assert failed["path"].endswith("ortho.tif")
    assert cli_result([*command[3:], "--skip-existing"])[0] == 0
    with rasterio.open(tmp_path / "out" / "probs" / "ortho.tif") as probs:
        assert probs.read(1).shape == (1100, 900)
