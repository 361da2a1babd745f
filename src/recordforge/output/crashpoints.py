"""Named steps of the publishing protocol at which a test can kill the run (for testing only)."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["AFTER_ENV", "ENV", "POINTS", "SIGNAL_ENV", "arm", "reached"]

# Set to one of POINTS, the run that reaches that step is killed with SIGKILL there, as a power cut
# or the OOM killer would: no handler, no cleanup. Nothing else reads this variable.
ENV = "RECORDFORGE_CRASH_AT"
# The pid of the run's driver, recorded by `arm` before its workers are forked: a step that runs
# in a forked local worker kills the driver too, so that the run dies, not only that worker.
_DRIVER_ENV = "RECORDFORGE_CRASH_DRIVER"
# The point fires the Nth time a process reaches it (default 1): a run killed part way through.
AFTER_ENV = "RECORDFORGE_CRASH_AFTER"
# "SIGINT": the driver is sent a Ctrl-C instead, and the process reaching the point goes on.
SIGNAL_ENV = "RECORDFORGE_CRASH_SIGNAL"
_reached: dict[str, int] = {}
# With SIGNAL_ENV: the read end of a pipe holding one byte, made by `arm` in the driver before
# its workers are forked: the process that reads the byte sends the signal, so that a run gets
# one Ctrl-C as from a terminal, not one per worker reaching its Nth point (a second signal ends
# the driver at once: cli/main.py).
_signal_once: int | None = None

POINTS = (
    "locked",  # the lock taken and this run's journal entry written
    "piece_written",  # a finished part or placed shard and its record written, the run going on
    "shards_published",  # the shards moved to their final names in the run's version folder
    "manifest_written",  # the version folder complete, its own metadata.json included
    "staged",  # the top-level files written beside their names, the old version still published
    "committed",  # the top-level metadata.json replaced: the commit point
    "copied",  # _SUCCESS and the top-level copies in place
    # In the driver, as the local runner closes a forked worker (the others still open): a
    # Ctrl-C there once left the others waiting for work, and the run waiting for them.
    "workers_closing",
    "cleaned",  # versions older than the replaced one deleted, the lock still held
)


def arm() -> None:
    """Called by the run's driver before its workers start (under the lock): records it as the
    process a crash point kills. Does nothing unless the environment names a point."""
    global _signal_once
    if os.environ.get(ENV):
        os.environ[_DRIVER_ENV] = str(os.getpid())
        if os.environ.get(SIGNAL_ENV) == "SIGINT" and _signal_once is None:
            read, write = os.pipe()
            os.write(write, b"!")
            os.close(write)
            os.set_blocking(read, False)
            _signal_once = read


def reached(point: str) -> None:
    """Marks `point` of the protocol; kills the run (its driver, then this process) if the
    environment names it."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}")
    if os.environ.get(ENV) == point:
        _reached[point] = _reached.get(point, 0) + 1
        if _reached[point] != int(os.environ.get(AFTER_ENV) or 1):
            return
        if os.environ.get(SIGNAL_ENV) == "SIGINT":
            if _signal_once is None or os.read(_signal_once, 1):
                os.kill(int(os.environ.get(_DRIVER_ENV) or os.getpid()), signal.SIGINT)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        driver = int(os.environ.get(_DRIVER_ENV) or os.getpid())
        if driver != os.getpid():
            try:
                os.kill(driver, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)
