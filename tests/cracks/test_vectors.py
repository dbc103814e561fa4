"""Crack centrelines for GIS (crackseg/cracks/vectors.py): GeoPackage and GeoJSON in map or pixel coordinates,
and --vectors without the geo libraries."""

from __future__ import annotations

import csv
import sys

import numpy as np
import pytest

pytest.importorskip("rasterio")

from conftest import pavement, predict_tiled, read_mask, write_geotiff  # noqa: E402


@pytest.mark.parametrize("fmt", ["gpkg", "geojson"])
def test_vectors_have_one_centreline_per_crack_in_map_or_pixel_coordinates(tmp_path, dark_checkpoint, fmt):
    pyogrio = pytest.importorskip("pyogrio")
    shapely = pytest.importorskip("shapely")
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(700, 900))
    photo = np.full((120, 200, 3), 200, np.uint8)
    photo[40:43, 20:180] = 20  # one crack, 3 px wide, its centre on row 41
    photo[90:93, 20:60] = 20
    from PIL import Image

    Image.fromarray(photo).save(tmp_path / "in" / "photo.png")
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", fmt) == 0
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
            mask = read_mask(tmp_path / "out" / "masks" / "ortho.tif")[0]
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
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(100, 100))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", "geojson") == 2
    assert "pip install 'crackseg[geo]'" in capsys.readouterr().err and not (tmp_path / "out" / "masks").exists()
