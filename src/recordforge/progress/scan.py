"""Progress of the tools' scans: records as chunks finish, the ETA from the share of bytes read."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import logging
import time

from recordforge.progress.line import LiveLine, progress_text

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
        self._line = LiveLine()

    def update(self, files: int = 0, records: int = 0, raw: int = 0) -> None:
        self.set(self._files + files, self._records + records, self._raw + raw)

    def set(self, files: int, records: int, raw: int = 0) -> None:
        self._files, self._records, self._raw = files, records, raw
        now = time.monotonic()
        if (self._line.tty and now - self._last >= 0.2) or now - self._last >= self._every:
            self._last = now
            self._show(now)

    def done(self) -> None:
        if self._line.tty:
            self._show(time.monotonic())
            self._line.stream.write("\n")

    def _show(self, now: float) -> None:
        share: float | None
        if self._total_bytes and self._raw:
            share = self._raw / self._total_bytes
        else:
            share = self._files / self._total if self._total else None
        text = progress_text(
            self._what,
            self._records,
            "records",
            max(now - self._start, 1e-9),
            files=(self._files, self._total),
            share=share,
        )
        if self._line.tty:
            self._line.show(text)
        else:
            _LOGGER.info(text)
