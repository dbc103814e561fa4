"""torchrun as ``launch.sh`` runs it: a launch whose processes stop on an error they report ends with their line and
exit status, as the command alone would, not with torchrun's traceback.

torchrun restarts every process after any failure (``--max-restarts``, which lets a crashed training resume) and
ends with its own traceback. A process that stops on a user mistake (exit status 2) marks it in a file of the
launch: the restarted processes exit at once without saying it again (it would only repeat), torchrun's failure lines
are left out, and the launch exits with 2. A process that ends with exit status 1 after saying why (a run that cannot
go on, inputs that failed) marks that for its attempt: the launch exits with 1 when torchrun gives up after such an
attempt. Any other failure (a crash, a signal) is reported as torchrun reports it.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKS = "CRACKSEG_LAUNCH_MARKS"  # the folder of a launch's marks: "2" once a process stops on a user mistake, "1.N" on a
# failure it said in attempt N (torchrun's restart count)
USER_MISTAKE, FAILED = 2, 1  # crackseg.cli.main's exit statuses


def said_already() -> bool:
    """Whether another process of this launch stopped on a user mistake (this one was restarted after it)."""
    mark = _mark(USER_MISTAKE)
    return mark is not None and mark.exists()


def first_to_say() -> bool:
    """Mark a user mistake for the launch; whether this process is the first of it to stop on one (always, unlaunched),
    and so says it: every process of a launch meets the same mistake."""
    mark = _mark(USER_MISTAKE)
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
        marked = [_mark(USER_MISTAKE), _mark(FAILED, args.max_restarts)]  # the last attempt's failure, when torchrun gives up
        logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(
            lambda record: not any(mark.exists() for mark in marked))
        try:
            run(args)
        except ChildFailedError:
            said = [status for status, mark in zip((USER_MISTAKE, FAILED), marked) if mark.exists()]
            if said:
                return said[0]
            raise
    return 0


def _mark(status: int, attempt: int | None = None) -> Path | None:
    """A user mistake's mark, for the whole launch; a failure's, for one attempt (default: this process's, from the
    restart count torchrun gives it), so that a later crash keeps torchrun's report."""
    folder = os.environ.get(MARKS)
    if not folder:
        return None
    if status == USER_MISTAKE:
        return Path(folder) / str(status)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)) if attempt is None else attempt
    return Path(folder) / f"{status}.{attempt}"


if __name__ == "__main__":
    sys.exit(launch(sys.argv[1:]))
