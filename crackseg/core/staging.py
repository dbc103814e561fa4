"""The one output folder predictions, comparisons and evaluation reports are written through, wherever it lies.

A run writes local files into :attr:`StagedFolder.root` and never asks where its ``--out`` is. A local ``--out`` is the
root itself. An ``s3://bucket/prefix/`` is staged: the root is a temporary folder, each finished file goes up whole to
its key below the prefix, and the temporary folder is removed at the end, also on an error. The folder's rules hold in
both, checked before any work (:meth:`StagedFolder.prepare`): one run at a time (``FOLDER/lock``, or
``PREFIX/.crackseg-<command>.lock``, an object created only if absent), and the files a run would replace are known to
it (:meth:`StagedFolder.existed`; those it decides on are downloaded first), so it can refuse them unless asked.
What the run replaced or removed is removed from the store too (:meth:`StagedFolder.finish`). A store that stops
answering during the run ends it (:class:`StoreUnreachable`): every upload after that would fail the same way.
"""

from __future__ import annotations

import errno
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.files import ensure_writable_folder, write_atomic
from crackseg.core.locks import FolderLock, StoreLock
from crackseg.core.storage import RemoteFile, StorageError, answers, delete_file, list_keys, upload_file
from crackseg.core.urls import display_url, is_url


_NO_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full device, or the user's quota spent


class OutFailed(InputError):
    """The ``--out`` folder takes no more files: the run stops instead of failing every file that follows, and says
    which inputs lack their outputs (``--skip-existing`` finishes them)."""


class StoreUnreachable(StorageError, OutFailed):
    """An upload failed and the store no longer answers at all (a server that died, a network gone, credentials that
    expired)."""


_SCHEME_LIKE = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]+:/")  # two letters at least: C:/ stays a Windows drive


def location(text: str | Path) -> str | Path:
    """A folder or file as given: a URL stays text (pathlib would fold its slashes), anything else is a Path."""
    return str(text) if is_url(str(text)) else Path(text)


def output_location(text: str | Path, what: str) -> str | Path:
    """An ``--out`` that ``what`` (predictions, reports) can be written to: a local folder or an s3:// prefix."""
    target = location(text)
    if not isinstance(target, str) and _SCHEME_LIKE.match(str(text)):  # s3:/bucket, s3://: pathlib would make a local s3:/
        raise InputError(f"--out {text}: not a URL; write an s3://bucket/prefix/ URL, or a local folder without a scheme")
    if isinstance(target, str) and not target.startswith("s3://"):
        raise InputError(f"--out {display_url(target)}: {what} are written to a local folder or an s3://bucket/prefix/ URL "
                         "(http(s):// is read-only)")
    return target


class StagedFolder:
    """The ``--out`` of one run of ``command`` (predict, compare, evaluate): local, or an s3:// prefix staged locally.

    ``what`` names what is written there, for the error that refuses an http(s):// target. ``lock``: True keeps runs of
    ``command`` apart (one at a time per folder or prefix), False (``--no-lock``) writes to a store without the lock
    object (a local folder is locked still), None locks nothing (a command whose runs cannot clash: evaluate writes
    one report whole); ``without_lock`` tells a user whose store cannot lock what to do instead. Leaving it as a
    context manager releases it (:meth:`release`).
    """

    def __init__(self, target: str | Path, command: str, what: str, lock: bool | None = True, without_lock: str = ""):
        self.target = output_location(target, what)
        self.remote = isinstance(self.target, str)
        if self.remote:
            self.url = self.target.rstrip("/")
            self.root = Path(tempfile.mkdtemp(prefix=f"crackseg-{command}-")).resolve()
            self._lock = StoreLock(self.url, command, without_lock) if lock else None
        else:
            self.root = Path(self.target)
            self._lock = FolderLock(self.root, f"crackseg {command}", "--out") if lock is not None else None
        self.existing: set[str] = set()  # on a store: the keys below the prefix when the run began
        self._made = False  # a local folder this run created
        self._downloaded: dict[str, tuple[int, int]] = {}  # staged files as they were downloaded
        self._sent: dict[str, tuple[int, int] | None] = {}  # staged files as they were uploaded (None: the upload failed)
        self._lost: StoreUnreachable | None = None  # the store stopped answering
        self._removed: set[str] = set()  # keys of objects the run removed (remove), deleted at finish

    def __enter__(self) -> StagedFolder:
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.release()
        if isinstance(error, OSError):
            self.check_room(error)  # a full disk is one line naming the folder, whichever file met it

    def prepare(self, decides_on: Callable[[str], bool] = lambda key: False, existing: set[str] | None = None) -> set[str]:
        """Before any work: the folder checked (a store listed: a missing bucket or a refused request stops here), the lock
        taken, and on a store the files the run ``decides_on`` (by key) downloaded, so that it applies a local folder's
        rules to them. Returns the keys listed; ``existing``: such a listing made by another process of the run, taken as
        it is (no lock: that process holds it)."""
        if existing is not None:  # another process of the run checked the folder and holds its lock
            self.existing = existing
            return existing
        if not self.remote:
            self._made = not self.root.exists()
            ensure_writable_folder(self.root, "--out")
            if self._lock:
                self._lock.acquire()
            return set()
        self.existing = set(list_keys(f"{self.url}/"))
        if self._lock:
            self._lock.acquire(self.existing)
        try:
            for key in sorted(key for key in self.existing if decides_on(key)):
                self._download(key)
        except BaseException:
            self.release()
            raise
        return self.existing

    def existed(self, path: Path) -> bool:
        """Whether the file at ``path`` (below the root) was there when the run began."""
        return self._key(path) in self.existing if self.remote else Path(path).exists()

    def fetch(self, paths: Iterable[Path], read: int = 1) -> bool:
        """Whether every one of ``paths`` was there when the run began; on a store the first ``read`` are then downloaded,
        to be read as local files would be (predict --skip-existing summarises a mask it keeps, and its probabilities)."""
        paths = list(paths)
        if not all(self.existed(path) for path in paths):
            return False
        if self.remote:
            for path in paths[:read]:
                self._download(self._key(path))
        return True

    def upload(self, paths: Iterable[Path]) -> None:
        """Finished files sent up now, each whole (nothing to do for a local folder). A failed upload raises its
        :class:`StorageError`, or :class:`StoreUnreachable` when the store does not answer at all any more."""
        if not self.remote:
            return
        for path in paths:
            if self._lost is not None:
                raise self._lost
            self._sent[self._key(path)] = None  # a failed upload is the run's error to report, not sent again
            try:
                upload_file(path, self._url_of(path))
            except StorageError as error:
                if not answers(self.url):
                    self._lost = StoreUnreachable(error.url, f"the store stopped answering ({error.reason})")
                    raise self._lost from None
                raise
            self._sent[self._key(path)] = _identity(path)

    def remove(self, paths: Iterable[Path]) -> None:
        """Files below the root removed (missing ones skipped), and the folders they leave empty below the root; on a
        store, their objects are deleted by :meth:`finish`, once the files that replace them are up."""
        for path in paths:
            path = Path(path)
            key = self._key(path)
            if self.remote and (key in self.existing or self._sent.get(key) is not None):
                self._removed.add(key)
            try:
                path.unlink()
            except FileNotFoundError:
                continue  # most of a run's candidates: nothing to remove, no folder to look into
            for folder in path.parents:
                if folder == self.root or not folder.is_relative_to(self.root) or not folder.is_dir() or any(folder.iterdir()):
                    break
                folder.rmdir()

    def check_room(self, error: OSError) -> None:
        """Raise :class:`OutFailed` when ``error``, met writing a file below the root, says its device is full (or the
        user's quota spent): every later file would fail the same way."""
        if error.errno in _NO_ROOM:
            where = (f"{self.root}, the staging folder of {display_url(self.url)}/ (set TMPDIR to a folder with room)"
                     if self.remote else str(self.root))
            raise OutFailed(f"no space left in {where}") from None

    def stored(self, paths: Iterable[Path]) -> bool:
        """Whether every one of ``paths`` is in the folder: on a store, sent by this run, or there before it and not
        sent again."""
        if not self.remote:
            return all(Path(path).exists() for path in paths)
        keys = [self._key(path) for path in paths]
        return all(self._sent[key] is not None if key in self._sent else key in self.existing for key in keys)

    def hand_over(self, paths: Iterable[Path]) -> None:
        """Files for another process of the run, which may run on another machine: sent through the store (a local
        folder is shared by them already)."""
        self.upload(path for path in paths if path.exists())

    def take_over(self, paths: Iterable[Path]) -> None:
        """The files other processes handed over, fetched to the same paths and removed from the store; one never sent is
        skipped (whoever reads it fails, naming it)."""
        if not self.remote:
            return
        for path in paths:
            try:
                content = RemoteFile(self._url_of(path)).read_bytes()
            except StorageError:
                continue
            write_atomic(path, content)
            delete_file(self._url_of(path))

    def finish(self) -> None:
        """After the run: every file new or changed since it was downloaded or uploaded sent up (but one whose upload
        failed: the run reported it), then the objects of the files the run removed (those it downloaded, and those
        :meth:`remove` named) deleted from the store."""
        if not self.remote:
            return
        for path in sorted(path for path in self.root.rglob("*") if path.is_file()):
            key = self._key(path)
            failed = key in self._sent and self._sent[key] is None
            if not (_hidden(key) or failed) and self._sent.get(key, self._downloaded.get(key)) != _identity(path):
                self.upload([path])
        for key in sorted(set(self._downloaded) | self._removed):
            if not (self.root / key).exists():
                delete_file(f"{self.url}/{key}")

    def release(self) -> None:
        """The lock removed if this run took it; a staging folder removed, and so is a local folder the run created and
        left empty (it stopped before writing anything)."""
        if self._lock is not None:
            self._lock.release()
        if self.remote:
            shutil.rmtree(self.root, ignore_errors=True)
        elif self._made and self.root.is_dir() and not any(self.root.iterdir()):
            self.root.rmdir()

    def shown(self, path: Path | str | None = None) -> str:
        """A file below the root (default: the folder) as messages and tables name it: on a store, its object's URL
        without credentials."""
        path = self.root if path is None else Path(path)
        if not self.remote:
            return str(path)
        return f"{display_url(self.url)}/" if path == self.root else display_url(self._url_of(path))

    def shown_text(self, text: str) -> str:
        """``text`` (a message) with the staging folder named by the target."""
        if not self.remote:
            return text
        url = display_url(self.url)
        return text.replace(f"{self.root}/", f"{url}/").replace(str(self.root), url)

    def _download(self, key: str) -> None:
        write_atomic(self.root / key, RemoteFile(f"{self.url}/{key}").read_bytes())
        self._downloaded[key] = _identity(self.root / key)

    def _url_of(self, path: Path) -> str:
        return f"{self.url}/{self._key(path)}"

    def _key(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()


def _identity(path: Path) -> tuple[int, int]:
    """Changes when the file is written again (a new file renamed into place)."""
    facts = path.stat()
    return facts.st_ino, facts.st_mtime_ns


def _hidden(key: str) -> bool:
    """A temporary file, a lock: never an output."""
    return any(part.startswith(".") for part in key.split("/")) or key == "lock"


class StagedSources:
    """Folders and files a run reads, wherever they lie: a local one as it is, an s3:// one downloaded into a temporary
    folder (removed on leaving the context), every object below the prefix to its key. :meth:`shown` names a copy by
    its URL in what the run writes and says."""

    def __init__(self, command: str):
        self._command = command
        self._temp: Path | None = None
        self._copies: list[tuple[str, str]] = []  # (local copy, the URL it stands for, as shown)

    def __enter__(self) -> StagedSources:
        return self

    def __exit__(self, *exc) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def folder(self, text: str | Path, flag: str, what: str, copied: Callable[[Path], None] = lambda folder: None) -> Path:
        """``text`` as a local folder; an s3:// prefix (``what`` it holds, for the error of another scheme) downloaded,
        lock objects left out, and ``copied`` called with the copy."""
        source = location(text)
        if isinstance(source, Path):
            return source
        if not source.startswith("s3://"):
            raise InputError(f"{flag} {display_url(source)}: {what} in storage is an s3:// prefix; "
                             f"{source.split('://')[0]}:// is not supported here")
        prefix, shown = source.rstrip("/"), display_url(source).rstrip("/")
        folder = self._new_folder(flag.strip("-").lower())
        self._copies.append((str(folder), shown))
        keys = [key for key in list_keys(f"{prefix}/") if key and not key.endswith("/") and not _lock_object(key)]  # no folder markers
        if not keys:
            raise InputError(f"{flag} {shown}/: no objects below this prefix; give the prefix of {what}")
        folders = {"/".join(key.split("/")[:depth]) for key in keys for depth in range(1, key.count("/") + 1)}
        for key in sorted(folders.intersection(keys)):  # an object named as a folder of others cannot be a file there too
            print(f"crackseg: warning: {shown}/{key}: an object with the name of a folder of other objects; left out",
                  file=sys.stderr)
        keys = [key for key in keys if key not in folders]
        for key in keys:
            if any(part in ("", ".", "..") for part in key.split("/")):
                raise StorageError(f"{prefix}/{key}", "a key with an empty, '.' or '..' part cannot be staged; copy it to a plain key")
            self._copy(f"{prefix}/{key}", folder / key)
        copied(folder)
        return folder

    def file(self, text: str, fetch: Callable[[str], bool] = lambda name: True) -> Path:
        """``text`` as a local file: a URL's object downloaded where ``fetch(its name)`` says so; otherwise its path is
        pathlib's folding of the URL, which :meth:`shown` names by the URL."""
        source = location(text)
        if isinstance(source, Path):
            return source
        remote = RemoteFile(source)
        if not fetch(remote.name):
            self._copies.append((str(Path(source)), display_url(source)))
            return Path(source)
        path = self._new_folder("files") / str(len(self._copies)) / remote.name
        self._copy(source, path)
        self._copies.append((str(path), display_url(source)))
        return path

    def _copy(self, url: str, path: Path) -> None:
        """The object at ``url`` downloaded whole to ``path``; a full staging folder is one line naming it."""
        try:
            write_atomic(path, RemoteFile(url).read_bytes())
        except OSError as error:
            if error.errno not in _NO_ROOM:
                raise
            raise InputError(f"no space left in {self._temp}, the staging folder of the inputs {self._command} reads from "
                             f"the store (set TMPDIR to a folder with room): {display_url(url)} could not be downloaded") from None

    def shown(self, text: str) -> str:
        """``text`` (a path, a message) with every copy named by its URL."""
        for root, url in sorted(self._copies, key=lambda pair: -len(pair[0])):  # a photo before the folder that holds it
            text = text.replace(f"{root}/", f"{url}/").replace(root, url)
        return text

    def _new_folder(self, name: str) -> Path:
        if self._temp is None:
            self._temp = Path(tempfile.mkdtemp(prefix=f"crackseg-{self._command}-")).resolve()
        folder = self._temp / name
        folder.mkdir(exist_ok=True)
        return folder


def inside(target: str | Path, source: str | Path) -> bool:
    """Whether ``target`` lies in ``source`` (or is it): folders by their resolved paths, prefixes by their keys."""
    target, source = location(target), location(source)
    if isinstance(target, Path) and isinstance(source, Path):
        return target.resolve() == source.resolve() or target.resolve().is_relative_to(source.resolve())
    if isinstance(target, str) and isinstance(source, str):
        return (target.rstrip("/") + "/").startswith(source.rstrip("/") + "/")
    return False


def _lock_object(key: str) -> bool:
    """A run's lock object, left out of a staged copy."""
    name = key.rsplit("/", 1)[-1]
    return name.startswith(".crackseg-") and name.endswith(".lock")
