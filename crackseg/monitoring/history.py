"""The crack register: one GeoPackage per site that accumulates its inspections, so that a crack can be
followed from visit to visit in QGIS or with plain SQL (:data:`WIDTH_HISTORY`).

Tables (GIS tools list them all; all but ``cracks`` are attribute tables, as is QGIS's ``layer_styles``):

- ``surveys``: ``survey`` (1, 2, ... in date order), ``date`` (YYYY-MM-DD), ``source`` (the inspection folder, relative
  to the register's folder, or its URL), ``px_size_mm`` and ``width_classes`` (compare's --px-size, NULL without one, and
  --width-classes, "" without; a register holds one of each).
- ``cracks``: MultiLineString features, one per crack per survey: ``crack_key`` (unique in the register, the
  key links use), ``survey``, ``image`` (its name within the inspection), ``crack`` (its id in that survey's
  cracks.csv), ``length_px``, ``mean_width_px``, ``max_width_px``, the same in mm (NULL when the pixel size is unknown),
  ``max_width_class`` or ``mean_width_class`` (the width its standard grades; NULL without width classes). Geometries are
  in the register's one CRS for georeferenced rasters, else in pixels of the survey's own image (x right, y down; no CRS).
  QGIS opens them coloured by the width class of the comparison that made the register (its default style, kept in
  ``layer_styles``: :func:`crackseg.cracks.styles.width_class_style`), or as red lines when it had none.
- ``links``: ``before_key`` -> ``after_key``, a crack and its successor in the next survey, with ``status``
  (the change between them as changes.csv gives it: unchanged, longer, wider, merged, ...); a side is NULL where that
  survey shows the crack shorter than predict's minimum length (no crack of its cracks.csv), as changes.csv leaves it
  empty, and on the other side of a ``not seen`` link (a crack outside the view both dates share): such a crack is
  not new nor gone.
- ``pairs``: each comparison's image pairs as pairs.csv gives them: ``before_survey``, ``after_survey``,
  ``before_image``, ``after_image`` (NULL for an image only one visit has), ``status`` (registered, unregistered, failed,
  only before, only after). Where a pair was registered, a crack of its BEFORE image without a link to the next survey is
  gone and one of its AFTER image without a link from the previous is new; where it was not, its
  cracks were not compared, and have no links for that step.

A comparison appends its AFTER survey, and its BEFORE survey unless the previous comparison registered it as
its AFTER (then BEFORE's registered cracks are linked). Visits are appended in date order, and each inspection
(its folder) once: a folder registered under one date is refused under another.

The register is extended in place, in one SQLite write transaction (BEGIN IMMEDIATE ... COMMIT) as every SQLite
client writes it, so QGIS may hold it open (WAL mode or not) and an error, a kill or a power loss leaves it as it
was. Rows are written as GDAL writes them (GeoPackage geometry blobs; the R-tree kept by the file's own triggers,
whose ST_* functions :mod:`crackseg.cracks.vectors` defines), gpkg_contents and gpkg_ogr_contents kept right; a new register is built
under a temporary name, then renamed. Another program's write transaction is waited for
:data:`crackseg.monitoring.register_file.BUSY_TIMEOUT_S`, then reported busy; a second compare is kept out by a lock
file beside the register, taken over when the compare that left it was killed on this host (the file's lock, checks
and transaction: :mod:`crackseg.monitoring.register_file`).

Needs the geo extra: ``pip install 'crackseg[geo]'``.
"""

from __future__ import annotations

import math
import os
import sqlite3
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.core.files import PendingFile, cell_number, readable
from crackseg.core.locks import FileLock
from crackseg.cracks.styles import width_class_style
from crackseg.cracks.vectors import gpkg_envelope, gpkg_geometry_blob, sqlite_logs, write_layer, write_styles
from crackseg.cracks.widths import WidthClasses
from crackseg.monitoring.register_file import (APPENDING, BUSY_TIMEOUT_S, add_attribute_table, check_writable, locked,
                                               register_error, transaction, update_contents)
from crackseg.monitoring.surveys import SCALE_COLUMNS, Survey, check_dates, check_surveys, placed, registered_surveys, survey_columns

_MEASURES = ("length_px", "mean_width_px", "max_width_px", "length_mm", "mean_width_mm", "max_width_mm")
_CLASSES = ("max_width_class", "mean_width_class")  # a crack has the one of the width its standard grades
_TABLES = ("surveys", "cracks", "links", "pairs")
_PAIRS = {"before_survey": "INTEGER", "after_survey": "INTEGER", "before_image": "TEXT", "after_image": "TEXT", "status": "TEXT"}

# Parameters :date (YYYY-MM-DD), :image and :crack name the crack in the survey of that date; the rows are that
# crack and its successors in every later survey (a split crack has several on a date), with the change since
# the previous survey (NULL on the first row).
WIDTH_HISTORY = """\
WITH RECURSIVE chain(crack_key, status) AS (
    SELECT c.crack_key, NULL
      FROM cracks AS c JOIN surveys AS s ON s.survey = c.survey
     WHERE s.date = :date AND c.image = :image AND c.crack = :crack
    UNION
    SELECT l.after_key, l.status
      FROM chain JOIN links AS l ON l.before_key = chain.crack_key
)
SELECT s.date, c.image, c.crack, c.max_width_px, c.max_width_mm, chain.status
  FROM chain JOIN cracks AS c ON c.crack_key = chain.crack_key
             JOIN surveys AS s ON s.survey = c.survey
 ORDER BY s.date, c.image, c.crack;
"""


@dataclass(frozen=True)
class Compared:
    """What one comparison adds to the register. ``cracks``: BEFORE's and AFTER's crack dicts (image, crack, length_px,
    mean_width_px, max_width_px, optionally the mm and the width class, None or "" when unknown, and geometry: a shapely
    line in the register's CRS, or in pixels of the survey's image without one). A link dict names before_image,
    before_crack, after_image, after_crack and status; a pair, before_image and after_image (None for an image only one
    side has) and status."""

    cracks: tuple[list[dict], list[dict]]
    links: list[dict]
    pairs: list[dict] = field(default_factory=list)


def append_comparison(register: Path, before: Survey, after: Survey, compared: Compared, crs: str | None,
                      classes: WidthClasses | None = None) -> dict:
    """Append one comparison to ``register`` (created when missing), its cracks in ``crs`` (None: pixels); returns the
    surveys, cracks and links added. ``classes``: the comparison's width classes, which a new register's QGIS style
    colours its cracks by."""
    register, (before, after) = Path(register), placed(before, after)
    check_dates(before, after)
    check_writable(register)
    with locked(register):
        if not register.exists():
            return _create(register, (before, after), compared, crs, classes)
        with transaction(register, register) as db:
            return _append(db, register, (before, after), compared, crs)


def check_append(register: Path, before: Survey, after: Survey, crs: frozenset | set = frozenset()) -> None:
    """Refuse now, before a comparison's work, what :func:`append_comparison` would refuse: dates that are not YYYY-MM-DD
    or not in order, a file that is not a register, one that cannot be written (read-only, in a read-only folder),
    one another compare or program is writing to, AFTER registered already, an inspection registered under another
    date, BEFORE older than the register's latest survey, and pairs in ``crs`` (the CRSs their AFTER files lie in,
    None for pixel coordinates) that the register cannot hold. Writes nothing."""
    register, (before, after) = Path(register), placed(before, after)
    check_dates(before, after)
    if len(crs) > 1:
        raise InputError(f"--register {register}: the pairs lie in several CRSs or mix photos and rasters "
                         f"({', '.join(sorted(map(str, crs)))}); a register holds one site in one CRS")
    check_writable(register)
    FileLock(register, APPENDING).check()
    if register.exists():
        with transaction(register, register, write=False) as db:  # takes the write lock: a busy register is told now
            check_surveys(register, registered_surveys(db, register), before, after)
            for one in crs:
                _check_crs(register, _registered_crs(db), one)


def check_cracks(register: Path, before: Survey, after: Survey, before_cracks: list[dict], before_images: set[str]) -> None:
    """Refuse now, before a comparison's outputs are written, BEFORE's cracks that differ from those the register holds
    for that survey (another model, other settings, another pixel size or standard, an edited register); ``before_images``:
    the BEFORE images of the pairs registered, crack-free ones included. Writes nothing."""
    register, (before, after) = Path(register), placed(before, after)
    if register.exists():
        with transaction(register, register, write=False) as db:
            reused = check_surveys(register, registered_surveys(db, register), before, after)
            if reused is not None:
                _registered_keys(db, register, reused, before_cracks, before_images)


def width_history(register: Path, date: str, image: str, crack: int) -> list[dict]:
    """The rows of :data:`WIDTH_HISTORY` for crack ``crack`` of ``image`` in the survey of ``date``, oldest first."""
    if not Path(register).is_file():
        raise InputError(f"{register}: no such register")
    try:
        with closing(sqlite3.connect(f"{Path(register).resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(WIDTH_HISTORY, {"date": date, "image": image, "crack": crack})]
    except sqlite3.DatabaseError as error:
        raise register_error(register, error) from None


def _create(register: Path, surveys: tuple[Survey, Survey], compared: Compared, crs: str | None, classes: WidthClasses | None) -> dict:
    """A new register: its empty layers and the cracks' QGIS style made by GDAL under a temporary name, the rows appended
    as to any register, the file on disk (fsynced) before the rename makes it the register."""
    pending = PendingFile(register, suffix=".gpkg")
    try:
        pending.temp.unlink()  # GDAL creates the file itself
        write_layer(pending.temp, "surveys", survey_columns([], register), named=register)
        write_layer(pending.temp, "cracks", _crack_columns([]), np.array([], dtype=object), crs, append=True, named=register)
        write_layer(pending.temp, "links", _link_columns([], {}, {}), append=True, named=register)
        write_styles(pending.temp, {"cracks": width_class_style(classes)}, named=register)
        with transaction(pending.temp, register) as db:
            added = _append(db, register, surveys, compared, crs, check_crs=False)  # made in crs
        with open(pending.temp, "rb") as file:
            os.fsync(file.fileno())
        pending.commit(durable=True)
    except BaseException:
        for file in (pending.temp, *sqlite_logs(pending.temp)):
            file.unlink(missing_ok=True)
        raise
    return added


def _append(db: sqlite3.Connection, register: Path, surveys: tuple[Survey, Survey], compared: Compared, crs: str | None,
            check_crs: bool = True) -> dict:
    """Append to the register open in ``db``'s write transaction."""
    before, after = surveys
    cracks, links, pairs = compared.cracks, compared.links, compared.pairs
    registered = registered_surveys(db, register)
    reused = check_surveys(register, registered, before, after)
    if check_crs:
        _check_crs(register, _registered_crs(db), crs)
    next_survey = max((survey.survey for survey in registered), default=0) + 1
    next_key = 1 + db.execute("SELECT max(coalesce((SELECT max(crack_key) FROM cracks), 0), coalesce((SELECT max(before_key) "
                              "FROM links), 0), coalesce((SELECT max(after_key) FROM links), 0))").fetchone()[0]  # never a deleted crack's

    new_surveys, new_cracks = [], []
    before_survey = next_survey if reused is None else reused
    if reused is None:
        before_keys = _numbered(cracks[0], next_key)
        new_surveys.append((next_survey, before))
        new_cracks.append((next_survey, cracks[0], next_key))
        next_survey, next_key = next_survey + 1, next_key + len(cracks[0])
    else:
        before_images = {pair["before_image"] for pair in pairs if pair["status"] == "registered" and pair["before_image"]}
        before_keys, unseen = _registered_keys(db, register, reused, cracks[0], before_images)
        before_keys |= _numbered(unseen, next_key)  # images of that survey that no earlier comparison registered
        new_cracks.append((reused, unseen, next_key))
        next_key += len(unseen)
    after_keys = _numbered(cracks[1], next_key)
    new_surveys.append((next_survey, after))
    new_cracks.append((next_survey, cracks[1], next_key))

    for table, names in (("cracks", {name: "TEXT" for name in _CLASSES}), ("surveys", SCALE_COLUMNS)):  # an older register gets them
        have = {row[1] for row in db.execute(f'PRAGMA table_info("{table}")')}
        for name in sorted(set(names) - have):
            db.execute(f'ALTER TABLE "{table}" ADD COLUMN "{name}" {names[name]}')
    srs_id = db.execute("SELECT srs_id FROM gpkg_geometry_columns WHERE lower(table_name) = 'cracks'").fetchone()[0]
    _insert(db, "surveys", survey_columns(new_surveys, register))
    geometries = [gpkg_geometry_blob(row.get("geometry"), srs_id) for _, rows, _ in new_cracks for row in rows]
    _insert(db, "cracks", {"geom": geometries, **_crack_columns(new_cracks)})
    _insert(db, "links", _link_columns(links, before_keys, after_keys))
    add_attribute_table(db, "pairs", _PAIRS)
    _insert(db, "pairs", {"before_survey": [before_survey] * len(pairs), "after_survey": [next_survey] * len(pairs),
                          **{f"{side}_image": [readable(pair[f"{side}_image"]) if pair[f"{side}_image"] else None for pair in pairs]
                             for side in ("before", "after")}, "status": [pair["status"] for pair in pairs]})
    update_contents(db, _TABLES, [box for box in map(gpkg_envelope, geometries) if box is not None])
    return {"surveys": len(new_surveys), "cracks": sum(len(rows) for _, rows, _ in new_cracks), "links": len(links)}


def _registered_crs(db: sqlite3.Connection) -> str | None:
    """The cracks' CRS as rasterio names it (EPSG:n, else its WKT), None for pixel coordinates (an undefined SRS). Read by
    SQL, not GDAL: a second SQLite library opening the file in this process would drop this connection's locks."""
    row = db.execute("SELECT s.organization, s.organization_coordsys_id, s.definition FROM gpkg_geometry_columns AS g JOIN "
                     "gpkg_spatial_ref_sys AS s ON s.srs_id = g.srs_id WHERE lower(g.table_name) = 'cracks'").fetchone()
    if row is None:
        raise sqlite3.DatabaseError("it has no cracks layer")
    organization, code, definition = row
    if organization.upper() == "EPSG":
        return f"EPSG:{code}"
    return None if definition == "undefined" or definition.startswith('LOCAL_CS["Undefined') else definition


def _check_crs(register: Path, registered: str | None, crs: str | None) -> None:
    if registered == crs:
        return
    if registered is not None and crs is not None:
        rasterio_crs = require("rasterio.crs", "geo", "--register").CRS
        if rasterio_crs.from_user_input(registered) == rasterio_crs.from_user_input(crs):  # one CRS written two ways
            return
    named = {None: "pixel coordinates (no CRS)"}
    raise InputError(f"{register}: its cracks are in {named.get(registered, registered)}, this comparison's in "
                     f"{named.get(crs, crs)}; a register holds one site in one CRS: give another --register")


def _registered_keys(db: sqlite3.Connection, register: Path, survey: int, cracks: list[dict],
                     compared_images: set[str]) -> tuple[dict[tuple[str, int], int], list[dict]]:
    """{(image, crack): crack_key} of a registered survey's images, once their cracks are found to be those of ``cracks``
    (of ``compared_images``, this comparison's BEFORE images: an image registered crack-free must still be, and one
    registered with cracks must still have them), and the crack dicts of images the survey does not hold yet (an image no
    earlier comparison registered)."""
    rows = db.execute("SELECT image, crack, crack_key, length_px, max_width_px FROM cracks WHERE survey = ?", (survey,)).fetchall()
    found = {(image, crack): values for image, crack, _, *values in rows}
    images = {image for image, _ in found} | _registered_images(db, survey)
    compared = {readable(image) for image in (*compared_images, *(row["image"] for row in cracks))} & images  # held here too
    given = {(readable(row["image"]), int(row["crack"])): [row["length_px"], row["max_width_px"]]
             for row in cracks if readable(row["image"]) in compared}
    here = {key: value for key, value in found.items() if key[0] in compared}
    differing = sorted(set(here) ^ set(given)) or sorted(key for key in given if not _same_px(here[key], given[key]))
    if differing:
        image, crack = differing[0]
        raise InputError(f"{register}: crack {crack} of {image} differs from the one registered for that survey (it was "
                         "probably measured with other settings or another model, or removed from the register); compare with "
                         "the settings used then")
    unseen = [row for row in cracks if readable(row["image"]) not in images]
    return {(image, crack): key for image, crack, key, *_ in rows}, unseen


def _registered_images(db: sqlite3.Connection, survey: int) -> set[str]:
    """The images of ``survey`` that a comparison registered (its pairs table), crack-free ones included; none in a
    register from before pairs were recorded."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'pairs'").fetchone() is None:
        return set()
    rows = db.execute("SELECT before_image FROM pairs WHERE before_survey = ? AND status = 'registered' UNION "
                      "SELECT after_image FROM pairs WHERE after_survey = ? AND status = 'registered'", (survey, survey))
    return {image for (image,) in rows if image}


def _same_px(registered: list, given: list) -> bool:
    return all(math.isclose(_measure(a), _measure(b), rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(registered, given))


def _numbered(cracks: list[dict], first_key: int) -> dict[tuple[str, int], int]:
    return {(readable(row["image"]), int(row["crack"])): first_key + index for index, row in enumerate(cracks)}


def _crack_columns(batches: list[tuple[int, list[dict], int]]) -> dict[str, np.ndarray]:
    """Columns of the crack features of ``batches``: (survey id, crack dicts, key of the first)."""
    rows = [(survey, key + index, row) for survey, cracks, key in batches for index, row in enumerate(cracks)]
    return {"crack_key": np.array([key for _, key, _ in rows], np.int64), "survey": np.array([survey for survey, _, _ in rows], np.int64),
            "image": np.array([readable(row["image"]) for _, _, row in rows], object),
            "crack": np.array([int(row["crack"]) for _, _, row in rows], np.int64),
            **{name: np.array([cell_number(row.get(name)) for _, _, row in rows], np.float64) for name in _MEASURES},  # None: NaN, stored as NULL
            **{name: np.array([row.get(name) or None for _, _, row in rows], object) for name in _CLASSES}}


def _link_columns(links: list[dict], before_keys: dict, after_keys: dict) -> dict[str, np.ndarray | list]:
    """The links' columns; a side whose crack is None (shorter than the minimum length there, or not seen) is NULL."""
    def keys(side: str, known: dict) -> np.ndarray | list:
        values = [None if link[f"{side}_crack"] is None else known[readable(link[f"{side}_image"]), int(link[f"{side}_crack"])]
                  for link in links]
        return values if None in values else np.array(values, np.int64)  # typed, for the table GDAL creates

    return {"before_key": keys("before", before_keys), "after_key": keys("after", after_keys),
            "status": np.array([link["status"] for link in links], object)}


def _insert(db: sqlite3.Connection, table: str, columns: dict) -> None:
    """INSERT the rows of ``columns`` (arrays or lists of one length) into ``table``; NaN is stored as NULL (SQLite's rule)."""
    values = [column.tolist() if isinstance(column, np.ndarray) else column for column in columns.values()]  # Python scalars
    names = ", ".join(f'"{name}"' for name in columns)
    db.executemany(f'INSERT INTO "{table}" ({names}) VALUES ({", ".join("?" * len(columns))})', zip(*values))


def _measure(value) -> float:
    """A measurement to compare, NaN when missing (never equal, so a missing one counts as differing)."""
    number = cell_number(value)
    return math.nan if number is None else number
