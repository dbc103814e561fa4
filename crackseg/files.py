"""Files written whole or not at all: a temp file beside the target, then an atomic rename.

An interruption at any moment leaves the old file or the new one, never a torn one.
``durable=True`` also fsyncs the file and its folder, so the new file survives a power
loss (checkpoints); outputs written by the thousand skip that cost.
"""

from __future__ import annotations

import csv
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from crackseg.errors import InputError


def write_atomic(path: Path, content: bytes | str | Callable[[BinaryIO], None], durable: bool = False) -> None:
    """Write ``content`` (bytes, text, or a function writing to a binary file) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(handle, 0o666 & ~_umask())  # mkstemp makes 0600; keep the usual permissions
        with os.fdopen(handle, "wb") as file:
            if callable(content):
                content(file)
            else:
                file.write(content.encode() if isinstance(content, str) else content)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    if durable:
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def ensure_writable_folder(path: Path, flag: str) -> Path:
    """Create ``path`` if needed and check that files can be written in it, before any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise InputError(f"{flag} {path}: cannot write there ({error.strerror or error})") from None
    return path


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    """A CSV with a header; columns are ``columns`` then every other key in order of appearance."""
    columns = list(columns or [])
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns or ["path"], restval="")
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def remove_orphan_temps(folder: Path) -> int:
    """Delete temp files that an interrupted write left in ``folder`` (not below it); returns how many.

    Call it only while no other writer uses the folder.
    """
    removed = 0
    for temp in [*Path(folder).glob(".*.tmp"), *Path(folder).glob(".*.tmp.*")]:  # .tmp.gpkg: GDAL picks drivers by suffix
        temp.unlink(missing_ok=True)
        removed += 1
    return removed


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
