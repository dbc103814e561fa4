"""One crackseg run per folder, one writer per shared file: a lock file naming the process that holds it.

:class:`FolderLock` is ``FOLDER/lock`` (a run folder, a predictions folder, a comparison folder);
:class:`FileLock` is ``.<name>.lock`` beside one file that is replaced whole in a folder it shares
with other files (the crack register); both are the one lock below. :class:`StoreLock` is the same
rule for an s3:// prefix that predict or compare writes to: an object created only if absent.

The lock is created whole (a hard link of a finished temp file), which is atomic on local
file systems and NFS. A lock whose process is gone from this host is stale and taken over
with a warning, as is one left by an earlier attempt of the same torchrun job
(``--max-restarts``); a lock held from another host is never assumed stale, since its
process cannot be checked from here.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from crackseg.core.errors import InputError
from crackseg.core.files import temp_path, write_atomic
from crackseg.core.storage import RemoteFile, StorageError, UnsupportedByStore, create_if_absent, delete_file
from crackseg.core.urls import display_url


class _Lock:
    """The lock file ``path`` while this process holds it; :meth:`_refusal` words the error for a live holder."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._held: dict | None = None

    def acquire(self) -> None:
        """Take the lock (its folder must exist), or stop naming the process that holds it."""
        mine = _lock_record()
        temp = temp_path(self.path, str(os.getpid()))
        write_atomic(temp, json.dumps(mine) + "\n")
        try:
            for _ in range(2):
                try:
                    os.link(temp, self.path)
                    self._held = mine
                    break
                except FileExistsError:
                    holder = _read_lock(self.path)
                    reason = _stale_reason(holder, mine)
                    if reason is None:
                        raise InputError(self._refusal(holder)) from None
                    print(f"crackseg: warning: {self.path}: {reason}; taking it over", file=sys.stderr)
                    self.path.unlink(missing_ok=True)
        finally:
            temp.unlink(missing_ok=True)

    def check(self) -> None:
        """Before any work: stop, naming the holder, when a live process holds the lock (one it does not take; a stale
        lock is left for :meth:`acquire` to take over)."""
        if self._held is None and self.path.exists():
            holder = _read_lock(self.path)
            if self.path.exists() and _stale_reason(holder, _lock_record()) is None:
                raise InputError(self._refusal(holder))

    def release(self) -> None:
        """Remove the lock if this process holds it."""
        if self._held is not None and _read_lock(self.path) == self._held:
            self.path.unlink(missing_ok=True)
        self._held = None

    def _refusal(self, holder: dict | None) -> str:
        raise NotImplementedError


class FolderLock(_Lock):
    """``FOLDER/lock`` while this process runs a ``work`` (training, prediction) there; ``flag`` names the folder's option."""

    def __init__(self, folder: Path, work: str, flag: str):
        super().__init__(Path(folder) / "lock")
        self.work = work
        self.flag = flag

    def _refusal(self, holder: dict | None) -> str:
        return (f"{self.path.parent} is in use by {_describe_holder(holder, self.work)}; wait for that {self.work} to "
                f"finish or choose another {self.flag} (if it is not running any more, delete {self.path})")


class FileLock(_Lock):
    """``.<name>.lock`` beside ``target`` while this process writes that one file; ``work`` says what a holder does, as
    the refusal words it ("another crackseg compare is appending to it")."""

    def __init__(self, target: Path, work: str):
        self.target = Path(target)
        real = Path(os.path.realpath(self.target))  # reached through a link too, the file has one lock: beside itself
        super().__init__(real.with_name(f".{real.name}.lock"))
        self.work = work

    def _refusal(self, holder: dict | None) -> str:
        who = (f"its lock file {self.path} is unreadable" if holder is None else
               f"pid {holder.get('pid')} on {holder.get('host')} since {holder.get('since')} holds its lock file {self.path}")
        return f"{self.target}: {self.work}: {who}; wait for it to finish, or delete {self.path} if it is not running any more"


class StoreLock:
    """``PREFIX/.crackseg-<work>.lock``, held while one ``work`` (predict, compare) writes below the s3:// prefix ``url``:
    an object created only if absent (``If-None-Match: *``), naming its host and process, removed by its holder at the end.

    A holder that died, or whose store stopped answering, leaves it: one left by a process of this host that is gone is
    taken over with a warning (as a local lock is); one from another host cannot be checked from here, so the refusal
    says how to remove it by hand. A store that cannot write conditionally is refused with ``without_lock``, what to do
    instead.
    """

    def __init__(self, url: str, work: str, without_lock: str):
        self.prefix = url.rstrip("/")
        self.url = f"{self.prefix}/.crackseg-{work}.lock"
        self.name = self.url.rsplit("/", 1)[1]
        self._work, self._without_lock = work, without_lock
        self._record: bytes | None = None

    def acquire(self, existing: set[str]) -> None:
        """Take the lock; ``existing``: the keys below the prefix, listed just before (a store that ignores If-None-Match
        still stops a run that starts after another took the lock)."""
        shown, lock = display_url(self.prefix), display_url(self.url)
        mine = _lock_record()
        record = json.dumps(mine).encode()
        try:
            created = self.name not in existing and create_if_absent(self.url, record)
            if not created:
                stale = _stale_reason(self._holder(), mine)
                if stale is not None:
                    print(f"crackseg: warning: {lock}: {stale}; taking it over", file=sys.stderr)
                    delete_file(self.url)
                    created = create_if_absent(self.url, record)
        except UnsupportedByStore as error:
            raise InputError(f"{error}, so {self._work} cannot lock {shown}/ against a second run; {self._without_lock}") from None
        if not created:
            raise InputError(f"{lock}: another {self._work} is writing to {shown}/; if none is (a run that was killed), "
                             f"remove the lock with: aws s3 rm {lock}")
        self._record = record

    def release(self) -> None:
        """Remove the lock object if this run created it; a failure to is a warning, so the run's own error is shown."""
        if self._record is None:
            return
        try:
            if RemoteFile(self.url).read_bytes() == self._record:
                delete_file(self.url)
        except StorageError as error:
            print(f"crackseg: warning: {error}; remove the lock with: aws s3 rm {display_url(self.url)}, or run again "
                  "from this host, which takes it over", file=sys.stderr)
        self._record = None

    def _holder(self) -> dict | None:
        """The lock's record, None when it is unreadable (or gone: the next attempt to create it decides)."""
        try:
            record = json.loads(RemoteFile(self.url).read_bytes())
        except (StorageError, ValueError):
            return None
        return record if isinstance(record, dict) else None


def _lock_record() -> dict:
    """Who holds a lock: this process, its host and start time, and its torchrun job and attempt."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "process_start": _process_start(os.getpid()),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        "job": os.environ.get("TORCHELASTIC_RUN_ID"),
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
    }


def _read_lock(lock: Path) -> dict | None:
    try:
        record = json.loads(lock.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None  # a bare pid (an older register lock) names no host: unreadable


def _stale_reason(holder: dict | None, mine: dict) -> str | None:
    """Why a lock held by ``holder`` may be taken over by ``mine``, or None when it is live (or unknowable)."""
    if holder is None:
        return None
    if holder.get("job") and holder.get("job") == mine["job"] and holder.get("attempt", 0) < mine["attempt"]:
        return f"left by attempt {holder.get('attempt', 0)} of this torchrun job"
    if holder.get("host") != mine["host"]:
        return None
    start = _process_start(holder.get("pid", -1))
    if start is None or (holder.get("process_start") is not None and start != holder["process_start"]):
        return f"left by pid {holder.get('pid')} on this host, which is no longer running"
    return None


def _describe_holder(holder: dict | None, work: str) -> str:
    if holder is None:
        return f"another {work} (its lock file is unreadable)"
    return f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})"


def _process_start(pid: int) -> int | None:
    """The start time of a running process (clock ticks since boot; 0 where /proc is missing), None when it is not running."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except (PermissionError, OverflowError, ValueError):
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0
