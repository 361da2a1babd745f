"""Interrupts (SIGINT, SIGTERM) recorded by the command's handler and acted on at safe points."""

from __future__ import annotations

import os
import signal
import threading

from recordforge.errors import Interrupted

# The CLI's signal handler only records the signal (`record`) and returns: an exception raised in
# a handler lands at whatever bytecode the main thread happens to run (inside a generator's
# cleanup once, which turned the interrupt into a failure and deleted the run's finished pieces).
# The code a command spends its time in asks at safe points (`check`: a source's batch loop, the
# read-ahead's wait, the publishing steps before the commit, the read tools' waits) and raises
# `Interrupted` there, from ordinary code. What fails because of the interrupt (a runner's
# wrapping of it into a plain RuntimeError, a forked worker the same Ctrl-C ended) asks
# `received` before it reports anything: those failures are the interrupt, which the CLI reports
# in one line. The driver's handler may run a moment after a worker's end is seen (both are
# scheduled by the kernel), so a failing thread waits that moment for it (`received(within=)`);
# a failure with no interrupt is reported that much later.

__all__ = ["MOMENT_S", "check", "clear", "owner", "received", "record", "signum"]

# How long a thread that failed as a worker ended waits for the driver's handler: the signal
# reached both at once, and the handler runs as soon as the main thread next holds the GIL.
MOMENT_S = 2.0

_received = threading.Event()
_signum: int | None = None  # the first signal recorded; later ones do not replace it
_owner = 0  # the process whose command records signals (a forked child is not it)


def record(signum: int) -> None:
    """Called by the signal handler of the command (in the main thread; it raises nothing).
    The number is set before the event, so that whoever sees the event finds the number."""
    global _signum
    if _signum is None:
        _signum = signum
    _received.set()


def clear() -> None:
    """Called as a command starts, before its handlers are installed: this process records."""
    global _signum, _owner
    _signum = None
    _owner = os.getpid()
    _received.clear()


def owner() -> bool:
    """Whether this process is the one whose command records signals: a child forked from it
    (a pool's worker) inherits the handler, and dies of the signal instead (cli/main.py)."""
    return _owner == os.getpid()


def signum() -> int | None:
    """The signal recorded first, or None."""
    return _signum if _received.is_set() else None


def received(within: float = 0.0) -> bool:
    """Whether an interrupt was recorded, waiting up to `within` seconds for one (never call
    this with a wait from the main thread: the handler that records it runs there)."""
    return _received.wait(within) if within > 0 else _received.is_set()


def check() -> None:
    """A safe point: raises `Interrupted` if a signal was recorded. Lock-free (an Event's flag
    read), so that a hot loop may call it once per batch."""
    if _received.is_set():
        raise Interrupted(_signum if _signum is not None else signal.SIGINT)
