"""The crack register (crackseg/monitoring/history.py): three visits in one GeoPackage, the width-history query in Python and
in the sqlite3 shell, map coordinates, and appends that are refused or interrupted leaving the file as it was."""

from __future__ import annotations

import dataclasses
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import closing
from pathlib import Path

import pytest

pyogrio = pytest.importorskip("pyogrio")
shapely = pytest.importorskip("shapely")

from crackseg.core.errors import InputError  # noqa: E402
from crackseg.cracks.widths import WIDTH_CLASS_PRESETS  # noqa: E402
from crackseg.monitoring import history  # noqa: E402
from crackseg.monitoring.history import WIDTH_HISTORY, Compared, append_comparison, check_append, check_cracks, width_history  # noqa: E402
from crackseg.monitoring.surveys import Survey  # noqa: E402
from crackseg.monitoring import register_file  # noqa: E402
from conftest import read_only_mount  # noqa: E402

VISITS = [Survey("2023-04-01", "visits/2023"), Survey("2024-04-01", "visits/2024"), Survey("2025-04-01", "visits/2025")]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    """The visits' relative sources lie beside the tests' registers, as a project's visits beside its register."""
    monkeypatch.chdir(tmp_path)


def _crack(crack: int, length: float, width: float, y: float, mm_per_px: float | None = None) -> dict:
    """A horizontal crack of a.png from x = 10, in pixel coordinates."""
    row = {"image": "a.png", "crack": crack, "length_px": length, "mean_width_px": width * 0.75, "max_width_px": width,
           "geometry": shapely.LineString([(10, y), (10 + length, y)])}
    if mm_per_px is not None:
        row |= {"length_mm": length * mm_per_px, "mean_width_mm": width * 0.75 * mm_per_px, "max_width_mm": width * mm_per_px,
                "max_width_class": "0.3-1 mm" if width * mm_per_px > 0.3 else "< 0.3 mm"}
    return row


# Visit 1 has no pixel size (mm unknown); 2 and 3 have 0.5 mm pixels. Crack ids are per visit (1 = longest).
CRACKS = [
    [_crack(1, 100, 3, 10), _crack(2, 40, 2, 50)],
    [_crack(1, 120, 3, 10, 0.5), _crack(2, 40, 4, 50, 0.5), _crack(3, 30, 1, 90, 0.5)],
    [_crack(1, 120, 5, 10, 0.5), _crack(2, 30, 1, 90, 0.5)],
]
def _link(before: int, after: int, status: str) -> dict:
    return {"before_image": "a.png", "before_crack": before, "after_image": "a.png", "after_crack": after, "status": status}


LINKS = [[_link(1, 1, "longer"), _link(2, 2, "wider")],  # visit 1 -> 2; crack 3 of visit 2 is new
         [_link(1, 1, "wider"), _link(3, 2, "unchanged")]]  # visit 2 -> 3; crack 2 of visit 2 is gone


def _compare(register, first: int, crs: str | None = None, cracks=None) -> dict:
    """Append the comparison of visit ``first`` with the next one."""
    return append_comparison(register, VISITS[first], VISITS[first + 1],
                             Compared(cracks or (CRACKS[first], CRACKS[first + 1]), LINKS[first]), crs)


def _table(register, sql: str) -> list[tuple]:
    with sqlite3.connect(register) as db:
        return db.execute(sql).fetchall()


def test_the_pairs_table_says_which_images_each_comparison_compared_in_old_registers_too(tmp_path):
    """Without it a pair left unregistered reads as all its cracks gone, then all new at the next visit."""
    register = tmp_path / "site.gpkg"
    pairs = [{"before_image": "a.png", "after_image": "a.png", "status": "registered"},
             {"before_image": "b.png", "after_image": "b.png", "status": "unregistered"},
             {"before_image": None, "after_image": "c.png", "status": "only after"}]
    append_comparison(register, VISITS[0], VISITS[1], Compared((CRACKS[0], CRACKS[1]), LINKS[0], pairs), None)
    with sqlite3.connect(register) as db:  # as a register written before the table
        db.execute('DROP TABLE "pairs"')
        db.execute("DELETE FROM gpkg_contents WHERE table_name = 'pairs'")
        db.execute("DELETE FROM gpkg_ogr_contents WHERE table_name = 'pairs'")
    append_comparison(register, VISITS[1], VISITS[2], Compared((CRACKS[1], CRACKS[2]), LINKS[1], pairs[:1]), None)
    assert _table(register, "SELECT before_survey, after_survey, before_image, after_image, status FROM pairs") == [
        (2, 3, "a.png", "a.png", "registered")]
    info, *_, fields = pyogrio.raw.read(register, layer="pairs")
    assert list(fields[-1]) == ["registered"]  # GDAL reads the table made by SQL
    append_comparison(tmp_path / "new.gpkg", VISITS[0], VISITS[1], Compared((CRACKS[0], CRACKS[1]), LINKS[0], pairs), None)
    assert _table(tmp_path / "new.gpkg", "SELECT before_survey, after_survey, before_image, after_image, status FROM pairs") == [
        (1, 2, "a.png", "a.png", "registered"), (1, 2, "b.png", "b.png", "unregistered"), (1, 2, None, "c.png", "only after")]
    assert _table(tmp_path / "new.gpkg", "SELECT feature_count FROM gpkg_ogr_contents WHERE table_name = 'pairs'") == [(3,)]


@pytest.mark.parametrize("case", ["a crack in an image registered crack-free", "no crack in an image registered with cracks"])
def test_a_reused_survey_measured_otherwise_is_refused_on_crack_free_images_too(tmp_path, case):
    """b.png was registered at visit 2 without cracks: a comparison from visit 2 that finds one there (or none in a.png,
    registered with three) measured visit 2 otherwise, and its cracks would be new at a visit that did not see them."""
    register = tmp_path / "site.gpkg"
    pairs = [{"before_image": image, "after_image": image, "status": "registered"} for image in ("a.png", "b.png")]
    append_comparison(register, VISITS[0], VISITS[1], Compared((CRACKS[0], CRACKS[1]), LINKS[0], pairs), None)
    original = register.read_bytes()
    if case.startswith("a crack"):
        before, links = CRACKS[1] + [{**_crack(1, 60, 2, 30, 0.5), "image": "b.png"}], LINKS[1]
        message = "crack 1 of b.png differs from the one registered for that survey"
    else:
        before, links = [], []
        message = "crack 1 of a.png differs from the one registered for that survey"
    with pytest.raises(InputError, match=f"^{register}: {message}"):
        append_comparison(register, VISITS[1], VISITS[2], Compared((before, CRACKS[2] if before else []), links, pairs), None)
    assert register.read_bytes() == original
    with pytest.raises(InputError, match=message):
        check_cracks(register, VISITS[1], VISITS[2], before, {"a.png", "b.png"})


def test_three_visits_make_one_register_that_follows_a_crack_through_them(tmp_path):
    register = tmp_path / "site.gpkg"
    assert _compare(register, 0) == {"surveys": 2, "cracks": 5, "links": 2}
    assert _compare(register, 1) == {"surveys": 1, "cracks": 2, "links": 2}  # visit 2 is reused, not added again
    assert [p.name for p in tmp_path.iterdir()] == ["site.gpkg"]  # no temp or journal file left beside it

    assert _table(register, "SELECT survey, date, source FROM surveys ORDER BY survey") == [
        (1, "2023-04-01", "visits/2023"), (2, "2024-04-01", "visits/2024"), (3, "2025-04-01", "visits/2025")]
    assert _table(register, "SELECT survey, count(*) FROM cracks GROUP BY survey") == [(1, 2), (2, 3), (3, 2)]
    keys = [key for (key,) in _table(register, "SELECT crack_key FROM cracks")]
    assert len(set(keys)) == 7
    assert _table(register, """SELECT b.survey, b.crack, a.survey, a.crack, l.status FROM links AS l
                               JOIN cracks AS b ON b.crack_key = l.before_key JOIN cracks AS a ON a.crack_key = l.after_key
                               ORDER BY b.survey, b.crack""") == [
        (1, 1, 2, 1, "longer"), (1, 2, 2, 2, "wider"), (2, 1, 3, 1, "wider"), (2, 3, 3, 2, "unchanged")]

    # GIS tools list the four tables: one layer of lines, three attribute tables; and QGIS's layer_styles
    assert sorted(map(tuple, pyogrio.list_layers(register))) == [
        ("cracks", "MultiLineString"), ("layer_styles", None), ("links", None), ("pairs", None), ("surveys", None)]
    assert sorted(_table(register, "SELECT table_name, data_type FROM gpkg_contents")) == [
        ("cracks", "features"), ("layer_styles", "attributes"), ("links", "attributes"), ("pairs", "attributes"),
        ("surveys", "attributes")]
    # the cracks' default style, as QGIS selects it; made without width classes: red lines
    assert [(name, 'type="singleSymbol"' in qml) for name, qml in _table(
        register, "SELECT f_table_name, styleQML FROM layer_styles WHERE f_table_schema = '' AND f_geometry_column = 'geom' "
                  "AND useAsDefault")] == [("cracks", True)]
    info, _, geometries, fields = pyogrio.raw.read(register, layer="cracks")
    columns = dict(zip(info["fields"], fields))
    assert info["crs"] is None and [int(v) for v in columns["crack"]] == [1, 2, 1, 2, 3, 1, 2]
    lines = shapely.from_wkb(geometries)
    assert lines[0].equals(shapely.MultiLineString([[(10, 10), (110, 10)]])) and lines[6].length == 30
    assert columns["max_width_mm"][0] != columns["max_width_mm"][0] and columns["max_width_mm"][2] == 1.5  # NULL reads as NaN
    assert list(columns["max_width_class"][:3]) == [None, None, "0.3-1 mm"]

    history = width_history(register, "2023-04-01", "a.png", 1)
    assert [(row["date"], row["max_width_px"], row["max_width_mm"], row["status"]) for row in history] == [
        ("2023-04-01", 3.0, None, None), ("2024-04-01", 3.0, 1.5, "longer"), ("2025-04-01", 5.0, 2.5, "wider")]
    assert [row["date"] for row in width_history(register, "2024-04-01", "a.png", 2)] == ["2024-04-01"]  # gone in 2025

    sqlite_shell = shutil.which("sqlite3")
    if sqlite_shell:  # the query as the README gives it: quoted text parameters (unquoted, 2023-04-01 would be 2018)
        shell = subprocess.run([sqlite_shell, "-bail", register, ".parameter set :date \"'2023-04-01'\"",
                                ".parameter set :image \"'a.png'\"", ".parameter set :crack 1", WIDTH_HISTORY],
                               capture_output=True, text=True, check=True)
        assert shell.stdout.split() == ["2023-04-01|a.png|1|3.0||", "2024-04-01|a.png|1|3.0|1.5|longer",
                                        "2025-04-01|a.png|1|5.0|2.5|wider"]


def test_a_crack_the_other_date_shows_below_the_minimum_length_is_linked_to_nothing_with_its_status(tmp_path):
    """changes.csv's rows with one side empty (a short crack there): neither new nor gone in the register either."""
    register = tmp_path / "site.gpkg"
    links = [_link(1, 1, "longer"), {**_link(2, 0, "shorter"), "after_crack": None}, {**_link(0, 3, "longer"), "before_crack": None}]
    assert append_comparison(register, VISITS[0], VISITS[1], Compared((CRACKS[0], CRACKS[1]), links), None)["links"] == 3
    assert _table(register, """SELECT b.crack, a.crack, l.status FROM links AS l LEFT JOIN cracks AS b ON b.crack_key = l.before_key
                               LEFT JOIN cracks AS a ON a.crack_key = l.after_key ORDER BY l.status, b.crack""") == [
        (None, 3, "longer"), (1, 1, "longer"), (2, None, "shorter")]  # SQLite sorts NULL first
    assert [row["status"] for row in width_history(register, "2023-04-01", "a.png", 2)] == [None]  # the chain ends there
    assert _compare(register, 1)["links"] == 2  # the next append's keys start above every key a link holds


def test_a_georeferenced_register_keeps_its_crs_and_map_coordinates(tmp_path):
    register = tmp_path / "site.gpkg"
    east, north = 500000.0, 5000000.0  # UTM 33N metres, 2 mm pixels
    cracks = ([{**_crack(1, 1000, 2, 0, 2.0), "geometry": shapely.LineString([(east, north), (east + 2, north - 1)])}],
              [{**_crack(1, 1250, 3, 0, 2.0), "geometry": shapely.LineString([(east, north), (east + 2.5, north - 1)])}])
    append_comparison(register, VISITS[0], VISITS[1], Compared(cracks, [_link(1, 1, "longer+wider")]), "EPSG:32633")
    info, _, geometries, _ = pyogrio.raw.read(register, layer="cracks")
    assert info["crs"] == "EPSG:32633"
    assert [line.bounds for line in shapely.from_wkb(geometries)] == [(east, north - 1, east + 2, north), (east, north - 1, east + 2.5, north)]


def test_a_register_made_with_width_classes_opens_in_qgis_coloured_by_the_graded_class(tmp_path):
    """The style is the first comparison's: a later append leaves it (and any style saved in QGIS) alone."""
    register, classes = tmp_path / "site.gpkg", WIDTH_CLASS_PRESETS["d6433-pcc"]
    append_comparison(register, VISITS[0], VISITS[1], Compared((CRACKS[0], CRACKS[1]), LINKS[0]), None, classes)
    _compare(register, 1)
    ((name, qml),) = _table(register, "SELECT f_table_name, styleQML FROM layer_styles WHERE useAsDefault")
    renderer = ET.fromstring(qml).find("renderer-v2")
    assert name == "cracks" and (renderer.get("type"), renderer.get("attr")) == ("categorizedSymbol", "mean_width_class")
    assert [category.get("value") for category in renderer.iter("category")] == ["L", "M", "H", ""]  # NULL: "no class"
    _assert_valid_geopackage(register, 7)


def test_an_error_in_the_middle_of_an_append_leaves_the_register_as_it_was(tmp_path, monkeypatch):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    link_columns = history._link_columns

    def fail_at_links(links, *args):
        if links:  # surveys and cracks are already appended
            raise OSError("disk full")
        return link_columns(links, *args)

    monkeypatch.setattr(history, "_link_columns", fail_at_links)
    with pytest.raises(OSError, match="disk full"):
        _compare(register, 1)
    assert register.read_bytes() == original and [p.name for p in tmp_path.iterdir()] == ["site.gpkg"]

    with pytest.raises(OSError, match="disk full"):  # a new register: no file at all
        _compare(tmp_path / "new.gpkg", 0)
    assert [p.name for p in tmp_path.iterdir()] == ["site.gpkg"]


@pytest.mark.parametrize("case, message", [
    ("after registered", "visits/2024 is already registered; nothing appended"),
    ("older visit", "visits/2024; visits are appended in date order"),
    ("other crs", "its cracks are in pixel coordinates (no CRS), this comparison's in EPSG:32633"),
    ("other settings", "crack 2 of a.png differs from the one registered for that survey (it was probably measured with other settings"),
])
def test_a_refused_append_names_the_register_and_leaves_it_as_it_was(tmp_path, case, message):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    with pytest.raises(InputError, match=f"^{register}: ") as error:
        if case == "after registered":
            append_comparison(register, Survey("2022-01-01", "visits/2022"), VISITS[1], Compared(([], CRACKS[1]), []), None)
        elif case == "older visit":
            append_comparison(register, Survey("2024-01-01", "visits/2024-01"), VISITS[2], Compared(([], CRACKS[2]), []), None)
        elif case == "other crs":
            _compare(register, 1, crs="EPSG:32633")
        else:
            _compare(register, 1, cracks=(CRACKS[1][:1] + [_crack(2, 41, 4, 50, 0.5)] + CRACKS[1][2:], CRACKS[2]))
    assert message in str(error.value)
    assert register.read_bytes() == original and [p.name for p in tmp_path.iterdir()] == ["site.gpkg"]


@pytest.mark.parametrize("before, after, message", [
    ("2024/04/01", "2025-04-01", "--before-date 2024/04/01: not a date; give it as YYYY-MM-DD"),
    ("2024-04-01", "2025-02-30", "--after-date 2025-02-30: not a date"),
    ("2024-04-01", "20250401", "--after-date 20250401: not a date"),
    ("2024-04-01", "2024-04-01", "--after-date 2024-04-01: not later than --before-date 2024-04-01"),
])
def test_dates_are_iso_dates_in_order(tmp_path, before, after, message):
    with pytest.raises(InputError, match=message):
        append_comparison(tmp_path / "site.gpkg", Survey(before, "b"), Survey(after, "a"), Compared(([], []), []), None)
    assert not list(tmp_path.iterdir())


def test_check_append_refuses_what_the_append_would_before_any_work_and_writes_nothing(tmp_path):
    register = tmp_path / "site.gpkg"
    check_append(register, VISITS[0], VISITS[1])  # a new register: nothing to refuse
    assert not register.exists()
    _compare(register, 0)
    original = register.read_bytes()
    check_append(register, VISITS[1], VISITS[2])
    for before, after, message in [(VISITS[0], VISITS[1], "is already registered"), (Survey("2024-01-01", "x"), VISITS[2], "date order"),
                                   (VISITS[1], Survey("2024-04-01", "y"), "not later than")]:
        with pytest.raises(InputError, match=message):
            check_append(register, before, after)
    (tmp_path / "notes.gpkg").write_text("not a database")
    with pytest.raises(InputError, match="not a crack register"):
        check_append(tmp_path / "notes.gpkg", VISITS[0], VISITS[1])
    assert register.read_bytes() == original and sorted(p.name for p in tmp_path.iterdir()) == ["notes.gpkg", "site.gpkg"]


def _lock(lock: Path, pid: int) -> None:
    """A register lock as core.locks writes it for process ``pid`` of this host."""
    import json
    import socket

    lock.write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "process_start": None, "since": "earlier",
                                "job": None, "attempt": 0}) + "\n")


def test_a_register_another_compare_is_appending_to_is_refused_naming_its_lock(tmp_path):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    lock = tmp_path / ".site.gpkg.lock"
    _lock(lock, os.getpid())  # a live process: this one
    with pytest.raises(InputError, match=f"^{register}: another crackseg compare is appending to it: pid {os.getpid()} .*delete {lock} "):
        _compare(register, 1)
    assert register.read_bytes() == original and lock.exists()
    lock.write_text("12345\n")  # an older crackseg's lock: a bare pid, no host to check it on
    with pytest.raises(InputError, match=f"its lock file {lock} is unreadable"):
        _compare(register, 1)
    lock.unlink()
    _compare(register, 1)
    assert not lock.exists()


def test_a_register_reached_through_a_link_takes_the_same_lock(tmp_path):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    (tmp_path / "elsewhere").mkdir()
    link = tmp_path / "elsewhere" / "current.gpkg"
    link.symlink_to(register)
    _lock(tmp_path / ".site.gpkg.lock", os.getpid())
    with pytest.raises(InputError, match=f"^{link}: another crackseg compare is appending to it"):
        _compare(link, 1)
    assert not (tmp_path / "elsewhere" / ".current.gpkg.lock").exists()


def test_a_register_lock_left_by_a_dead_process_is_taken_over(tmp_path, capsys):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    dead = subprocess.Popen(["true"])
    dead.wait()
    _lock(tmp_path / ".site.gpkg.lock", dead.pid)
    _compare(register, 1)
    assert "no longer running; taking it over" in capsys.readouterr().err
    assert not (tmp_path / ".site.gpkg.lock").exists()
    assert _table(register, "SELECT count(*) FROM surveys")[0][0] == 3


def test_the_new_register_is_on_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """A new register: fsync of the file built under a temporary name and of the folder after the rename (an existing one
    is extended in SQLite's transaction, which syncs its journal and the file)."""
    synced = []
    fsync = os.fsync

    def record(descriptor):
        mode = os.fstat(descriptor).st_mode
        synced.append("file" if stat.S_ISREG(mode) else "folder" if stat.S_ISDIR(mode) else "other")
        fsync(descriptor)

    monkeypatch.setattr(os, "fsync", record)
    _compare(tmp_path / "site.gpkg", 0)
    assert synced[-2:] == ["file", "folder"]


def test_the_readme_gives_the_width_history_query_as_the_register_runs_it():
    readme = (Path(__file__).resolve().parents[2] / "docs" / "compare.md").read_text()
    shown = readme[readme.index("```sql") + len("```sql"):].split("```")[0]
    assert shown.split() == WIDTH_HISTORY.split()


# The register extended in place, in SQLite's own transaction: other programs, kills, permissions, duplicates.


def _assert_valid_geopackage(register: Path, features: int) -> None:
    """What GDAL and QGIS rely on: an intact file, an R-tree entry per non-empty line, the feature counts of
    gpkg_ogr_contents and the extent in gpkg_contents."""
    with closing(sqlite3.connect(register)) as db:  # closed before GDAL, another SQLite library, opens the file
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT rtreecheck('rtree_cracks_geom')").fetchone()[0] == "ok"
        counts = dict(db.execute("SELECT table_name, feature_count FROM gpkg_ogr_contents"))
        tables = ("surveys", "cracks", "links", "pairs", "layer_styles")
        assert counts == {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in tables}
        indexed = db.execute("SELECT id, minx, maxx, miny, maxy FROM rtree_cracks_geom ORDER BY id").fetchall()
        extent = db.execute("SELECT min_x, min_y, max_x, max_y FROM gpkg_contents WHERE table_name = 'cracks'").fetchone()
    info = pyogrio.read_info(register, layer="cracks", force_feature_count=True, force_total_bounds=True)
    assert info["features"] == counts["cracks"] == features
    _, fids, geometries, _ = pyogrio.raw.read(register, layer="cracks", return_fids=True)
    lines = shapely.from_wkb(geometries)
    assert [fid for fid, line in zip(fids, lines) if not line.is_empty] == [row[0] for row in indexed]
    for (_, *box), line in zip(indexed, (line for line in lines if not line.is_empty)):
        x0, y0, x1, y1 = line.bounds
        assert box == pytest.approx([x0, x1, y0, y1], abs=1e-3)  # the R-tree stores 32-bit floats, rounded outwards
    assert extent == pytest.approx(shapely.union_all(lines).bounds)


def test_appends_keep_the_geopackage_valid_for_gis_tools(tmp_path):
    register = tmp_path / "site.gpkg"
    cracks = (CRACKS[0], CRACKS[1][:2] + [{**CRACKS[1][2], "geometry": None}])  # a blob without a centreline: an empty line
    _compare(register, 0, cracks=cracks)
    _assert_valid_geopackage(register, 5)
    _compare(register, 1, cracks=(cracks[1], CRACKS[2]))
    _assert_valid_geopackage(register, 7)


def test_an_edit_saved_by_another_program_in_wal_mode_is_kept_by_the_next_append(tmp_path):
    """QGIS keeps a GeoPackage in WAL mode: its saved edits may lie in the -wal file while it holds the register open."""
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    qgis = sqlite3.connect(register)
    try:
        assert qgis.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        with qgis:
            qgis.execute("UPDATE surveys SET source = 'visits/2023 (checked on site)' WHERE survey = 1")
        assert Path(f"{register}-wal").exists() and Path(f"{register}-shm").exists()
        assert _compare(register, 1) == {"surveys": 1, "cracks": 2, "links": 2}
        assert qgis.execute("SELECT count(*) FROM surveys").fetchone()[0] == 3  # the holder sees the new survey
    finally:
        qgis.close()
    assert _table(register, "SELECT survey, source FROM surveys ORDER BY survey") == [
        (1, "visits/2023 (checked on site)"), (2, "visits/2024"), (3, "visits/2025")]
    _assert_valid_geopackage(register, 7)


_KILLED_AT_LINKS = """
import os, signal, sys
sys.path[:0] = [{tests!r}, {conftest!r}]
from crackseg.monitoring import history
from test_history import _compare
history._link_columns = lambda *args: os.kill(os.getpid(), signal.SIGKILL)  # surveys and cracks are appended by now
_compare({register!r}, 1)
"""


def test_a_compare_killed_in_the_middle_of_an_append_leaves_the_register_and_the_next_one_appends(tmp_path, capsys):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    code = _KILLED_AT_LINKS.format(tests=str(Path(__file__).parent), conftest=str(Path(__file__).parents[1]), register=str(register))
    killed = subprocess.run([sys.executable, "-c", code], cwd=tmp_path)  # where the visits lie, as for the other appends
    assert killed.returncode == -9
    assert (tmp_path / ".site.gpkg.lock").exists()  # its lock, naming a dead process
    assert _table(register, "SELECT count(*) FROM surveys") == [(2,)]  # reading rolls back what SQLite's journal holds
    assert register.read_bytes() == original
    assert _compare(register, 1) == {"surveys": 1, "cracks": 2, "links": 2}
    assert "which is no longer running; taking it over" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["site.gpkg"]  # no lock, journal or copy left
    _assert_valid_geopackage(register, 7)


def test_a_temporary_copy_left_by_an_older_crackseg_is_removed_by_the_next_append(tmp_path):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    left = [tmp_path / ".site.gpkg.0a1b2c3d.crackseg-tmp.gpkg", tmp_path / ".site.gpkg.0a1b2c3d.crackseg-tmp.gpkg-journal"]
    for path in left:
        path.write_bytes(b"half a register")
    others = [".other.gpkg.0a1b2c3d.crackseg-tmp.gpkg", ".site.gpkg-old.gpkg.0a1b2c3d.crackseg-tmp.gpkg"]  # other files' temps
    for name in others:
        (tmp_path / name).write_bytes(b"another file's")
    _compare(register, 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [*others, "site.gpkg"]


@pytest.mark.parametrize("case", ["read-only file", "read-only folder"])
def test_a_register_that_cannot_be_written_is_refused_before_anything_is_written(tmp_path, monkeypatch, case):
    register = tmp_path / "site" / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    if case == "read-only file":
        register.chmod(0o444)
        message = f"^{register}: is read-only \\(mode 0444\\)"
    elif os.geteuid() == 0:  # root writes anywhere but on a read-only mount: the error such a mount gives
        read_only_mount(monkeypatch, register.parent)
        message = f"^{register}: its folder {register.parent} cannot be written \\(Read-only file system\\)"
    else:
        register.parent.chmod(0o555)
        message = f"^{register}: its folder {register.parent} cannot be written"
    try:
        with pytest.raises(InputError, match=message):
            check_append(register, VISITS[1], VISITS[2])
        with pytest.raises(InputError, match=message):
            _compare(register, 1)
        assert register.read_bytes() == original and stat.S_IMODE(register.stat().st_mode) == (0o444 if case == "read-only file" else 0o644)
        assert [p.name for p in register.parent.iterdir()] == ["site.gpkg"]
    finally:
        register.parent.chmod(0o755)


@pytest.mark.parametrize("before, after, message", [
    (VISITS[1], Survey("2025-04-01", "visits/2024"), "visits/2024; a register holds each inspection once"),
    (Survey("2024-06-01", "visits/2024"), VISITS[2], "visits/2024 is registered already as the survey of 2024-04-01, not 2024-06-01 (--before-date)"),
    (VISITS[1], Survey("2025-04-01", "visits/2023"), "visits/2023 is registered already as the survey of 2023-04-01, not 2025-04-01 (--after-date)"),
])
def test_an_inspection_is_registered_once_under_one_date(tmp_path, before, after, message):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    original = register.read_bytes()
    for append in (lambda: check_append(register, before, after), lambda: append_comparison(register, before, after, Compared(tuple(CRACKS[1:3]), []), None)):
        with pytest.raises(InputError, match=f"^{register}: ") as error:
            append()
        assert message in str(error.value)
    assert register.read_bytes() == original


@pytest.mark.parametrize("hold", ["BEGIN IMMEDIATE", "BEGIN EXCLUSIVE"])
def test_a_register_another_program_is_writing_to_is_reported_busy(tmp_path, monkeypatch, hold):
    """A write transaction of another program (reserved: others may still read; exclusive: committing) is waited for
    a short while, then reported as busy, naming the file: never as "not a crack register"."""
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    monkeypatch.setattr(register_file, "BUSY_TIMEOUT_S", 0.2, raising=False)
    writer = sqlite3.connect(register, isolation_level=None)
    try:
        writer.execute(hold)
        writer.execute("UPDATE surveys SET source = 'edited' WHERE survey = 1")
        for append in (lambda: check_append(register, VISITS[1], VISITS[2]), lambda: _compare(register, 1)):
            with pytest.raises(InputError, match=f"^{register}: busy: another program is writing to it .*database is locked"):
                append()
        writer.execute("COMMIT")
    finally:
        writer.close()
    _compare(register, 1)
    assert _table(register, "SELECT survey, source FROM surveys ORDER BY survey") == [(1, "edited"), (2, "visits/2024"), (3, "visits/2025")]


def test_check_append_names_the_compare_that_holds_the_register_lock(tmp_path):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    lock = tmp_path / ".site.gpkg.lock"
    _lock(lock, os.getpid())  # a live process: this one
    with pytest.raises(InputError, match=f"^{register}: another crackseg compare is appending to it: pid {os.getpid()} .*delete {lock} "):
        check_append(register, VISITS[1], VISITS[2])


def test_a_register_written_before_surveys_kept_their_scale_takes_any_and_records_it_from_then_on(tmp_path):
    register = tmp_path / "site.gpkg"
    _compare(register, 0)
    with sqlite3.connect(register) as db:
        for column in ("px_size_mm", "width_classes"):
            db.execute(f'ALTER TABLE surveys DROP COLUMN "{column}"')
    scaled = [dataclasses.replace(visit, px_size_mm=0.5, width_classes="bre251") for visit in VISITS]
    append_comparison(register, scaled[1], scaled[2], Compared((CRACKS[1], CRACKS[2]), LINKS[1]), None)
    assert _table(register, "SELECT survey, px_size_mm, width_classes FROM surveys ORDER BY survey") == [
        (1, None, None), (2, None, None), (3, 0.5, "bre251")]
    with pytest.raises(InputError, match=r"its surveys are graded with --width-classes bre251 \(the latest, 2025-04-01\), this comparison with no --width-classes"):
        check_append(register, VISITS[2], Survey("2026-04-01", "visits/2026"))
