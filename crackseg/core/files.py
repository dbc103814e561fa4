"""Files written whole or not at all: a temp file beside the target, then an atomic rename.

An interruption at any moment leaves the old file or the new one, never a torn one.
``durable=True`` also fsyncs the file and its folder, so the new file survives a power
loss (checkpoints); outputs written by the thousand skip that cost. Every temp file is
named by :func:`temp_path`, hidden and marked as crackseg's, so :func:`remove_orphan_temps`
removes what an interrupted run left and never a file of the user's.
"""

from __future__ import annotations

import csv
import io
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from crackseg.core.errors import InputError

# How readable() writes a byte of a file name that is not UTF-8, and how write_csv() writes a backslash that would read so
_ESCAPED_BYTE, _ESCAPE_LIKE = re.compile(r"\\x([89a-f][0-9a-f]|5c)"), re.compile(r"\\(?=x(?:[89a-f][0-9a-f]|5c))")
_NAMES_ARE_BYTES = os.name != "nt"  # POSIX file names are bytes; Windows ones are text
TEMP_MARK = ".crackseg-tmp"  # ends the name of every temp file crackseg writes (before a format's suffix)
NAME_MAX = 255  # bytes in a file name on common file systems
SIDE_FILE_ROOM = 16  # writers add files beside a temp (SQLite's "-journal" beside a GeoPackage)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet runs a cell starting with these (OWASP)


def temp_path(path: Path, tag: str, suffix: str = "") -> Path:
    """``.<name>.<tag>.crackseg-tmp<suffix>`` beside ``path``: the name is cut to keep the whole, and the side
    files that writers add to it, within NAME_MAX bytes."""
    path = Path(path)
    room = NAME_MAX - SIDE_FILE_ROOM - len(os.fsencode(f"..{tag}{TEMP_MARK}{suffix}"))
    name = os.fsencode(path.name)[:room].decode("utf-8", "replace")  # a name libraries can encode; the rename restores the real one
    return path.with_name(f".{name}.{tag}{TEMP_MARK}{suffix}")


class PendingFile:
    """A file written under a hidden temporary name beside ``path``, moved into place by :meth:`commit`.

    For writers that need a path rather than a file object (GDAL, OpenVINO); ``suffix`` ends
    the temp name for those that pick a format by it. As a context manager it commits when
    the block ends without an error and removes the temp file otherwise.
    """

    def __init__(self, path: Path, suffix: str = ""):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a file where a folder of the path should be: the user's mistake
            raise InputError(f"{self.path}: {_file_in_the_way(self.path)} is a file, not a folder") from None
        while True:
            self.temp = temp_path(self.path, secrets.token_hex(4), suffix)
            try:
                os.close(os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask applies, as to any file
                break
            except FileExistsError:
                continue
            except BaseException:  # Ctrl-C while making it: no caller holds its name to remove it
                self.temp.unlink(missing_ok=True)
                raise

    def companion(self, suffix: str) -> PendingFile:
        """The pending file of ``path`` with ``suffix`` whose temp is this temp with that suffix (OpenVINO's .bin beside its .xml)."""
        other = object.__new__(PendingFile)
        other.path, other.temp = self.path.with_suffix(suffix), self.temp.with_suffix(suffix)
        return other

    def write(self, content: bytes) -> None:
        """``content`` into the temp file; a failure (a full disk, which names no file) names ``path``."""
        try:
            self.temp.write_bytes(content)
        except OSError as error:
            raise OSError(error.errno, error.strerror, str(self.path)) from None

    def commit(self, durable: bool = False) -> Path:
        try:
            os.replace(self.temp, self.path)
        except BaseException:  # a name too long, a folder in the way: the temp file would be left behind
            self.abort()
            raise
        if durable:
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        return self.path

    def abort(self) -> None:
        self.temp.unlink(missing_ok=True)

    def __enter__(self) -> PendingFile:
        return self

    def __exit__(self, kind, *exc) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write_atomic(path: Path, content: bytes | str | Callable[[BinaryIO], None], durable: bool = False) -> None:
    """Write ``content`` (bytes, UTF-8 text as :func:`readable` makes it, or a function writing to a binary file) to ``path``."""
    pending = PendingFile(path)
    try:
        with open(pending.temp, "wb") as file:
            if callable(content):
                content(file)
            else:
                file.write(readable(content).encode() if isinstance(content, str) else content)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        pending.commit(durable)
    except BaseException as error:
        pending.abort()
        if isinstance(error, OSError) and error.filename is None:  # a full disk says so at write(), naming no file
            error.filename = str(path)
        raise


def link_atomic(source: Path, target: Path) -> None:
    """Make ``target`` hold ``source``'s bytes without rewriting them (a hard link), atomically."""
    temp = temp_path(Path(target), str(os.getpid()))
    temp.unlink(missing_ok=True)
    try:
        os.link(source, temp)
    except OSError:  # file systems without hard links
        shutil.copyfile(source, temp)
    os.replace(temp, target)
    temp.unlink(missing_ok=True)  # when target already was a link to source, POSIX rename leaves both names


def _file_in_the_way(path: Path) -> Path:
    """The first of ``path``'s folders that is not a folder."""
    return next((parent for parent in reversed(path.parents) if parent.exists() and not parent.is_dir()), path.parent)


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


def decoded_text(data: bytes) -> str:
    """A hand-written list file's text: UTF-8 with or without a byte order mark, or UTF-16 with one (what Windows
    editors save as "Unicode"); UnicodeDecodeError for anything else."""
    return data.decode("utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig")


def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None) -> None:
    """A UTF-8 CSV with a header; columns are ``columns`` then every other key in order of appearance.

    Text that a spreadsheet would run as a formula (a cell starting with = + - @, a tab or a
    carriage return, e.g. from a file name) is written behind a ``'``, so it shows as text (and so is text
    starting with ``'``, which a spreadsheet shows as it is);
    numbers stay numbers. Bytes of a file name that are not UTF-8 are written as ``\\xNN``, and :func:`read_csv` gives them
    back as they were (:func:`restored`).
    """
    columns = list(columns or [])
    for row in rows:
        columns += [key for key in row if key not in columns]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, columns or ["path"], restval="")
    writer.writeheader()
    writer.writerows({key: _as_text(value) for key, value in row.items()} for row in rows)
    write_atomic(path, readable(buffer.getvalue()))


def read_csv(path: Path, columns: tuple[str, ...] = ()) -> list[dict]:
    """The rows of a CSV that :func:`write_csv` wrote, as dicts of text (numbers included); a file that is not such a
    table (not UTF-8, empty, without ``columns``) is a one-line error naming it.

    Read as UTF-8 whatever the locale (a byte-order mark, as Excel's "CSV UTF-8" writes, is no part of the first column
    name); the ``'`` that write_csv put before a formula start or a ``'`` is taken off
    again, so every value comes back as it was given.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as file:  # a table saved again by Excel starts with a BOM
            reader = csv.DictReader(file)
            rows = [{key: restored(_unguarded(value)) for key, value in row.items()} for row in reader]
            header = reader.fieldnames or []
    except (UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"{path}: not a table crackseg wrote ({error})") from None
    missing = [name for name in columns if name not in header]
    if not header or missing:
        raise InputError(f"{path}: not a table crackseg wrote ({'empty' if not header else 'no ' + ', '.join(missing) + ' column'})")
    return rows


def cell_number(value) -> float | None:
    """A table cell as a number, None when empty: rows come as written (numbers) or read back from a CSV (text, "")."""
    return None if value is None or value == "" else float(value)


def readable(text: str) -> str:
    """``text`` as valid UTF-8: the bytes of a file name that are not UTF-8 become ``\\xNN``."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def restored(text: str) -> str:
    """A CSV cell as it was before :func:`write_csv`: each ``\\xNN`` of a byte 0x80-0xff back as that byte of a file
    name (as Python holds it), so that a name read from a table finds its file again, and ``\\x5c`` back as the
    backslash it stands for."""
    if not _NAMES_ARE_BYTES or not isinstance(text, str) or "\\x" not in text:  # a short row's missing cells are None
        return text
    return _ESCAPED_BYTE.sub(lambda match: "\\" if match[1] == "5c" else chr(0xDC00 + int(match[1], 16)), text)


def _as_text(value):
    """A cell as written: behind a ``'`` when it starts a formula, or starts with ``'`` itself (so reading it back
    takes off only the guard); a backslash that :func:`restored` would read as an escape written as ``\\x5c``."""
    if not isinstance(value, str):
        return value
    value = _ESCAPE_LIKE.sub(r"\\x5c", value) if _NAMES_ARE_BYTES else value
    return "'" + value if value.startswith((*FORMULA_STARTS, "'")) else value


def _unguarded(value):
    """A cell read back as :func:`_as_text` was given it: one leading ``'`` removed where a formula start or a ``'``
    follows it."""
    return value[1:] if isinstance(value, str) and value.startswith("'") and value[1:].startswith((*FORMULA_STARTS, "'")) else value


def remove_orphan_temps(folder: Path) -> int:
    """Delete the temp files that an interrupted crackseg write left in ``folder`` (not below it); returns how many.

    Only names made by :func:`temp_path` are touched. Call it only while no other crackseg writer uses the folder.
    """
    removed = 0
    for temp in Path(folder).glob(f".*{TEMP_MARK}*"):
        temp.unlink(missing_ok=True)
        removed += 1
    return removed
