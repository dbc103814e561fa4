"""``predict --out s3://bucket/prefix/``: the predictions folder written locally, staged, and each finished file uploaded.

:class:`~crackseg.prediction.outputs.PredictionsFolder` stays the one writer: it writes into a temporary staging folder
(removed at the end), and every file it finishes goes up whole to the same key below the prefix, an image's files as
soon as they are written (an interrupted run keeps what it did, for ``--skip-existing``), the tables and the report at
the end. The folder's rules hold on the store, checked before any work: outputs are not replaced unless asked, and one
run at a time holds ``PREFIX/.crackseg-predict.lock``, an object created only if absent (``If-None-Match: *``).
Under torchrun every process stages and uploads its own photos' files; the parts of a raster go through the store to
rank 0, which joins them, so the processes may run on several machines.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.files import write_atomic
from crackseg.core.locks import StoreLock
from crackseg.core.storage import RemoteFile, StorageError, delete_file, display_url, list_keys, upload_file
from crackseg.prediction.outputs import PredictionsFolder

LOCK_NAME = ".crackseg-predict.lock"  # StoreLock's name for predict


class RemoteOutputs:
    """The predictions of one run under the s3:// prefix ``url``; ``folder`` is the local staging folder that is written.

    A context manager: leaving it removes the staging folder. ``lock``: False (``--no-lock``) runs without the lock object.
    """

    def __init__(self, url: str, lock: bool = True):
        self.url = url.rstrip("/")
        self.shown = display_url(self.url)
        self.folder = PredictionsFolder(Path(tempfile.mkdtemp(prefix="crackseg-out-")))
        self._lock = StoreLock(self.url, "predict", "pass --no-lock to go on without the guard (and run one predict per "
                               "--out at a time)") if lock else None
        self.existing: set[str] = set()  # keys below the prefix when the run began

    def __enter__(self) -> RemoteOutputs:
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.folder.root, ignore_errors=True)

    def url_of(self, path: Path) -> str:
        """The object a staged file goes to."""
        return f"{self.url}/{self._key(path)}"

    def display(self, path: Path) -> str:
        """A staged file, or the staging folder, as messages and tables name it: its object's URL, without credentials."""
        return f"{self.shown}/" if Path(path) == self.folder.root else display_url(self.url_of(path))

    def name_masks(self, rows: list[dict]) -> None:
        """predictions.csv's mask column names each mask by its object, as a local run's by its file."""
        for row in rows:
            row["mask"] = self.display(row["mask"])

    def prepare(self, outputs: list[list[Path]], overwrite: bool, skip_existing: bool) -> set[str]:
        """As :meth:`PredictionsFolder.prepare`, on the store: list the prefix (a missing bucket or a refused request
        stops here), take the lock, refuse to replace outputs unless asked; returns the keys listed, which torchrun's
        other processes take as their :attr:`existing`. The caller calls :meth:`release` at the end."""
        if overwrite and skip_existing:
            raise InputError("--overwrite and --skip-existing contradict each other; choose one")
        self.existing = set(list_keys(f"{self.url}/"))
        if self._lock:
            self._lock.acquire(self.existing)
        try:
            tables = [self._key(path) for path in self._tables()]
            clashes = sorted({self._key(path) for paths in outputs for path in paths} & self.existing)
            clashes += [key for key in tables if key in self.existing]
            if clashes and not (overwrite or skip_existing):
                raise InputError(f"{len(clashes)} outputs already exist in {self.shown}/ (e.g. {self.shown}/{clashes[0]}); "
                                 "pass --skip-existing to keep them and finish the rest, or --overwrite to replace them")
            for path in self._tables():  # written again at the end as a local run would: errors.csv kept, rank.csv removed
                if self._key(path) in self.existing:
                    write_atomic(path, RemoteFile(self.url_of(path)).read_bytes())
        except BaseException:
            self.release()
            raise
        return self.existing

    def fetch_if_done(self, outputs: list[Path]) -> bool:
        """Whether every one of an input's ``outputs`` (its mask first) was on the store when the run began; its mask is
        then downloaded, to be summarised as a local mask would be (``--skip-existing``)."""
        if not all(self._key(path) in self.existing for path in outputs):
            return False
        write_atomic(outputs[0], RemoteFile(self.url_of(outputs[0])).read_bytes())
        return True

    def upload(self, paths: list[Path]) -> None:
        """Upload finished files, each whole to its key."""
        for path in paths:
            upload_file(path, self.url_of(path))

    def send_part(self, paths: list[Path]) -> None:
        """Under torchrun, a process's part of a raster (hidden temporary names), uploaded for rank 0 to join: the
        processes' staging folders may lie on different machines."""
        self.upload([path for path in paths if path.exists()])

    def fetch_parts(self, paths: list[Path]) -> None:
        """On rank 0: the parts the other processes sent, downloaded to the same names and removed from the store; a part
        never sent (a process with no rows of the raster) is skipped, and a part that is missing fails the join."""
        for path in paths:
            try:
                content = RemoteFile(self.url_of(path)).read_bytes()
            except StorageError:
                continue
            write_atomic(path, content)
            delete_file(self.url_of(path))

    def finish(self) -> None:
        """After the tables and the report are written: upload them, and remove the tables the run removed."""
        for path in self._tables():
            if path.exists():
                upload_file(path, self.url_of(path))
            elif self._key(path) in self.existing:
                delete_file(self.url_of(path))
        pictures = self.folder.report_pictures
        self.upload(sorted(path for path in pictures.rglob("*") if path.is_file()) if pictures.is_dir() else [])

    def release(self) -> None:
        """Remove the lock object if this run created it."""
        if self._lock:
            self._lock.release()

    def _tables(self) -> list[Path]:
        folder = self.folder
        return [folder.predictions_csv, folder.cracks_csv, folder.errors_csv, folder.summary_json, folder.report_html,
                folder.rank_csv]

    def _key(self, path: Path) -> str:
        return Path(path).relative_to(self.folder.root).as_posix()
