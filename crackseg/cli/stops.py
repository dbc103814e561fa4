"""Ctrl-C and SIGTERM as exceptions in the main thread, never lost.

SIGTERM raises :class:`~crackseg.core.errors.Terminated`, as Ctrl-C raises KeyboardInterrupt, so that every cleanup
runs for both. Python ignores an exception raised inside a finalizer or ``__del__``: a signal that arrives while one
runs (Ray's driver runs many) would be lost and the run go on to its end. Such a stop is sent again, a moment later,
to be raised once the main thread is back in ordinary code.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

from crackseg.core.errors import Terminated

RESEND_S = 0.01  # after a swallowed stop, when its signal comes again


class _Stops:
    def __init__(self) -> None:
        self.hook = sys.unraisablehook
        self.in_hook = False  # a stop raised inside the hook itself would be lost as well
        self.resends: list[threading.Timer] = []

    def interrupt(self, signum, frame) -> None:
        self._raise(signum, KeyboardInterrupt)

    def terminate(self, signum, frame) -> None:
        self._raise(signum, Terminated)

    def _raise(self, signum: int, stop: type[KeyboardInterrupt]) -> None:
        if self.in_hook:
            self._resend(signum)
        else:
            raise stop()

    def unraisable(self, unraisable) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self.hook(unraisable)
            return
        self.in_hook = True
        self._resend(signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT)
        self.in_hook = False  # no signal handler runs between this store and the return

    def _resend(self, signum: int) -> None:
        timer = threading.Timer(RESEND_S, signal.pthread_kill, (threading.main_thread().ident, signum))
        timer.daemon = True
        self.resends.append(timer)
        timer.start()


@contextlib.contextmanager
def stops_raised() -> Iterator[None]:
    """SIGTERM raised as :class:`Terminated`, and stops swallowed by finalizers sent again, while the block runs; Ctrl-C
    left alone where it is ignored (a background job). Outside the main thread (a command run from a thread), where
    Python runs no signal handler, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = _Stops()
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, stops.terminate)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, stops.interrupt)
    sys.unraisablehook = stops.unraisable
    try:
        yield
    finally:
        for timer in stops.resends:  # the command ended: a stop not yet sent again has done its work
            timer.cancel()
        sys.unraisablehook = stops.hook
        for signum, handler in previous.items():
            signal.signal(signum, handler)
