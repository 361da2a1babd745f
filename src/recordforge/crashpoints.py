"""Named steps of the publishing protocol at which a test can kill the run (for testing only)."""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["ENV", "POINTS", "reached"]

# Set to one of POINTS, the process that reaches that step kills itself with SIGKILL there, as a
# power cut or the OOM killer would: no handler, no cleanup. Nothing else reads this variable.
ENV = "RECORDFORGE_CRASH_AT"

POINTS = (
    "locked",  # the lock taken and this run's journal entry written
    "shards_published",  # the shards moved to their final names in the run's version folder
    "manifest_written",  # the version folder complete, its own metadata.json included
    "staged",  # the top-level files written beside their names, the old version still published
    "committed",  # the top-level metadata.json replaced: the commit point
    "copied",  # _SUCCESS and the top-level copies in place
    "cleaned",  # versions older than the replaced one deleted, the lock still held
)


def reached(point: str) -> None:
    """Marks `point` of the protocol; kills this process if the environment names it."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}")
    if os.environ.get(ENV) == point:
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
