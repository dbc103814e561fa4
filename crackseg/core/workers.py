"""Processes that hand data to the process that started them (a loader's workers).

A worker passes each tensor to its parent as a file descriptor, from a helper thread the parent connects to
(:mod:`multiprocessing.resource_sharer`). When Ctrl-C stops the parent in the middle of such a handoff, the thread
finds the connection closed and prints a traceback over the parent's one-line stop. That report is dropped here; the
parent says why the run stopped.
"""

from __future__ import annotations

import sys
import threading

_PARENT_GONE = (EOFError, ConnectionError)


def quiet_when_parent_stops(worker_id: int = 0) -> None:
    """Drop this process's reports of a handoff cut short by its parent; a loader's ``worker_init_fn``."""
    report = sys.excepthook

    def hook(kind, error, trace) -> None:
        if issubclass(kind, _PARENT_GONE) and threading.current_thread() is not threading.main_thread():
            return
        report(kind, error, trace)

    sys.excepthook = hook
