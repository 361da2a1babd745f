"""ReadAhead: a source's items produced a few steps ahead of their consumer, on one thread of its own."""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future, wait
from typing import Any, TypeVar

__all__ = ["ReadAhead"]

_T = TypeVar("_T")
_END: Any = object()
_Job = Callable[[], None] | None

THREAD_NAME = "recordforge-read-ahead"


def _work(jobs: queue.SimpleQueue[_Job]) -> None:
    while (job := jobs.get()) is not None:
        job()


def _run(future: Future, step: Callable[[], Any]) -> None:
    try:
        future.set_result(step())
    except BaseException as exn:  # handed to the consumer, which raises it
        future.set_exception(exn)


def _close(items: Iterator[Any]) -> None:
    close = getattr(items, "close", None)
    if close is not None:
        close()


class _Next:
    """An iterator its consumer said it reads next (`then`): its first step runs on the read-ahead
    thread as soon as the iterator before it ends, while the consumer still works on that one's
    last items, unless the consumer took it back first."""

    def __init__(self, key: Hashable, items: Iterator[Any]) -> None:
        self.key, self.items = key, items
        self._lock = threading.Lock()
        self._first: Future | None = None
        self._taken = False

    def start(self) -> None:  # on the read-ahead thread
        with self._lock:
            if self._taken or self._first is not None:  # taken back, or started by an earlier step
                return
            self._first = first = Future[Any]()
        _run(first, lambda: next(self.items, _END))

    def take(self) -> Future | None:
        """Its first step's future; None when it had not started (and now never will)."""
        with self._lock:
            self._taken = True
            return self._first

    def drop(self) -> None:
        first = self.take()
        if first is not None:
            wait([first])  # a generator cannot be closed while a step runs it
        _close(self.items)


class ReadAhead:
    """Iterates iterators `depth` items ahead of their consumer, on one thread: Parquet decoding
    and CSV parsing release the GIL, so the next batch is made while this one is encoded.

    Every iterator given runs on the same thread (started on first use, in the process that uses
    it: a thread does not survive a fork). One thread rather than one per file: an allocator
    keeps a heap per thread, and a thread per file left each one's memory held after it ended.
    Semantics are the consumer's own: items in order, an exception raised after the items made
    before it, and a consumer that stops early (or fails) stops the steps and closes the iterator
    before its generator ends. A consumer that knows which iterator it reads next names it
    (`then`), so that the thread does not sit idle between the two. Pickles without its thread."""

    def __init__(self, depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, not {depth}")
        self._depth = depth
        self._jobs: queue.SimpleQueue[_Job] | None = None
        self._pid = 0
        self._next: _Next | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"_depth": self._depth, "_jobs": None, "_pid": 0, "_next": None}

    def _queue(self) -> queue.SimpleQueue[_Job]:
        if self._jobs is None or self._pid != os.getpid():
            jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
            threading.Thread(target=_work, args=(jobs,), name=THREAD_NAME, daemon=True).start()
            weakref.finalize(self, jobs.put, None)  # the thread ends with its owner
            self._jobs, self._pid = jobs, os.getpid()
        return self._jobs

    def _submit(self, step: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._queue().put(lambda: _run(future, step))
        return future

    def _drop_next(self) -> None:
        expected, self._next = self._next, None
        if expected is not None:
            expected.drop()

    def close(self) -> None:
        """Ends the thread (a later use starts another)."""
        if self._pid == os.getpid():
            self._drop_next()
            if self._jobs is not None:
                self._jobs.put(None)
        self._jobs, self._next = None, None

    def __call__(
        self, items: Iterator[_T], *, key: Hashable = None, then: tuple[Hashable, Iterator[Any]] | None = None
    ) -> Iterator[_T]:
        """`items`, read ahead. `key` names them: where the previous call's `then` named the same
        key, its iterator (already started) is read instead and `items` is closed unread.
        `then`: (key, iterator) of what the consumer reads next, once these end."""
        if self._pid != os.getpid():
            self._next = None  # a parent's: its thread is not in this process
        pending: deque[Future] = deque()
        expected, self._next = self._next, None
        if expected is not None and key is not None and expected.key == key:
            _close(items)
            items = expected.items
            first = expected.take()
            if first is not None:
                pending.append(first)
        elif expected is not None:
            expected.drop()
        after = _Next(*then) if then is not None else None
        jobs = self._queue()

        def step() -> Any:
            item = next(items, _END)
            if item is _END and after is not None:
                jobs.put(after.start)  # runs once this step's result is handed over
            return item

        pending.extend(self._submit(step) for _ in range(self._depth - len(pending)))
        ended = False
        try:
            while True:
                item = pending.popleft().result()
                if item is _END:
                    ended = True
                    return
                pending.append(self._submit(step))
                yield item
        finally:
            wait(pending)  # a generator cannot be closed while a step runs it
            _close(items)
            if after is not None:
                if ended:
                    self._next = after
                else:
                    after.drop()
