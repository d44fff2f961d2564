"""The driver's stop signals: raised where they can be, recorded where they cannot, and a second one
during the stop only hurries it."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from rredcot.launch import interrupts
from rredcot.launch.interrupts import raise_if_interrupted, stopping


def test_a_stop_signal_that_library_code_swallowed_still_stops_the_run() -> None:
    """Ray's start-up can catch the KeyboardInterrupt of a Ctrl-C and carry on; the driver's handler
    records the signal, and the next check raises it again."""
    interrupts.received.clear()
    raise_if_interrupted()  # no signal: nothing
    with contextlib.suppress(KeyboardInterrupt):  # what the library did
        interrupts.raise_interrupt(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        raise_if_interrupted()
    interrupts.received.clear()


class _DropsInterrupt:
    """Raises a stop signal inside ``__del__``, where Python can only print the exception, as it
    does in the at-fork hooks that run while a subprocess starts."""

    def __init__(self, raise_: Any) -> None:
        self.raise_ = raise_

    def __del__(self) -> None:
        self.raise_()


def test_an_interrupt_python_can_only_print_prints_no_traceback_and_still_stops_the_run(monkeypatch) -> None:
    """CI saw ``Exception ignored in: <function _releaseLock ...> Traceback ... KeyboardInterrupt`` on
    the console of a Ctrl-C'd run: the signal landed in logging's at-fork hook."""
    printed: list[BaseException] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: printed.append(u.exc_value))
    interrupts.received.clear()
    with contextlib.ExitStack() as stack:
        interrupts.catch_interrupts(stack)
        _DropsInterrupt(lambda: signal.raise_signal(signal.SIGINT))
        assert printed == []  # not shown ...
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            raise_if_interrupted()  # ... but not lost
        _DropsInterrupt(lambda: 1 / 0)
        assert [type(e) for e in printed] == [ZeroDivisionError]  # anything else is printed as before
    assert signal.getsignal(signal.SIGINT) is not interrupts.raise_interrupt
    sys.unraisablehook(SimpleNamespace(exc_value=KeyboardInterrupt()))  # the hook before is back
    assert isinstance(printed[-1], KeyboardInterrupt)
    interrupts.received.clear()


def test_a_signal_inside_loggings_lock_functions_waits_until_they_release_the_lock() -> None:
    """Raised inside ``logging._releaseLock`` (an at-fork hook as well), the interrupt would leave
    logging's module lock held; the handler records it there, and the next check raises it."""
    frames = {}

    def keep(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__") in ("logging", __name__):
            frames.setdefault(frame.f_code.co_name, frame)

    def elsewhere() -> None:
        pass

    sys.setprofile(keep)
    try:
        logging.getLogger("rredcot.test.driver")  # takes and releases the module lock
        elsewhere()
    finally:
        sys.setprofile(None)
    in_logging = [f for name, f in frames.items() if name in interrupts.LOGGING_LOCK_FUNCTIONS]
    assert in_logging, sorted(frames)
    interrupts.received.clear()
    for frame in in_logging:
        interrupts.raise_interrupt(signal.SIGINT, frame)  # recorded, not raised
    assert interrupts.received == ["SIGINT"] * len(in_logging)
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        raise_if_interrupted()
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        interrupts.raise_interrupt(signal.SIGTERM, frames["elsewhere"])  # anywhere else: raised at once
    interrupts.received.clear()


def test_a_second_signal_while_stopping_hurries_the_stop_instead_of_raising() -> None:
    """Ctrl-C twice used to end the run without its summary.json: the second one raised inside the
    stop. Now it only sets ``hurried`` (the stop stops waiting for the learner); the handlers before
    are back afterwards."""
    before = signal.getsignal(signal.SIGINT)
    interrupts.received.clear()
    with stopping():
        assert not interrupts.hurried.is_set()
        signal.raise_signal(signal.SIGINT)  # no KeyboardInterrupt here
        signal.raise_signal(signal.SIGTERM)
        assert interrupts.hurried.is_set() and interrupts.received == ["SIGINT", "SIGTERM"]
    assert signal.getsignal(signal.SIGINT) is before
    interrupts.received.clear()
