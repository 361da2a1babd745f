"""ReadAhead: a source's items produced a few steps ahead of their consumer, on one thread of its own."""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, wait
from typing import Any, TypeVar

from recordforge import interrupts
from recordforge.tracing.spans import span

__all__ = ["ReadAhead"]

_T = TypeVar("_T")
_END: Any = object()
_Job = tuple[Future, Callable[[], Any]] | None

THREAD_NAME = "recordforge-read-ahead"
# How often a consumer waiting for a step looks for a recorded interrupt: a wait wakes at most
# four times a second, and an interrupt ends it within a quarter of a second.
_CHECK_S = 0.25


def _wait(future: Future) -> None:
    """Waits for `future`, acting on an interrupt recorded meanwhile: a step may take seconds
    (a large row group), and the signal handler only records the signal."""
    while not future.done():
        interrupts.check()
        wait([future], timeout=_CHECK_S)


def _work(jobs: queue.SimpleQueue[_Job]) -> None:
    while (job := jobs.get()) is not None:
        future, step = job
        try:
            with span("read"):
                result = step()
            future.set_result(result)
        except BaseException as exn:  # handed to the consumer, which raises it
            future.set_exception(exn)


class ReadAhead:
    """Iterates iterators `depth` items ahead of their consumer, on one thread: Parquet decoding
    and CSV parsing release the GIL, so the next batch is made while this one is encoded.

    Every iterator given runs on the same thread (started on first use, in the process that uses
    it: a thread does not survive a fork). One thread rather than one per file: an allocator
    keeps a heap per thread, and a thread per file left each one's memory held after it ended.
    Semantics are the consumer's own: items in order, an exception raised after the items made
    before it, and a consumer that stops early (or fails) stops the steps and closes the iterator
    before its generator ends. Pickles without its thread."""

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self._depth = depth
        self._jobs: queue.SimpleQueue[_Job] | None = None
        self._pid = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"_depth": self._depth, "_jobs": None, "_pid": 0}

    def _submit(self, step: Callable[[], Any]) -> Future:
        if self._jobs is None or self._pid != os.getpid():
            jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
            threading.Thread(target=_work, args=(jobs,), name=THREAD_NAME, daemon=True).start()
            weakref.finalize(self, jobs.put, None)  # the thread ends with its owner
            self._jobs, self._pid = jobs, os.getpid()
        future: Future = Future()
        self._jobs.put((future, step))
        return future

    def close(self) -> None:
        """Ends the thread (a later use starts another)."""
        if self._jobs is not None and self._pid == os.getpid():
            self._jobs.put(None)
        self._jobs = None

    def __call__(self, items: Iterator[_T]) -> Iterator[_T]:
        def step() -> Any:
            return next(items, _END)

        pending: deque[Future] = deque(self._submit(step) for _ in range(self._depth))
        stopped: BaseException | None = None
        try:
            while True:
                # A safe point per item: a recorded interrupt is raised here, on the consumer's
                # thread, as its own exception (interrupts.py).
                interrupts.check()
                # Left in `pending` while waited on: an interrupt here leaves its step running.
                if not pending[0].done():
                    with span("wait for input"):
                        _wait(pending[0])
                item = pending[0].result()
                pending.popleft()
                if item is _END:
                    return
                pending.append(self._submit(step))
                yield item
        except BaseException as exn:
            stopped = exn
            raise
        finally:
            self._close_after_steps(items, stopped)

    def _close_after_steps(self, items: Iterator[Any], stopped: BaseException | None) -> None:
        """Closes `items` on its own thread, after the steps already asked of it: a generator
        cannot be closed while a step runs it, and an interrupt (Ctrl-C while the consumer
        waited) leaves one running. An interrupt stays the exception that ends the consumer:
        a failure to close is then not raised in its place."""
        close = getattr(items, "close", None)
        if close is None:
            return
        closing = self._submit(close)
        try:
            closing.result()
        except Exception:
            if stopped is None or isinstance(stopped, Exception | GeneratorExit):
                raise
