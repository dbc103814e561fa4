"""The register's file: one compare writing it at a time, writable in place, changed in one SQLite write transaction.

:mod:`crackseg.monitoring.history` says what the register holds and appends to it; here is how its file is opened and
kept whole while that happens: the lock file beside it (``.<name>.lock``, :class:`crackseg.core.locks.FileLock`,
taken over from a compare killed on this host), the checks that it and its folder can be written (SQLite writes its
journal beside it), the BEGIN IMMEDIATE ... COMMIT transaction that other SQLite clients (QGIS) respect, SQLite's
errors told as the user's (busy, unwritable, not a register), and the GeoPackage's own tables kept as GDAL keeps them
(gpkg_contents, gpkg_ogr_contents) when rows or tables are added by SQL.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator
from contextlib import closing, contextmanager
from glob import escape
from pathlib import Path

import numpy as np

from crackseg.core.errors import InputError
from crackseg.core.files import TEMP_MARK, temp_path
from crackseg.core.locks import FileLock
from crackseg.cracks.vectors import define_gpkg_functions

BUSY_TIMEOUT_S = 5.0  # how long another program's write transaction is waited for before the register is reported busy
APPENDING = "another crackseg compare is appending to it"


_HELD: set[Path] = set()  # the registers whose lock this process holds


@contextmanager
def locked(register: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``register`` while appending (taking over one that a dead process left), and remove
    the temporary registers a killed compare left (a new one being built, an older crackseg's working copy). Held
    already by this process (a compare holds it from its checks to its append), it is kept, not taken again."""
    held = Path(os.path.realpath(register))
    if held in _HELD:
        yield
        return
    register.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(register, APPENDING)
    lock.acquire()
    _HELD.add(held)
    try:
        prefix = temp_path(register, "", ".gpkg").name[:-len(f"{TEMP_MARK}.gpkg")]  # ".<name, cut as temp_path cuts it>."
        for leftover in register.parent.glob(f"{escape(prefix)}*{TEMP_MARK}.gpkg*"):
            leftover.unlink(missing_ok=True)
        yield
    finally:
        _HELD.discard(held)
        lock.release()


def check_writable(register: Path) -> None:
    """The register is extended in place and SQLite writes its journal (or WAL) beside it: both must be writable."""
    if register.exists() and not register.is_file():
        raise InputError(f"--register {register}: is not a file; give a GeoPackage file")
    folder = next(parent for parent in register.parents if parent.exists())
    try:
        with tempfile.TemporaryFile(dir=folder):  # a read-only mount, or a folder without write permission
            pass
    except OSError as error:
        raise InputError(f"{register}: its folder {folder} cannot be written ({error.strerror or error}), and SQLite writes its "
                         "journal beside the register; give a register in a writable folder") from None
    mode = stat.S_IMODE(register.stat().st_mode) if register.exists() else None
    if mode is not None and (not mode & 0o222 or not os.access(register, os.W_OK)):  # no write bit: read-only even for root
        who = "" if not mode & 0o222 else ", not writable by this user"
        raise InputError(f"{register}: is read-only (mode {mode:04o}{who}); the register is extended in place: make it writable "
                         "(chmod u+w) or give another --register")


@contextmanager
def transaction(path: Path, register: Path, write: bool = True) -> Iterator[sqlite3.Connection]:
    """A write transaction on the GeoPackage ``path`` (BEGIN IMMEDIATE, then COMMIT, or ROLLBACK on an error or
    when not ``write``); SQLite's errors name ``register``, "database is locked" as busy."""
    try:
        db = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=rw", uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as error:
        raise register_error(register, error) from None
    with closing(db):
        define_gpkg_functions(db)
        try:
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT" if write else "ROLLBACK")
        except BaseException as error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(error, sqlite3.Error):
                raise register_error(register, error) from None
            raise


def register_error(register: Path, error: sqlite3.Error) -> Exception:
    """SQLite's error as the user's: busy (another program writes), unwritable, or not a register; a full disk is the machine's."""
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF  # the primary result code
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return InputError(f"{register}: busy: another program is writing to it (SQLite: {error}, after {BUSY_TIMEOUT_S:g} s); "
                          "wait until it has saved its edits (QGIS: save or discard the layer's edits) and run again")
    if code in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM):
        return InputError(f"{register}: cannot be written ({error}); give a register in a writable file and folder")
    if code in (sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR):
        return OSError(f"{register}: {error}")
    return InputError(f"{register}: not a crack register ({error}); give a register written by crackseg compare, or a new file name")


def add_attribute_table(db: sqlite3.Connection, table: str, columns: dict[str, str]) -> None:
    """The attribute table ``table`` ({name: SQL type}), as GDAL makes one, in a register written before it."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
        return
    declared = ", ".join(f'"{name}" {kind}' for name, kind in columns.items())
    db.execute(f'CREATE TABLE "{table}" ("fid" INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL, {declared})')
    db.execute("INSERT INTO gpkg_contents (table_name, data_type, identifier, last_change) "
               "VALUES (?, 'attributes', ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))", (table, table))
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'gpkg_ogr_contents'").fetchone():
        db.execute("INSERT INTO gpkg_ogr_contents (table_name, feature_count) VALUES (?, 0)", (table,))


def update_contents(db: sqlite3.Connection, tables: tuple[str, ...], boxes: list[tuple[float, float, float, float]]) -> None:
    """gpkg_contents' change time and the cracks' extent, gpkg_ogr_contents' feature counts, as GDAL keeps them."""
    db.execute("UPDATE gpkg_contents SET last_change = strftime('%Y-%m-%dT%H:%M:%fZ', 'now') "
               f"WHERE lower(table_name) IN {tables}")
    if boxes:
        box = np.array(boxes)
        db.execute("UPDATE gpkg_contents SET min_x = min(coalesce(min_x, :x0), :x0), max_x = max(coalesce(max_x, :x1), :x1), "
                   "min_y = min(coalesce(min_y, :y0), :y0), max_y = max(coalesce(max_y, :y1), :y1) WHERE lower(table_name) = 'cracks'",
                   dict(zip(("x0", "x1", "y0", "y1"), (box[:, 0].min(), box[:, 1].max(), box[:, 2].min(), box[:, 3].max()))))
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'gpkg_ogr_contents'").fetchone():
        for table in tables:  # the file's triggers count too, unless a GDAL session has them off: counted, not incremented
            db.execute(f'UPDATE gpkg_ogr_contents SET feature_count = (SELECT count(*) FROM "{table}") '
                       "WHERE lower(table_name) = ?", (table,))
