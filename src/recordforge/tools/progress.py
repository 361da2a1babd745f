"""Progress for long operations: a live line on a terminal, plain log lines otherwise. Records
are counted as chunks of them finish (thousands at a time, not once per file), and the ETA comes
from the share of the files' bytes read, so a run of one large shard moves too."""

from __future__ import annotations

import logging
import sys
import time

__all__ = ["Progress"]

_LOGGER = logging.getLogger("recordforge")


class Progress:
    def __init__(
        self, what: str, total_files: int, *, total_bytes: int | None = None, every_s: float = 10.0
    ) -> None:
        self._what = what
        self._total = total_files
        self._total_bytes = total_bytes
        self._files = 0
        self._records = 0
        self._raw = 0
        self._start = time.monotonic()
        self._last = self._start
        self._every = every_s
        self._tty = sys.stderr.isatty()

    def update(self, files: int = 0, records: int = 0, raw: int = 0) -> None:
        self.set(self._files + files, self._records + records, self._raw + raw)

    def set(self, files: int, records: int, raw: int = 0) -> None:
        self._files, self._records, self._raw = files, records, raw
        now = time.monotonic()
        if (self._tty and now - self._last >= 0.2) or now - self._last >= self._every:
            self._last = now
            self._show(now)

    def done(self) -> None:
        if self._tty:
            self._show(time.monotonic())
            sys.stderr.write("\n")

    def _eta(self, elapsed: float) -> str:
        if self._total_bytes and self._raw:
            share = min(self._raw / self._total_bytes, 1.0)
            return f", ETA {elapsed * (1 - share) / share:.0f} s"
        if self._files:
            return f", ETA {elapsed / self._files * (self._total - self._files):.0f} s"
        return ""

    def _show(self, now: float) -> None:
        elapsed = max(now - self._start, 1e-9)
        line = (
            f"{self._what}: {self._records:,} records, {self._files}/{self._total} files, "
            f"{self._records / elapsed:,.0f} records/s{self._eta(elapsed)}"
        )
        if self._tty:
            sys.stderr.write("\r" + line + "\x1b[K")
            sys.stderr.flush()
        else:
            _LOGGER.info(line)
