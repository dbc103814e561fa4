"""Crack centrelines for GIS (crackseg/cracks/vectors.py): GeoPackage and GeoJSON in map or pixel coordinates, each with
its default QGIS style, and --vectors without the geo libraries."""

from __future__ import annotations

import csv
import sqlite3
import sys
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("rasterio")

from conftest import pavement, predict_cli, predict_tiled, read_mask, write_geotiff  # noqa: E402


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
        info, _, geometries, fields = pyogrio.raw.read(tmp_path / "out" / "vectors" / f"{name}.{fmt}", layer="cracks")
        attributes = dict(zip(info["fields"], fields))
        assert "<renderer-v2 type=\"singleSymbol\"" in _default_style(tmp_path / "out" / "vectors" / f"{name}.{fmt}")
        lines = shapely.from_wkb(geometries)
        assert len(lines) == len(mine) >= 1 and list(attributes["crack"]) == [int(row["crack"]) for row in mine]
        for key in ("crack", "area_px", "top", "left", "bottom", "right"):  # whole numbers, as cracks.csv joins them
            assert attributes[key].dtype.kind == "i", key
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


def _default_style(path: Path, layer: str = "cracks") -> str:
    """The QML QGIS applies on opening ``path``: a GeoPackage's default row of layer_styles, selected as QGIS selects it
    (through GDAL, by schema '', the layer and its geometry column), else the .qml beside the file."""
    if path.suffix == ".geojson":
        return path.with_suffix(".qml").read_text()
    import pyogrio

    geometry = pyogrio.read_info(path, layer=layer)["geometry_name"]
    where = f"f_table_schema = '' AND f_table_name = '{layer}' AND f_geometry_column = '{geometry}' AND useAsDefault"
    info, _, _, fields = pyogrio.raw.read(path, layer="layer_styles", where=where, read_geometry=False)
    (qml,) = dict(zip(info["fields"], fields))["styleQML"]
    return qml


@pytest.mark.parametrize("fmt", ["gpkg", "geojson"])
def test_a_layer_carries_its_qgis_style_as_gdal_reads_it_back(tmp_path, fmt):
    pyogrio = pytest.importorskip("pyogrio")
    shapely = pytest.importorskip("shapely")
    from crackseg.cracks.vectors import layer_files, write_features

    path, style = tmp_path / f"site.{fmt}", "<!DOCTYPE qgis>\n<qgis version=\"3.28.0\"><renderer-v2 type=\"singleSymbol\"/></qgis>\n"
    write_features(path, [{"crack": 1, "status": "new"}], [shapely.LineString([(0, 0), (3, 4)])], None, "changes", style)
    assert _default_style(path, "changes") == style
    assert layer_files(path) == ([path] if fmt == "gpkg" else [path, tmp_path / "site.qml"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in layer_files(path))  # no temp left
    if fmt == "geojson":
        return
    assert sorted(map(tuple, pyogrio.list_layers(path))) == [("changes", "MultiLineString"), ("layer_styles", None)]
    info = pyogrio.read_info(path, layer="layer_styles")
    assert info["fid_column"] == "id" and info["features"] == 1  # QGIS's key
    types = dict(zip(info["fields"], zip(info["ogr_types"], info["ogr_subtypes"])))
    assert types["useAsDefault"] == ("OFTInteger", "OFSTBoolean") and types["update_time"][0] == "OFTDateTime"
    with closing(sqlite3.connect(path)) as db:  # QGIS's own query of the default style, in SQL
        assert db.execute("SELECT styleQML FROM layer_styles WHERE f_table_schema = '' AND f_table_name = 'changes' AND "
                          "f_geometry_column = 'geom' ORDER BY CASE WHEN useAsDefault THEN 1 ELSE 2 END, update_time DESC"
                          ).fetchall() == [(style,)]
        assert db.execute("SELECT data_type FROM gpkg_contents WHERE table_name = 'layer_styles'").fetchall() == [("attributes",)]
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_predicted_cracks_are_styled_by_the_class_of_the_graded_width_and_a_geojson_style_is_an_output(tmp_path, dark_checkpoint):
    """ASTM D6433 grades the mean width: the GeoPackage's default style colours mean_width_class, its classes in order. A GeoJSON's
    .qml is one of the image's outputs: --skip-existing writes it again when it is missing."""
    pytest.importorskip("pyogrio")
    photo = np.full((60, 240, 3), 200, np.uint8)
    photo[28:32, 10:230] = 20
    (tmp_path / "in").mkdir()
    from PIL import Image

    Image.fromarray(photo).save(tmp_path / "in" / "road.png")
    flags = ["--checkpoint", dark_checkpoint, tmp_path / "in", "--px-size", "1"]
    assert predict_cli(*flags, "--out", tmp_path / "out", "--width-classes", "d6433-ac", "--vectors", "gpkg") == 0
    qml = ET.fromstring(_default_style(tmp_path / "out" / "vectors" / "road.gpkg"))
    assert qml.find("renderer-v2").get("attr") == "mean_width_class"
    assert [category.get("value") for category in qml.iter("category")] == ["L", "M", "H", ""]

    assert predict_cli(*flags, "--out", tmp_path / "json", "--vectors", "geojson") == 0
    style = tmp_path / "json" / "vectors" / "road.qml"
    assert ET.fromstring(style.read_text()).find("renderer-v2").get("type") == "singleSymbol"  # no classes: one red line
    style.unlink()
    assert predict_cli(*flags, "--out", tmp_path / "json", "--vectors", "geojson", "--skip-existing") == 0
    assert style.exists()


def test_vectors_without_the_geo_libraries_stop_before_any_work(tmp_path, dark_checkpoint, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyogrio", None)  # makes `import pyogrio` fail
    (tmp_path / "in").mkdir()
    write_geotiff(tmp_path / "in" / "ortho.tif", pavement(100, 100))
    assert predict_tiled("--checkpoint", dark_checkpoint, tmp_path / "in", "--out", tmp_path / "out", "--vectors", "geojson") == 2
    assert "pip install 'crackseg[geo]'" in capsys.readouterr().err and not (tmp_path / "out" / "masks").exists()


def test_a_layer_replaced_while_another_program_holds_it_open_in_wal_mode_is_the_new_one(tmp_path):
    """QGIS editing a GeoPackage keeps its changes in a -wal file beside it: SQLite would replay that log onto the file
    written in its place, and the layer would show the earlier run's cracks."""
    pytest.importorskip("pyogrio")
    shapely = pytest.importorskip("shapely")
    from crackseg.cracks.vectors import write_features

    path, line = tmp_path / "changes.gpkg", shapely.LineString([(0, 0), (3, 4)])
    write_features(path, [{"crack": 1, "length_px": 10.0}], [line], None, "changes", "")
    editor = sqlite3.connect(path)
    editor.execute("PRAGMA journal_mode=WAL")
    editor.execute("CREATE TABLE edits (note TEXT)")
    editor.execute("INSERT INTO edits VALUES ('an edit of the earlier layer')")
    editor.commit()
    assert (tmp_path / "changes.gpkg-wal").exists()
    write_features(path, [{"crack": 1, "length_px": 20.0}, {"crack": 2, "length_px": 30.0}], [line, line], None, "changes", "")
    try:
        with closing(sqlite3.connect(path)) as db:  # opened, as QGIS reloads it, while the editor still holds the old file
            assert db.execute("SELECT length_px FROM changes ORDER BY crack").fetchall() == [(20.0,), (30.0,)]
            assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'edits'").fetchone() == (0,)
    finally:
        editor.close()


def test_overwrite_removes_a_stale_layer_with_the_logs_sqlite_kept_beside_it(tmp_path, dark_checkpoint):
    pytest.importorskip("pyogrio")
    from PIL import Image

    (tmp_path / "in").mkdir()
    photo = np.full((64, 96, 3), 200, np.uint8)
    photo[30:33, 10:90] = 20
    Image.fromarray(photo).save(tmp_path / "in" / "photo.png")
    common = ["--model", str(dark_checkpoint), str(tmp_path / "in"), "--out", str(tmp_path / "out")]
    assert predict_cli(*common, "--vectors", "gpkg") == 0
    layer = tmp_path / "out" / "vectors" / "photo.gpkg"
    for log in ("-wal", "-shm"):  # as a program editing the layer leaves them
        layer.with_name(layer.name + log).write_bytes(b"an editor's log")
    assert predict_cli(*common, "--overwrite") == 0
    assert not (tmp_path / "out" / "vectors").exists()
