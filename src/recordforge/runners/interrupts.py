"""Whether the command this process runs was interrupted (SIGINT, SIGTERM): asked by what fails
because of it before it reports anything.

A terminal's Ctrl-C reaches the whole process group: the local runner's forked workers end at
once (their SIGINT is the default action), so the driver's thread watching each one, and Beam's
threads reading their connections, fail as the driver's own handler stops the run. Those
failures are the interrupt, which the CLI reports in one line; they say nothing more. The
driver's handler (cli/main.py) may run a moment after a worker's end is seen (both are
scheduled by the kernel), so a failing thread waits that moment for it (`received(within=...)`);
a failure with no interrupt is reported that much later.
"""

from __future__ import annotations

import threading

__all__ = ["MOMENT_S", "clear", "received", "record"]

# How long a thread that failed as a worker ended waits for the driver's handler: the signal
# reached both at once, and the handler runs as soon as the main thread next holds the GIL.
MOMENT_S = 2.0

_received = threading.Event()


def record() -> None:
    """Called by the signal handler of the command (in the main thread; it raises nothing)."""
    _received.set()


def clear() -> None:
    """Called as a command starts, before its handlers are installed."""
    _received.clear()


def received(within: float = 0.0) -> bool:
    """Whether an interrupt was recorded, waiting up to `within` seconds for one (never call
    this with a wait from the main thread: the handler that records it runs there)."""
    return _received.wait(within) if within > 0 else _received.is_set()
