"""The one lock file (crackseg/core/locks.py) for a single file: ``.<name>.lock`` beside it, refused while its holder
lives, taken over from a dead process of this host, never from another host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from crackseg.core.errors import InputError
from crackseg.core.locks import FileLock


def _left(lock, **fields) -> None:
    """A lock file as another process wrote it."""
    record = {"pid": 1, "host": socket.gethostname(), "process_start": None, "since": "earlier", "job": None, "attempt": 0}
    lock.write_text(json.dumps({**record, **fields}) + "\n")


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_file_lock_lies_beside_its_file_and_a_second_holder_is_refused_in_one_line(tmp_path):
    target = tmp_path / "site.gpkg"
    first = FileLock(target, "another crackseg compare is appending to it")
    first.acquire()
    lock = tmp_path / ".site.gpkg.lock"
    assert first.path == lock and json.loads(lock.read_text())["pid"] == os.getpid()
    with pytest.raises(InputError) as refused:
        FileLock(target, "another crackseg compare is appending to it").acquire()
    message = str(refused.value)
    assert message.startswith(f"{target}: another crackseg compare is appending to it: pid {os.getpid()} on {socket.gethostname()}")
    assert f"delete {lock} if it is not running any more" in message and "\n" not in message
    first.release()
    assert not lock.exists() and sorted(path.name for path in tmp_path.iterdir()) == []  # no temp file left either


def test_a_file_lock_of_a_dead_process_is_taken_over_and_one_from_another_host_is_not(tmp_path, capsys):
    target = tmp_path / "site.gpkg"
    lock = tmp_path / ".site.gpkg.lock"
    dead = _dead_pid()
    _left(lock, pid=dead)
    taking = FileLock(target, "another crackseg compare is appending to it")
    taking.acquire()
    assert f"{lock}: left by pid {dead} on this host, which is no longer running; taking it over" in capsys.readouterr().err
    assert json.loads(lock.read_text())["pid"] == os.getpid()
    taking.release()

    _left(lock, pid=dead, host="elsewhere.example")  # its process cannot be checked from here
    with pytest.raises(InputError, match="pid .* on elsewhere.example"):
        FileLock(target, "another crackseg compare is appending to it").acquire()
    lock.write_text("12345\n")  # a bare pid (an older crackseg's register lock): no host to check it on
    with pytest.raises(InputError, match=f"its lock file {lock} is unreadable"):
        FileLock(target, "another crackseg compare is appending to it").acquire()
    assert lock.read_text() == "12345\n"
