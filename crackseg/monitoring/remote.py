"""``crackseg compare`` with inspections or ``--out`` in object storage (``s3://bucket/prefix/``): staged locally.

compare reads and writes local folders only, so an inspection in the store is downloaded first, each object below its
prefix to its key below a temporary folder (a predict run's lock object left out), and ``--out`` in the store is written
in a temporary folder by :class:`~crackseg.monitoring.comparison_folder.ComparisonFolder`, each of its files uploaded
whole at the end. The temporary folder is removed at the end, also on an error. What compare writes names the inputs
by their URLs, never by the staged copies (:meth:`Staging.shown`). The rules of a local ``--out`` hold on the store,
checked before any work: an earlier compare's outputs are replaced only with ``--overwrite`` (they are downloaded, so
that the comparison folder decides as for a local folder, and those it removes are removed from the store), and one
compare at a time holds ``PREFIX/.crackseg-compare.lock``, an object created only if absent (``If-None-Match: *``).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath
from urllib.parse import urlsplit

from crackseg.core.errors import InputError
from crackseg.core.files import read_csv, write_atomic, write_csv
from crackseg.core.locks import StoreLock
from crackseg.core.storage import RemoteFile, StorageError, delete_file, display_url, is_url, list_keys, upload_file
from crackseg.monitoring.comparison_folder import writes_at



class Staging:
    """The local folders one compare works on: an input or ``--out`` given as a URL is replaced by a staged copy.

    A context manager: entering it checks and locks a store ``--out`` and downloads the store inputs (so a missing
    prefix or a refused request stops the run before any work); :meth:`upload` sends the outputs up; leaving it removes
    the lock object and the temporary folder.
    """

    def __init__(self, before: str, after: str, out: str, overwrite: bool):
        self.given = {"BEFORE": str(before), "AFTER": str(after), "--out": str(out)}
        self.overwrite = overwrite
        self.before, self.after, self.out = Path(before), Path(after), Path(out)
        self._temp: Path | None = None
        self._roots: list[tuple[str, str]] = []  # (staged folder, the URL it stands for, as shown)
        self._lock: StoreLock | None = None
        self._earlier: dict[str, tuple] = {}  # key of an earlier output downloaded into the staged --out -> its inode, mtime

    def __enter__(self) -> Staging:
        if not any(is_url(value) for value in self.given.values()):
            return self
        self._temp = Path(tempfile.mkdtemp(prefix="crackseg-compare-")).resolve()
        try:
            if is_url(self.given["--out"]):
                self.out = self._stage_out(self.given["--out"])
            for flag in ("BEFORE", "AFTER"):
                if is_url(self.given[flag]):
                    setattr(self, flag.lower(), self._stage_inspection(self.given[flag], flag))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def shown(self, text: str) -> str:
        """``text`` (a path, a message) with every staged folder named by its URL."""
        for root, url in sorted(self._roots, key=lambda pair: -len(pair[0])):  # a photo's folder before its inspection's
            text = text.replace(f"{root}/", f"{url}/").replace(root, url)
        return text

    def upload(self) -> None:
        """After the run: upload what compare wrote in a store ``--out`` (every file new or changed, each whole), and remove
        from the store the earlier outputs compare removed (--overwrite)."""
        if self._lock is None:
            return
        url = self._lock.prefix
        for path in sorted(path for path in self.out.rglob("*") if path.is_file()):
            key = path.relative_to(self.out).as_posix()
            if _hidden(key) or key == "lock" or self._earlier.get(key) == _identity(path):
                continue  # a lock or temp file, or an earlier file compare kept (a register's GeoPackage)
            upload_file(path, f"{url}/{key}")
        for key in self._earlier:
            if not (self.out / key).exists():
                delete_file(f"{url}/{key}")

    def _stage_out(self, url: str) -> Path:
        _require_s3(url, "--out", "compare writes to a local folder or an s3:// prefix")
        folder = self._temp / "out"
        folder.mkdir()
        self._roots.append((str(folder), display_url(url).rstrip("/")))
        self._lock = StoreLock(url, "compare", "write --out to a local folder and copy it up")
        existing = list_keys(f"{self._lock.prefix}/")  # a missing bucket or a refused request stops here
        self._lock.acquire(set(existing))
        for key in (key for key in existing if writes_at(key)):
            write_atomic(folder / key, RemoteFile(f"{self._lock.prefix}/{key}").read_bytes())
            self._earlier[key] = _identity(folder / key)
        return folder

    def _stage_inspection(self, url: str, flag: str) -> Path:
        """Every object below the prefix ``url``, downloaded to its key below a folder of its own."""
        _require_s3(url, flag, "an inspection in storage is an s3:// prefix (a predict output folder or a dataset)")
        folder = self._temp / flag.lower()
        folder.mkdir()
        prefix, shown = url.rstrip("/"), display_url(url).rstrip("/")
        self._roots.append((str(folder), shown))
        keys = [key for key in list_keys(f"{prefix}/") if not _lock_object(key)]
        if not keys:
            raise InputError(f"{flag} {shown}/: no objects below this prefix; give the prefix of an inspection folder")
        for key in keys:
            if any(part in ("", ".", "..") for part in key.split("/")):
                raise StorageError(f"{prefix}/{key}", "a key with an empty, '.' or '..' part cannot be staged; copy it to a plain key")
            write_atomic(folder / key, RemoteFile(f"{prefix}/{key}").read_bytes())
        if (folder / "predictions.csv").is_file():
            self._stage_photos(folder / "predictions.csv", self._temp / f"photos-{flag.lower()}")
        return folder

    def _stage_photos(self, table: Path, folder: Path) -> None:
        """The photos a predictions folder names by URL (predict read them from the store), downloaded, and the staged
        predictions.csv pointed at them. A GeoTIFF is not: compare places a raster by its mask and never reads its pixels
        (it would be downloaded whole), so it keeps its URL, which names it in the outputs."""
        rows = read_csv(table)
        for number, row in enumerate(rows):
            url = row.get("path") or ""
            if not is_url(url):
                continue
            remote = RemoteFile(url)
            if remote.suffix.lower() in (".tif", ".tiff"):
                self._roots.append((str(Path(url)), display_url(url)))  # as compare's Path makes it: s3:/bucket/key
                continue
            photo = folder / str(number) / remote.name
            write_atomic(photo, remote.read_bytes())
            self._roots.append((str(photo), display_url(url)))
            row["path"] = str(photo)
        write_csv(table, rows)


def refuse_out_in_inspection_urls(out: str, before: str, after: str) -> None:
    """A store --out below an inspection's prefix would mix with its objects, as a local --out inside an inspection."""
    target = out.rstrip("/") + "/"
    for flag, inspection in (("BEFORE", before), ("AFTER", after)):
        if is_url(inspection) and target.startswith(inspection.rstrip("/") + "/"):
            raise InputError(f"--out {display_url(out)}: lies in the {flag} inspection {display_url(inspection)}, whose "
                             "summary.json and report.html it would replace; choose a prefix outside both inspections")


def _require_s3(url: str, flag: str, why: str) -> None:
    if urlsplit(url).scheme.lower() != "s3":
        raise InputError(f"{flag} {display_url(url)}: {why}; {urlsplit(url).scheme}:// is not supported here")


def _identity(path: Path) -> tuple[int, int]:
    """Changes when compare writes the file again (a new file renamed into place)."""
    facts = path.stat()
    return facts.st_ino, facts.st_mtime_ns


def _lock_object(key: str) -> bool:
    """A predict's or compare's lock object, left out of a staged inspection."""
    name = PurePosixPath(key).name
    return name.startswith(".crackseg-") and name.endswith(".lock")


def _hidden(key: str) -> bool:
    return any(part.startswith(".") for part in key.split("/"))
