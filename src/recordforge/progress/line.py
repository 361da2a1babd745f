"""The one progress line: its text (count, share, rate, elapsed, ETA) and a terminal's line in place."""

from __future__ import annotations

import sys
from typing import TextIO

__all__ = ["LiveLine", "clock", "progress_text"]


def clock(seconds: float) -> str:
    """m:ss, or h:mm:ss from an hour."""
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def progress_text(
    what: str,
    done: int,
    unit: str,
    elapsed: float,
    *,
    total: int | None = None,
    files: tuple[int, int] | None = None,
    share: float | None = None,
) -> str:
    """ "what: 250,000 rows of 1,000,000 (25%), 125,000 rows/s, 0:02 elapsed, ETA 0:06": `done`
    of `total` units; `files` (done, all) where work comes in files; the ETA from the share of
    `total` done, else from `share` (of bytes read, say), else none."""
    rate = done / elapsed if elapsed > 0 else 0.0
    text = f"{what}: {done:,} {unit}"
    if total:
        text += f" of {total:,} ({min(done / total, 1.0):.0%})"
    if files is not None:
        text += f", {files[0]}/{files[1]} files"
    text += f", {rate:,.0f} {unit}/s, {clock(elapsed)} elapsed"
    if total and rate > 0 and done < total:
        text += f", ETA {clock((total - done) / rate)}"
    elif not total and share is not None and 0 < share < 1:
        text += f", ETA {clock(elapsed * (1 - share) / share)}"
    return text


class LiveLine:
    """A line a terminal shows in place: each text replaces the last; a stream that is not a
    terminal gets one line per text."""

    def __init__(self, stream: TextIO | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._shown = 0

    def show(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r" + text.ljust(self._shown))
            self._shown = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Nothing left on the terminal's line, so that what follows starts on a clean one."""
        if self.tty and self._shown:
            self.stream.write("\r" + " " * self._shown + "\r")
            self.stream.flush()
            self._shown = 0
