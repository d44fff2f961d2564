"""The driver's stop signals: SIGINT and SIGTERM stop a run in order, and never leave it half-reported.

The first signal raises a recorded ``KeyboardInterrupt`` wherever the driver is (one that library code
swallows is raised again at the next check); while the run then stops and writes its report, further
signals only cut the learner's grace period short (``hurried``), so the report is always written.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from typing import Any

log = logging.getLogger(__name__)

received: list[str] = []  # signals that stopped the run (Ray may re-raise a KeyboardInterrupt of its own)
# logging's module-lock functions, which run as at-fork hooks too: an exception raised in them leaves
# the lock held (every other thread's getLogger would then wait forever)
LOGGING_LOCK_FUNCTIONS = {"_acquireLock", "_releaseLock", "_prepareFork", "_afterFork"}


def raise_interrupt(signum: int, frame: Any) -> None:
    """The run's handler of SIGINT and SIGTERM: record the signal and raise it (not inside logging's lock)."""
    received.append(signal.Signals(signum).name)
    if (
        frame is not None
        and frame.f_globals.get("__name__") == "logging"
        and frame.f_code.co_name in LOGGING_LOCK_FUNCTIONS
    ):
        return  # let it release the lock: the next raise_if_interrupted raises the signal
    raise KeyboardInterrupt(received[-1])


def catch_interrupts(stack: contextlib.ExitStack) -> None:
    """Until ``stack`` closes: SIGINT raises a recorded ``KeyboardInterrupt``, and one that lands
    where Python can only print it (an at-fork hook as a subprocess starts, a ``__del__``) prints
    no traceback: it goes to driver.log, and ``raise_if_interrupted`` raises it again."""
    stack.callback(signal.signal, signal.SIGINT, signal.signal(signal.SIGINT, raise_interrupt))
    previous = sys.unraisablehook

    def quiet_dropped_interrupt(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and received:
            log.debug("a %s landed in %r, which drops exceptions; raised again later", received[-1], unraisable.object)
            return
        previous(unraisable)

    sys.unraisablehook = quiet_dropped_interrupt
    stack.callback(setattr, sys, "unraisablehook", previous)


def raise_if_interrupted() -> None:
    """Raise the ``KeyboardInterrupt`` of a stop signal that library code caught and dropped."""
    if received:
        raise KeyboardInterrupt(received[-1])


hurried = threading.Event()  # a signal arrived while the run was already stopping


def _hurry(signum: int, frame: Any) -> None:
    received.append(signal.Signals(signum).name)
    hurried.set()
    log.warning("%s again: not waiting for the learner's checkpoint; writing the report", received[-1])


@contextlib.contextmanager
def stopping() -> Any:
    """While the run stops and writes its report: a further SIGINT or SIGTERM sets ``hurried``
    instead of raising, so a second Ctrl-C shortens the stop and still leaves the report."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hurried.clear()
    before = {s: signal.signal(s, _hurry) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
