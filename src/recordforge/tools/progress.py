"""Progress for long operations: a live line on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["Progress"]

_LOGGER = logging.getLogger("recordforge")


class Progress:
    def __init__(self, what: str, total_files: int, *, every_s: float = 10.0) -> None:
        self._what = what
        self._total = total_files
        self._files = 0
        self._records = 0
        self._start = time.monotonic()
        self._last = self._start
        self._every = every_s
        self._tty = sys.stderr.isatty()

    def update(self, files: int = 0, records: int = 0) -> None:
        self._files += files
        self._records += records
        now = time.monotonic()
        if self._tty or now - self._last >= self._every:
            self._last = now
            self._show(now)

    def done(self) -> None:
        self._show(time.monotonic())
        if self._tty:
            sys.stderr.write("\n")

    def _show(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        rate = self._records / elapsed
        left = self._total - self._files
        eta = elapsed / self._files * left if self._files else float("nan")
        line = (
            f"{self._what}: {self._files}/{self._total} files, {self._records} records, "
            f"{rate:,.0f} records/s, ETA {eta:.0f}s"
        )
        if self._tty:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        else:
            _LOGGER.info(line)
