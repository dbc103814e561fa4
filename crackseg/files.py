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


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current
