"""SIGTERM and SIGHUP ended as Ctrl-C ends a command, and a signal's exception that Python ignored
where it landed (a finaliser) raised again where the command is."""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
from typing import Any, Iterator

# a signal's exception ignored where it landed is raised again this long after (the finaliser done)
REDELIVERY_S = 0.01


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C is: a search gives its running
    trials back (a resumed run re-runs them, not "running elsewhere") and ends its workers."""


@contextlib.contextmanager
def terminations_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while the command runs (in the main thread; as
    before after), and a signal's exception that Python ignored where it landed is raised again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated(signum)

    def redelivered(unraisable: Any) -> None:
        """A signal's exception ignored in a finaliser or a garbage collector's callback (SQLAlchemy's)
        is delivered again, once that is done, to land where the command is. One that ran out of stack
        (reading a stored value nested past any parser) is not said: so would its report, in lines of
        tracebacks above the one line that says the cause."""
        if isinstance(unraisable.exc_value, RecursionError):
            return
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            with contextlib.suppress(RecursionError):
                hook(unraisable)
            return
        number = unraisable.exc_value.args[0] if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        again = threading.Timer(REDELIVERY_S, _thread.interrupt_main, (number,))
        again.daemon = True
        again.start()

    previous = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGHUP)}
    hook, sys.unraisablehook = sys.unraisablehook, redelivered
    try:
        yield
    finally:
        sys.unraisablehook = hook
        for number, handler in previous.items():
            signal.signal(number, handler)
