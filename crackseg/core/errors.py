"""The one exception type for mistakes a user can fix: the CLI prints it as one line, exit 2.

A missing optional dependency is such a mistake: :func:`require` names the pip install.
"""

from __future__ import annotations

import importlib


class InputError(Exception):
    """Bad input from the user: a missing path, a malformed file, a contradictory flag.

    The message names the file or flag and says what to do; no traceback is shown.
    """


def user_message(error: InputError) -> str:
    """What ``error`` says to the user: its message, also where a DataLoader worker raised it and torch raised it again
    in the main process, its message then after the worker's traceback."""
    text = str(error)
    said = f"{type(error).__module__}.{type(error).__qualname__}: "
    if text.startswith("Caught ") and "\nOriginal Traceback (most recent call last):" in text and said in text:
        return text.rsplit(said, 1)[1].rstrip("\n")
    return text


class Terminated(KeyboardInterrupt):
    """SIGTERM, what a scheduler or ``kubectl delete`` sends: raised where the process is, so that every cleanup Ctrl-C
    runs (locks, staging folders, half-written files, Ray actors) runs for it too; the command then exits with 143."""


class RunError(Exception):
    """A run that cannot go on (a full disk, a store gone): one line naming where, exit status 1. ``final``: it would
    fail the same way again, so a launch that restarts its processes after a failure does not."""

    final = False


class Diverged(RunError):
    """A training loss that became non-finite: resumed from its last checkpoint, the run repeats the same steps bit for
    bit and diverges at the same one."""

    final = True


def require(module: str, extra: str, needed_for: str | None = None):
    """Import an optional dependency, or stop with one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        missing = f"{needed_for} needs {module}" if needed_for else f"{module} is not installed"
        raise InputError(f"{missing}; pip install 'crackseg[{extra}]'") from None
