"""A loader worker stays quiet when its parent cuts a handoff short, and reports everything else."""

from __future__ import annotations

import subprocess
import sys

import pytest

_WORKER = """
import socket, sys, threading
from multiprocessing import resource_sharer
if sys.argv[1] == "quiet":
    from crackseg.core.workers import quiet_when_parent_stops
    quiet_when_parent_stops(0)
reported, report = threading.Event(), sys.excepthook
sys.excepthook = lambda *error: (report(*error), reported.set())  # outermost: sees every report, shown or dropped
handoff = resource_sharer.DupFd(0)  # a descriptor offered to the parent, as a loader worker offers a tensor
parent = socket.socket(socket.AF_UNIX)
parent.connect(handoff._id[0])
parent.close()  # the parent stopped before taking it
assert reported.wait(30), "the handoff thread reported nothing"
sys.excepthook = report

def other_failure():
    try:
        raise ValueError("a real fault")
    except ValueError:
        sys.excepthook(*sys.exc_info())

threading.Thread(target=other_failure).start()
"""


@pytest.mark.parametrize("mode", ["quiet", "default"])
def test_a_handoff_cut_short_by_the_parent_prints_no_traceback_but_other_faults_do(mode):
    done = subprocess.run([sys.executable, "-c", _WORKER, mode], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "ValueError: a real fault" in done.stderr
    assert ("resource_sharer" in done.stderr) == (mode == "default")  # the check would see the traceback without the hook
