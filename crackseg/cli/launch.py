"""torchrun as ``launch.sh`` runs it: a launch whose processes stop on an error they report ends with their line and
exit status, as the command alone would, not with torchrun's traceback.

torchrun restarts every process after any failure (``--max-restarts``, which lets a crashed training resume) and
ends with its own traceback. A process that stops on a user mistake (exit status 2), or on a failure that a restart
would repeat (a :class:`~crackseg.core.errors.RunError` that is ``final``, exit status 1), marks it in a file of the
launch: the restarted processes exit at once without saying it again, torchrun's failure lines are left out, and the
launch exits with that status. A process that ends with exit status 1 after saying why (a run that cannot go on,
inputs that failed) marks that for its attempt: the launch exits with 1 when torchrun gives up after such an attempt.
Any other failure (a crash, a signal) is reported as torchrun reports it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKS = "CRACKSEG_LAUNCH_MARKS"  # the folder of a launch's marks: "2" once a process stops on a user mistake, "1" on a
# failure a restart would repeat, "1.N" on a failure it said in attempt N (torchrun's restart count)
USER_MISTAKE, FAILED = 2, 1  # crackseg.cli.main's exit statuses


def said_already() -> int | None:
    """The exit status of the launch when another process of it stopped on a user mistake or on a failure a restart
    would repeat (this one was restarted after it); else None."""
    return next((status for status in (USER_MISTAKE, FAILED) if (mark := _mark(status, final=True)) and mark.exists()), None)


def first_to_say(status: int = USER_MISTAKE) -> bool:
    """Mark a user mistake (or a failure a restart would repeat, ``status`` 1) for the launch; whether this process is
    the first of it to stop on one (always, unlaunched), and so says it: every process of a launch meets the same one."""
    mark = _mark(status, final=True)
    if mark is None:
        return True
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def exit_status(command: Callable[[], int]) -> int:
    """``command``'s exit status, marked for the launch when launched."""
    try:
        status = command()
    except SystemExit as stop:
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)  # as Python says sys.exit("message")
        status = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else FAILED
    if status == USER_MISTAKE:
        first_to_say()
    elif status == FAILED and (mark := _mark(FAILED)) is not None:
        mark.touch()
    return status


def launch(argv: list[str]) -> int:
    """torchrun with ``argv`` (its options, then ``-m crackseg -- COMMAND ...``); the exit status of the launch."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="crackseg-launch-") as folder:
        os.environ[MARKS] = folder
        # the launch's marks, then the last attempt's failure, when torchrun gives up
        marked = [_mark(USER_MISTAKE, final=True), _mark(FAILED, final=True), _mark(FAILED, args.max_restarts)]
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
            lambda record: not any(mark.exists() for mark in marked))
        try:
            run(args)
        except ChildFailedError:
            said = [status for status, mark in zip((USER_MISTAKE, FAILED, FAILED), marked) if mark.exists()]
            if said:
                return said[0]
            raise
    return 0


def _mark(status: int, attempt: int | None = None, final: bool = False) -> Path | None:
    """A user mistake's mark, or with ``final`` a failure's a restart would repeat, for the whole launch; a failure's,
    for one attempt (default: this process's, from the restart count torchrun gives it), so that a later crash keeps
    torchrun's report."""
    folder = os.environ.get(MARKS)
    if not folder:
        return None
    if final or status == USER_MISTAKE:
        return Path(folder) / str(status)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) if attempt is None else attempt
    return Path(folder) / f"{status}.{attempt}"


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
