"""The register's file: one compare writing it at a time, writable in place, changed in one SQLite write transaction.

:mod:`crackseg.monitoring.history` says what the register holds and appends to it; here is how its file is opened and
kept whole while that happens: the lock file beside it (``.<name>.lock``, :class:`crackseg.core.locks.FileLock`,
taken over from a compare killed on this host), the checks that it and its folder can be written (SQLite writes its
journal beside it), the BEGIN IMMEDIATE ... COMMIT transaction that other SQLite clients (QGIS) respect, and SQLite's
errors told as the user's (busy, unwritable, not a register).
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

from crackseg.core.errors import InputError
from crackseg.core.files import TEMP_MARK, temp_path
from crackseg.core.locks import FileLock
from crackseg.cracks.vectors import define_gpkg_functions

BUSY_TIMEOUT_S = 5.0  # how long another program's write transaction is waited for before the register is reported busy
APPENDING = "another crackseg compare is appending to it"


@contextmanager
def locked(register: Path) -> Iterator[None]:
    """Hold ``.<name>.lock`` beside ``register`` while appending (taking over one that a dead process left), and remove
    the temporary registers a killed compare left (a new one being built, an older crackseg's working copy)."""
    register.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(register, APPENDING)
    lock.acquire()
    try:
        prefix = temp_path(register, "", ".gpkg").name[:-len(f"{TEMP_MARK}.gpkg")]  # ".<name, cut as temp_path cuts it>."
        for leftover in register.parent.glob(f"{escape(prefix)}*{TEMP_MARK}.gpkg*"):
            leftover.unlink(missing_ok=True)
        yield
    finally:
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
