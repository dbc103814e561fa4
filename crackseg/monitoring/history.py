"""The crack register: one GeoPackage per site that accumulates its inspections, so that a crack can be
followed from visit to visit in QGIS or with plain SQL (:data:`WIDTH_HISTORY`).

Tables (GIS tools list all three; ``surveys`` and ``links`` are attribute tables):

- ``surveys``: ``survey`` (1, 2, ... in date order), ``date`` (YYYY-MM-DD), ``source`` (the inspection folder).
- ``cracks``: MultiLineString features, one per crack per survey: ``crack_key`` (unique in the register, the
  key links use), ``survey``, ``image`` (its name within the inspection), ``crack`` (its id in that survey's
  cracks.csv), ``length_px``, ``mean_width_px``, ``max_width_px``, the same in mm (NULL when the pixel size is
  unknown) and ``max_width_class`` (NULL without width classes). Geometries are in the register's one CRS for
  georeferenced rasters, else in pixels of the survey's own image (x right, y down; no CRS).
- ``links``: ``before_key`` -> ``after_key``, a crack and its successor in the next survey, with ``status``
  (the change between them as changes.csv gives it: unchanged, longer, wider, merged, ...). A crack without a
  successor is gone (or outside the view both dates share); one without a predecessor is new.

A comparison appends its AFTER survey, and its BEFORE survey unless the previous comparison registered it as
its AFTER (then BEFORE's registered cracks are linked). Visits are appended in date order. Each append is
written to a copy beside the register that replaces it only when complete and on disk (fsynced): an error, an
interruption or a power loss leaves the register byte for byte as it was. A lock file beside the register
(``.<name>.lock``, :class:`crackseg.core.locks.FileLock`) keeps a second compare from appending at the same time,
which would lose one of the two; one left by a compare that was killed on this host is taken over.

Needs the geo extra: ``pip install 'crackseg[geo]'``.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import date as calendar_date
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError, require
from crackseg.core.files import PendingFile, cell_number, readable
from crackseg.core.locks import FileLock
from crackseg.cracks.vectors import write_layer

_MEASURES = ("length_px", "mean_width_px", "max_width_px", "length_mm", "mean_width_mm", "max_width_mm")
_SQLITE_SIDE_FILES = ("-journal", "-wal", "-shm")

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
class Survey:
    """One visit of the site: its date (YYYY-MM-DD) and the inspection folder its cracks were measured from."""

    date: str
    source: str


@dataclass(frozen=True)
class _Registered:
    survey: int
    date: str
    source: str


def append_comparison(register: Path, before: Survey, after: Survey, cracks: tuple[list[dict], list[dict]],
                      links: list[dict], crs: str | None) -> dict:
    """Append one comparison to ``register`` (created when missing); returns the surveys, cracks and links added.

    ``cracks`` holds BEFORE's and AFTER's crack dicts: image, crack, length_px, mean_width_px, max_width_px,
    optionally length_mm, mean_width_mm, max_width_mm, max_width_class (None or "" when unknown), and geometry
    (a shapely line in ``crs``, or in pixels of the survey's image when ``crs`` is None). A link dict names
    before_image, before_crack, after_image, after_crack and status.
    """
    register = Path(register)
    _check_dates(before, after)
    with _locked(register):
        pending = PendingFile(register, suffix=".gpkg")
        try:
            if register.exists():
                shutil.copyfile(register, pending.temp)
            else:
                pending.temp.unlink()  # GDAL creates the file itself
            added = _append(pending.temp, register, (before, after), cracks, links, crs)
            with open(pending.temp, "rb") as file:
                os.fsync(file.fileno())  # the copy's bytes on disk before the rename makes it the register
            pending.commit(durable=True)
        except BaseException:
            for side in ("", *_SQLITE_SIDE_FILES):
                Path(f"{pending.temp}{side}").unlink(missing_ok=True)
            raise
    return added


def check_append(register: Path, before: Survey, after: Survey) -> None:
    """Refuse now, before a comparison's work, what :func:`append_comparison` would refuse from the surveys alone:
    dates that are not YYYY-MM-DD or not in order, a file that is not a register, AFTER registered already, BEFORE
    older than the register's latest survey. (The CRS and the cracks are known only once the pairs are compared.)"""
    register = Path(register)
    _check_dates(before, after)
    if register.exists():
        _registered_before(register, _registered_surveys(register, register), before, after)


def width_history(register: Path, date: str, image: str, crack: int) -> list[dict]:
    """The rows of :data:`WIDTH_HISTORY` for crack ``crack`` of ``image`` in the survey of ``date``, oldest first."""
    if not Path(register).is_file():
        raise InputError(f"{register}: no such register")
    try:
        with closing(sqlite3.connect(f"{Path(register).resolve().as_uri()}?mode=ro", uri=True)) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute(WIDTH_HISTORY, {"date": date, "image": image, "crack": crack})]
    except sqlite3.DatabaseError as error:
        raise InputError(f"{register}: not a crack register ({error})") from None


@contextmanager
def _locked(register: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``register`` while appending (taking over one that a dead process left)."""
    register.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(register, "another crackseg compare is appending to it")
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _check_dates(before: Survey, after: Survey) -> None:
    _check_date(before.date, "--before-date")
    _check_date(after.date, "--after-date")
    if after.date <= before.date:
        raise InputError(f"--after-date {after.date}: not later than --before-date {before.date}")


def _check_date(text: str, flag: str) -> None:
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            calendar_date.fromisoformat(text)
            return
    except ValueError:
        pass
    raise InputError(f"{flag} {text}: not a date; give it as YYYY-MM-DD (e.g. 2024-05-31)")


def _append(path: Path, register: Path, surveys: tuple[Survey, Survey], cracks: tuple[list[dict], list[dict]],
            links: list[dict], crs: str | None) -> dict:
    """Append to ``path``, the working copy of ``register`` (missing for a new register); errors name ``register``."""
    before, after = surveys
    existing = path.exists()
    registered = _registered_surveys(path, register) if existing else []
    reused = _registered_before(register, registered, before, after)
    if existing:
        _check_crs(register, require("pyogrio", "geo", "--register").read_info(path, layer="cracks")["crs"], crs)
    next_survey = max((survey.survey for survey in registered), default=0) + 1
    next_key = _read(path, register, "SELECT coalesce(max(crack_key), 0) FROM cracks")[0][0] + 1 if existing else 1

    new_surveys, new_cracks = [], []
    if reused is None:
        before_keys = _numbered(cracks[0], next_key)
        new_surveys.append((next_survey, before))
        new_cracks.append((next_survey, cracks[0], next_key))
        next_survey, next_key = next_survey + 1, next_key + len(cracks[0])
    else:
        before_keys, unseen = _registered_keys(path, register, reused, cracks[0])
        before_keys |= _numbered(unseen, next_key)  # images of that survey that no earlier comparison registered
        new_cracks.append((reused, unseen, next_key))
        next_key += len(unseen)
    after_keys = _numbered(cracks[1], next_key)
    new_surveys.append((next_survey, after))
    new_cracks.append((next_survey, cracks[1], next_key))

    write_layer(path, "surveys", _survey_columns(new_surveys), append=existing, named=register)
    write_layer(path, "cracks", _crack_columns(new_cracks), _geometries(new_cracks), crs, append=existing, named=register)
    write_layer(path, "links", _link_columns(links, before_keys, after_keys), append=existing, named=register)
    return {"surveys": len(new_surveys), "cracks": sum(len(rows) for _, rows, _ in new_cracks), "links": len(links)}


def _registered_surveys(path: Path, register: Path) -> list[_Registered]:
    return [_Registered(*row) for row in _read(path, register, "SELECT survey, date, source FROM surveys")]


def _registered_before(register: Path, registered: list[_Registered], before: Survey, after: Survey) -> int | None:
    """The survey id of BEFORE when the register has it as its latest survey, None when BEFORE is a new, later one."""
    if any((survey.date, survey.source) == (after.date, after.source) for survey in registered):
        raise InputError(f"{register}: the survey of {after.date} from {after.source} is already registered; nothing appended")
    if not registered:
        return None
    latest = max(registered, key=lambda survey: survey.date)
    if (before.date, before.source) == (latest.date, latest.source):
        return latest.survey
    if before.date > latest.date:
        return None
    raise InputError(f"{register}: its latest survey is {latest.date} from {latest.source}; visits are appended in date order, "
                     f"so compare from that survey or a later one, not from {before.date} ({before.source})")


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


def _registered_keys(path: Path, register: Path, survey: int, cracks: list[dict]) -> tuple[dict[tuple[str, int], int], list[dict]]:
    """{(image, crack): crack_key} of a registered survey's images, once their cracks are found to be those of ``cracks``,
    and the crack dicts of images the survey does not hold yet (an image no earlier comparison registered)."""
    rows = _read(path, register, "SELECT image, crack, crack_key, length_px, max_width_px FROM cracks WHERE survey = ?", (survey,))
    found = {(image, crack): (_measure(length), _measure(width)) for image, crack, _, length, width in rows}
    images = {image for image, _ in found}
    given = {(readable(row["image"]), int(row["crack"])): (_measure(row["length_px"]), _measure(row["max_width_px"]))
             for row in cracks if readable(row["image"]) in images}
    compared = {image for image, _ in given}  # registered images this comparison holds too
    here = {key: value for key, value in found.items() if key[0] in compared}
    differing = sorted(set(here) ^ set(given)) or sorted(key for key in given if not all(
        math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) for a, b in zip(here[key], given[key])))
    if differing:
        image, crack = differing[0]
        raise InputError(f"{register}: crack {crack} of {image} differs from the one registered for that survey "
                         "(it was probably measured with other settings or another model); compare with the settings used then")
    unseen = [row for row in cracks if readable(row["image"]) not in images]
    return {(image, crack): key for image, crack, key, _, _ in rows}, unseen


def _numbered(cracks: list[dict], first_key: int) -> dict[tuple[str, int], int]:
    return {(readable(row["image"]), int(row["crack"])): first_key + index for index, row in enumerate(cracks)}


def _survey_columns(surveys: list[tuple[int, Survey]]) -> dict[str, np.ndarray]:
    return {"survey": np.array([number for number, _ in surveys], np.int64),
            "date": np.array([survey.date for _, survey in surveys], object),
            "source": np.array([readable(str(survey.source)) for _, survey in surveys], object)}


def _crack_columns(batches: list[tuple[int, list[dict], int]]) -> dict[str, np.ndarray]:
    """Columns of the crack features of ``batches``: (survey id, crack dicts, key of the first)."""
    rows = [(survey, key + index, row) for survey, cracks, key in batches for index, row in enumerate(cracks)]
    return {"crack_key": np.array([key for _, key, _ in rows], np.int64), "survey": np.array([survey for survey, _, _ in rows], np.int64),
            "image": np.array([readable(row["image"]) for _, _, row in rows], object),
            "crack": np.array([int(row["crack"]) for _, _, row in rows], np.int64),
            **{name: np.array([cell_number(row.get(name)) for _, _, row in rows], np.float64) for name in _MEASURES},  # None: NaN, stored as NULL
            "max_width_class": np.array([row.get("max_width_class") or None for _, _, row in rows], object)}


def _geometries(batches: list[tuple[int, list[dict], int]]) -> np.ndarray:
    shapely = require("shapely", "geo", "--register")
    empty = shapely.from_wkt("MULTILINESTRING EMPTY")
    lines = [empty if row.get("geometry") is None else shapely.force_2d(row["geometry"]) for _, cracks, _ in batches for row in cracks]
    return np.asarray(shapely.to_wkb(lines), dtype=object) if lines else np.array([], dtype=object)


def _link_columns(links: list[dict], before_keys: dict, after_keys: dict) -> dict[str, np.ndarray]:
    return {"before_key": np.array([before_keys[readable(link["before_image"]), int(link["before_crack"])] for link in links], np.int64),
            "after_key": np.array([after_keys[readable(link["after_image"]), int(link["after_crack"])] for link in links], np.int64),
            "status": np.array([link["status"] for link in links], object)}


def _measure(value) -> float:
    """A measurement to compare, NaN when missing (never equal, so a missing one counts as differing)."""
    number = cell_number(value)
    return math.nan if number is None else number


def _read(path: Path, register: Path, sql: str, parameters: tuple = ()) -> list[tuple]:
    """Rows of ``sql`` on ``path`` (the register or its working copy), opened read-only; errors name ``register``."""
    try:
        with closing(sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)) as db:
            return db.execute(sql, parameters).fetchall()
    except sqlite3.DatabaseError as error:
        raise InputError(f"{register}: not a crack register ({error}); give a register written by crackseg compare, "
                         "or a new file name") from None
