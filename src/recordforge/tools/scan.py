"""Every record of a set of shards through a per-chunk function, on all cores, in bounded memory."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing
import os
import posixpath
import queue
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from recordforge import interrupts
from recordforge.errors import CorruptFile
from recordforge.files.storage import exists
from recordforge.progress.scan import Progress
from recordforge.records.chunks import RecordChunk, read_record_chunks
from recordforge.records.tfrecord import CorruptRecord, FileDigest
from recordforge.records.wire import PAD

__all__ = ["Accumulator", "ShardResult", "malloc_keeps_memory", "scan_shards", "start_method"]


class Accumulator(Protocol):
    def add(self, chunk: RecordChunk, shard: str) -> None: ...

    def merge(self, other: Any) -> None: ...


@dataclass
class ShardResult:
    path: str
    missing: bool = False
    records: int = 0
    size: int = 0
    sha256: str = ""
    error: str | None = None  # what stopped the reading (a corrupt frame, a bad stream)
    error_offset: int | None = None
    acc: Any = None
    extra: dict[str, Any] = field(default_factory=dict)


# Bytes of records per batch: few enough that a batch's numpy arrays stay in the CPU's cache,
# enough that the per-batch work is spread over thousands of records.
CHUNK_BYTES = 2 << 20
_COUNTERS: Any = None  # (records, raw bytes) shared with the worker processes


def _init(counters: Any) -> None:
    global _COUNTERS
    _COUNTERS = counters


def _count(records: int, raw: int) -> None:
    if _COUNTERS is not None:
        with _COUNTERS.get_lock():
            _COUNTERS[0] += records
            _COUNTERS[1] += raw


def _read(path: str, compression: str, each: Callable[[RecordChunk], None], hashed: bool) -> ShardResult:
    result = ShardResult(path)
    if not exists(path):
        result.missing = True
        return result
    digest = FileDigest(hashed)
    aside = _HashedAside(digest) if hashed else None
    try:
        on_raw = aside if aside is not None else digest
        for chunk in read_record_chunks(path, compression, on_raw=on_raw, chunk_bytes=CHUNK_BYTES):
            result.records += len(chunk)
            each(chunk)
    except CorruptRecord as exn:
        result.error, result.error_offset = exn.what, exn.offset
    except CorruptFile as exn:  # an ArrayRecord file riegeli refuses
        result.error = exn.what
    except Exception as exn:  # a non-gzip stream, an unreadable file
        result.error = f"cannot be read as {compression}: {exn}"
    finally:
        if aside is not None:
            aside.finish()
    result.size, result.sha256 = digest.size, digest.hexdigest()
    return result


class _HashedAside:
    """A FileDigest fed by a thread of its own, so that the thread reading a shard (inflating
    it: the one thing a shard's reading cannot share) goes on while its bytes are hashed."""

    def __init__(self, digest: FileDigest) -> None:
        self.digest = digest
        self.pieces: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (raw := self.pieces.get()) is not None:
            self.digest(raw)

    def __call__(self, raw: bytes) -> None:
        # A view of a buffer its reader may reuse is copied: the hash comes later.
        self.pieces.put(raw if isinstance(raw, bytes) else bytes(raw))

    def finish(self) -> None:
        self.pieces.put(None)
        self.thread.join()


def _whole_shard(
    path: str, compression: str, make: Callable[[], Accumulator], hashed: bool, checked: bool = False
) -> ShardResult:
    acc = make()
    name = posixpath.basename(path)

    def each(chunk: RecordChunk) -> None:
        if checked:  # read in the command's own process: a safe point per chunk
            interrupts.check()
        acc.add(chunk, name)
        _count(len(chunk), chunk.raw_bytes)

    result = _read(path, compression, each, hashed)
    result.acc = acc
    return result


def scan_shards(
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    *,
    what: str,
    total_bytes: int | None = None,
    workers: int | None = None,
    hashed: bool = True,
    started: Callable[[], None] | None = None,
) -> list[ShardResult]:
    """(path, compression) shards through `make()`'s accumulators, merged per shard; each shard's
    size, and with `hashed` its sha256 (the reading of a shard is one thread's, so a caller that
    needs no sha256 saves it there). `started` is called once every worker process is forked: a
    thread of the caller's started then is not copied, mid-work, into a child."""
    workers = workers or os.cpu_count() or 1
    progress = Progress(what, len(shards), total_bytes=total_bytes)
    if workers == 1:
        results = _in_this_process(shards, make, progress, hashed, started)
        progress.done()
        return results
    context = multiprocessing.get_context(start_method())
    counters = context.Array("q", 2)
    if len(shards) >= workers:
        with ProcessPoolExecutor(
            workers, mp_context=context, initializer=_init, initargs=(counters,)
        ) as pool:
            results = _by_shard(pool, shards, make, progress, counters, hashed, started)
    else:
        results = _by_chunk(context, shards, make, progress, workers, counters, hashed, started)
    progress.done()
    return results


def _in_this_process(
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    progress: Progress,
    hashed: bool,
    started: Callable[[], None] | None,
) -> list[ShardResult]:
    """One worker: the shards read here, one after another, as a worker process would read them
    (a process of its own would only add its start-up and the pickling of every result)."""
    global _COUNTERS
    if started is not None:
        started()
    before, _COUNTERS = _COUNTERS, multiprocessing.Array("q", 2)
    counters = _COUNTERS
    try:
        results = []
        for path, compression in shards:
            results.append(_whole_shard(path, compression, make, hashed, checked=True))
            progress.set(files=len(results), records=counters[0], raw=counters[1])
        return results
    finally:
        _COUNTERS = before


# Native libraries that run thread pools of their own once used: a process forked after them
# may inherit a pool's lock held by a thread the child does not have (a verify worker forked from
# a process that had just written ArrayRecord shards died in CI, once in thousands of runs).
_FORK_UNSAFE_MODULES = ("array_record.python.array_record_module", "tensorflow")


def start_method() -> str | None:
    """ "fork" (the workers start at once and share the chunk buffers), unless this process has
    loaded a library whose threads a forked child cannot use: then "spawn" (fresh interpreters).
    None: the platform's default, where it cannot fork."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return "spawn" if any(m in sys.modules for m in _FORK_UNSAFE_MODULES) else "fork"


def _by_shard(
    pool: ProcessPoolExecutor,
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    progress: Progress,
    counters: Any,
    hashed: bool,
    started: Callable[[], None] | None = None,
) -> list[ShardResult]:
    # A fork-context pool forks all its processes at the first submit.
    futures = {
        pool.submit(_whole_shard, path, comp, make, hashed): i for i, (path, comp) in enumerate(shards)
    }
    if started is not None:
        started()
    results: list[ShardResult | None] = [None] * len(shards)
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for f in done:
                results[futures[f]] = f.result()
            progress.set(files=sum(r is not None for r in results), records=counters[0], raw=counters[1])
            interrupts.check()
    except BaseException:
        # Ended now, not after every queued shard (the pool's exit would wait for them all):
        # the pool, broken, fails the shards not read (cancelling them too races its thread).
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        raise
    return [r for r in results if r is not None]


class _Slots:
    """Buffers in memory shared with the forked worker processes (an anonymous shared mapping
    made before they are forked), through which a chunk's bytes are handed over: written once
    by the reader, read in place by the worker, with the zero bytes after them that decoding
    needs. A pipe would copy them four times (pickled, written, read, unpickled), and the
    worker once more to pad them. A slot is taken from `free` (so at most `count` chunks are in
    flight) and put back by the worker once its accumulator has seen the chunk; accumulators
    keep copies of what they keep, never views of a chunk's bytes."""

    def __init__(self, context: Any, count: int, size: int) -> None:
        self.size = size
        self.memory = mmap.mmap(-1, count * size)  # MAP_SHARED: the same pages in the workers
        self.free = context.Queue()
        for slot in range(count):
            self.free.put(slot)

    def fits(self, chunk: RecordChunk) -> bool:
        return len(chunk.data) + PAD <= self.size

    def put(self, slot: int, chunk: RecordChunk) -> _InSlot:
        at, n = slot * self.size, len(chunk.data)
        self.memory[at : at + n] = chunk.data
        self.memory[at + n : at + n + PAD] = bytes(PAD)
        return _InSlot(slot, n, replace(chunk, data=b""))

    def open(self, held: _InSlot) -> RecordChunk:
        at = held.slot * self.size
        padded = np.frombuffer(self.memory, np.uint8, held.size + PAD, at)
        return replace(held.chunk, data=memoryview(self.memory)[at : at + held.size], padded=padded)


@dataclass(frozen=True)
class _InSlot:
    """A chunk whose bytes wait in a slot (`_Slots`): the rest of it travels as usual."""

    slot: int
    size: int
    chunk: RecordChunk


def _chunk_worker(
    inbox: Any, outbox: Any, make: Callable[[], Accumulator], counters: Any, slots: _Slots | None = None
) -> None:
    """A worker process of _by_chunk: one accumulator per shard for every chunk it is handed,
    sent back once at the end (a fresh accumulator per chunk would send back, and have the
    parent merge, a whole summary per chunk: a stats sample alone is 20,000 values a feature)."""
    _init(counters)
    _malloc_keeps_memory()
    accs: dict[int, Accumulator] = {}
    try:
        while (item := inbox.get()) is not None:
            i, name, chunk = item
            held = None
            if isinstance(chunk, _InSlot):
                assert slots is not None
                held, chunk = chunk.slot, slots.open(chunk)
            if i not in accs:
                accs[i] = make()
            accs[i].add(chunk, name)
            _count(len(chunk), chunk.raw_bytes)
            if held is not None and slots is not None:
                del chunk  # its views of the slot go before the slot is handed out again
                slots.free.put(held)
        outbox.put((True, accs))
    except BaseException as exn:  # the parent raises it; a worker must not die silently
        outbox.put((False, f"{type(exn).__name__}: {exn}\n{traceback.format_exc()}"))


def _malloc_keeps_memory(threshold: int = 1 << 30) -> None:
    """Large numpy arrays come from glibc's heap and are reused, instead of each being mapped
    and unmapped (a page fault per 4 KiB every time a chunk's arrays are made). Only in the
    worker processes, whose peak is a few chunks' arrays; elsewhere (not glibc) a no-op."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, threshold)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def malloc_keeps_memory() -> Iterator[None]:
    """`_malloc_keeps_memory` in this process while the block runs (a reading thread's chunk
    buffers and a writing thread's batches reused, not mapped afresh: half the system time of an
    export's main process), then glibc's default thresholds (128 KiB) and the heap trimmed."""
    _malloc_keeps_memory()
    try:
        yield
    finally:
        _malloc_keeps_memory(128 << 10)
        try:
            ctypes.CDLL(None).malloc_trim(0)
        except (OSError, AttributeError):
            pass


def _by_chunk(
    context: Any,
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    progress: Progress,
    workers: int,
    counters: Any,
    hashed: bool,
    started: Callable[[], None] | None = None,
) -> list[ShardResult]:
    """Threads of this process read the shards and hand chunks to `workers` processes through
    one bounded queue (at most two chunks waiting per worker: bounded memory)."""
    inbox, outbox = context.Queue(2 * workers), context.Queue()
    # A chunk waiting in the queue or being read by each worker, and one being filled per reader.
    slots = (
        _Slots(context, 3 * workers + len(shards), CHUNK_BYTES * 3 // 2 + PAD)
        if context.get_start_method() == "fork"
        else None
    )
    procs = [
        context.Process(target=_chunk_worker, args=(inbox, outbox, make, counters, slots), daemon=True)
        for _ in range(workers)
    ]
    for proc in procs:
        proc.start()
    if started is not None:
        started()
    results: list[ShardResult] = [ShardResult(path) for path, _ in shards]
    failed: list[str] = []

    def hand(item: Any) -> None:
        if item is not None and slots is not None and slots.fits(item[2]):
            item = (item[0], item[1], slots.put(free_slot(), item[2]))
        elif item is not None:  # through the pipe: pickled, so its bytes and not a view of them
            item = (item[0], item[1], replace(item[2], data=bytes(item[2].data)))
        while True:
            if failed:
                raise RuntimeError("stopped: the scan failed elsewhere")
            try:
                inbox.put(item, timeout=0.25)
                return
            except queue.Full:
                continue

    def free_slot() -> int:
        assert slots is not None
        while True:
            if failed:
                raise RuntimeError("stopped: the scan failed elsewhere")
            try:
                return int(slots.free.get(timeout=0.25))
            except queue.Empty:
                continue

    reading = [len(shards)]
    lock = threading.Lock()

    def reader(i: int) -> None:
        path, compression = shards[i]
        name = posixpath.basename(path)
        try:
            results[i] = _read(path, compression, lambda chunk: hand((i, name, chunk)), hashed)
        finally:
            with lock:
                reading[0] -= 1
                last = not reading[0]
            if last:
                end()

    def end() -> None:
        """Every chunk is queued: one end mark per worker, as soon as the last reader is done."""
        try:
            for _ in procs:
                hand(None)
        except RuntimeError:
            pass  # the scan failed: the workers are stopped instead

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(len(shards))]
    for t in threads:
        t.start()
    if not threads:
        end()
    merged: dict[int, Accumulator] = {}
    answered = 0
    try:
        while answered < workers:
            try:
                ok, payload = outbox.get(timeout=0.25)
            except queue.Empty:
                interrupts.check()
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError("a worker process died") from None
                done = sum(not t.is_alive() for t in threads)
                progress.set(files=done, records=counters[0], raw=counters[1])
                continue
            answered += 1
            if not ok:
                raise RuntimeError(f"failed in a worker process: {payload}")
            for i, acc in payload.items():
                if i in merged:
                    merged[i].merge(acc)
                else:
                    merged[i] = acc
    finally:
        failed.append("stop")  # readers still waiting to hand a chunk give up
        for proc in procs:
            if answered < workers:  # an error: the others wait for chunks that will not come
                proc.terminate()
            proc.join()
        if answered < workers:
            # Chunks still buffered for workers that are gone: the queue's feeder thread would
            # wait to write them at the process's exit, for ever.
            inbox.cancel_join_thread()
        for t in threads:
            t.join()
    for i, result in enumerate(results):
        result.acc = merged[i] if i in merged else make()
    progress.set(files=len(shards), records=counters[0], raw=counters[1])
    return results
