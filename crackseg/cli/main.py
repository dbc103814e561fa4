"""``crackseg <command>``: the parser, built from the command modules, and the exit status of each kind of error.

User mistakes raise :class:`~crackseg.core.errors.InputError` and end as one line on stderr
with exit status 2; a run that cannot go on (:class:`~crackseg.core.errors.RunError`, or an
OSError such as a full disk) ends as one line with exit status 1; Ctrl-C ends with 130 and
SIGTERM, which stops the run as Ctrl-C does, with 143; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys

from crackseg.cli import compare, data, evaluate, labels, predict, serve, train
from crackseg.cli.launch import FAILED, first_to_say, said_already
from crackseg.cli.options import HelpFormatter, Parser
from crackseg.cli.stops import stops_raised
from crackseg.core.errors import InputError, RunError, Terminated, user_message
from crackseg.core.version import __version__

COMMAND_GROUPS = (data, train, predict, labels, serve, compare, evaluate)  # in the order --help lists their commands


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="crackseg",
        description="Train UNets that find cracks in photos, predict crack masks, and score them.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"crackseg {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--"]:  # torchrun ... -m crackseg -- train ...: some Pythons pass the "--" on
        argv = argv[1:]
    args = parser.parse_args(_values_attached(argv))
    try:
        with stops_raised():
            return args.handler(args)
    except Terminated:
        if said_already() is None:  # torchrun stopping this launch's other processes after one said a user mistake
            print("crackseg: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM
    except InputError as error:
        parser.exit(2, f"crackseg: error: {user_message(error)}\n")
    except RunError as error:
        said = not error.final or first_to_say(FAILED)  # a failure a restart would repeat: said by one process, not restarted
        parser.exit(1, f"crackseg: error: {error}\n" if said else None)
    except OSError as error:  # the machine, not the input: a full disk, a vanished mount
        where = f"{error.filename}: " if error.filename else ""
        parser.exit(1, f"crackseg: error: {where}{error.strerror or error}\n")
    except KeyboardInterrupt:
        print("crackseg: interrupted", file=sys.stderr)
        return 130
    except (MemoryError, RuntimeError) as error:
        if not _out_of_memory(error):
            raise
        reason = (str(error).splitlines() or [""])[0][:200]
        shrinking = [f"--{name.replace('_', '-')}" for name in ("batch_size", "crop_size", "tile", "size") if name in vars(args)]
        advice = (f"choose smaller sizes or batches ({', '.join(shrinking)})" if shrinking
                  else "the inputs need more memory than this machine has")
        parser.exit(1, f"crackseg: error: out of memory ({type(error).__name__}: {reason}); {advice}\n")


def _values_attached(argv: list[str]) -> list[str]:
    """``--flag -1,2`` as ``--flag=-1,2``: argparse takes a value that starts with a dash and is not one plain number
    for an option, and says the flag "expected one argument", hiding the value's real problem."""
    joined: list[str] = []
    for arg in argv:
        if joined and re.fullmatch(r"--[a-z][\w-]*", joined[-1]) and re.match(r"-[\d.]", arg):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


def _out_of_memory(error: BaseException) -> bool:
    """NumPy's MemoryError, torch's CUDA OutOfMemoryError, or torch's CPU allocator refusing (a plain RuntimeError)."""
    return (isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError"
            or "DefaultCPUAllocator: can't allocate memory" in str(error))
