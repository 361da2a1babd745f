"""The progress line of a local run: the rows its workers have counted, shown while it converts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from types import TracebackType
from typing import TextIO

from recordforge.progress import counts as progress_counts
from recordforge.progress.line import LiveLine, progress_text

__all__ = ["line", "quiet_watches", "Watch", "watch_threads"]

_LIVE: set[Watch] = set()


def watch_threads() -> set[threading.Thread]:
    """The threads of the watches running in this process."""
    return {w._thread for w in list(_LIVE)}


@contextmanager
def quiet_watches() -> Iterator[None]:
    """No watch is reading counts or writing its line inside this block: each one's mutex is
    held. Between updates a watch's thread only waits on an Event, holding no lock another
    thread could need; so the process may fork here (the local runner's fork server)."""
    with ExitStack() as stack:
        for watch in sorted(_LIVE, key=id):
            stack.enter_context(watch._mutex)
        yield


def line(rows: int, total: int | None, elapsed: float) -> str:
    return progress_text("converting", rows, "rows", elapsed, total=total)


class Watch:
    """Shows the rows counted into `folder` (progress_counts.py) while the block runs: a live line
    on a terminal (rows, share of the total, rows/s, elapsed time, ETA), otherwise a line a minute.
    `total` is called once, on the watcher's thread (it may read Parquet footers), and may return
    None when the total is unknown."""

    def __init__(
        self,
        total: Callable[[], int | None],
        folder: str,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every_s: float | None = None,
    ) -> None:
        self._total_fn = total
        self._folder = folder
        self._line = LiveLine(stream, tty=tty)
        self._every = every_s if every_s is not None else (0.5 if self._line.tty else 60.0)
        self._stop = threading.Event()
        self._mutex = threading.Lock()

    def __enter__(self) -> Watch:
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="recordforge-progress", daemon=True)
        _LIVE.add(self)
        self._thread.start()
        return self

    def rows(self) -> int:
        return progress_counts.total(self._folder)

    def _loop(self) -> None:
        with self._mutex:
            try:
                total = self._total_fn()
            except Exception:  # noqa: BLE001 - a total is a nicety: without one, no share or ETA
                total = None
        while not self._stop.wait(self._every):
            with self._mutex:
                self._line.show(line(self.rows(), total, time.monotonic() - self._start))

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        _LIVE.discard(self)
        self._line.clear()  # the summary follows on a clean line
