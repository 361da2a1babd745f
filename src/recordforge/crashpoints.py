"""Named steps of the publishing protocol at which a test can kill the run (for testing only)."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["ENV", "POINTS", "arm", "reached"]

# Set to one of POINTS, the run that reaches that step is killed with SIGKILL there, as a power cut
# or the OOM killer would: no handler, no cleanup. Nothing else reads this variable.
ENV = "RECORDFORGE_CRASH_AT"
# The pid of the run's driver, recorded by `arm` before its workers are forked: a step that runs
# in a forked local worker kills the driver too, so that the run dies, not only that worker.
_DRIVER_ENV = "RECORDFORGE_CRASH_DRIVER"

POINTS = (
    "locked",  # the lock taken and this run's journal entry written
    "shards_published",  # the shards moved to their final names in the run's version folder
    "manifest_written",  # the version folder complete, its own metadata.json included
    "staged",  # the top-level files written beside their names, the old version still published
    "committed",  # the top-level metadata.json replaced: the commit point
    "copied",  # _SUCCESS and the top-level copies in place
    "cleaned",  # versions older than the replaced one deleted, the lock still held
)


def arm() -> None:
    """Called by the run's driver before its workers start (under the lock): records it as the
    process a crash point kills. Does nothing unless the environment names a point."""
    if os.environ.get(ENV):
        os.environ[_DRIVER_ENV] = str(os.getpid())


def reached(point: str) -> None:
    """Marks `point` of the protocol; kills the run (its driver, then this process) if the
    environment names it."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}")
    if os.environ.get(ENV) == point:
        sys.stdout.flush()
        sys.stderr.flush()
        driver = int(os.environ.get(_DRIVER_ENV) or os.getpid())
        if driver != os.getpid():
            try:
                os.kill(driver, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.kill(os.getpid(), signal.SIGKILL)
