"""Every record of a set of shards through a per-chunk function, on all cores, in bounded memory.

Many shards: each worker process reads whole shards. Fewer shards than workers (one large GZIP
shard, say): threads of this process read, hash and inflate them (isal and hashlib run without
the GIL) and hand chunks of records to the worker processes. Either way a chunk's records are
CRC-checked and decoded where they are used, and progress counts records as chunks finish.
"""

from __future__ import annotations

import multiprocessing
import os
import posixpath
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol

from recordforge.storage import exists
from recordforge.tfrecord import CorruptRecord, FileDigest, RecordChunk, read_record_chunks
from recordforge.tools.progress import Progress

__all__ = ["Accumulator", "ShardResult", "scan_shards"]


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


_COUNTERS: Any = None  # (records, raw bytes) shared with the worker processes


def _init(counters: Any) -> None:
    global _COUNTERS
    _COUNTERS = counters


def _count(records: int, raw: int) -> None:
    if _COUNTERS is not None:
        with _COUNTERS.get_lock():
            _COUNTERS[0] += records
            _COUNTERS[1] += raw


def _read(path: str, compression: str, each: Callable[[RecordChunk], None]) -> ShardResult:
    result = ShardResult(path)
    if not exists(path):
        result.missing = True
        return result
    digest = FileDigest()
    try:
        for chunk in read_record_chunks(path, compression, on_raw=digest):
            result.records += len(chunk)
            each(chunk)
    except CorruptRecord as exn:
        result.error, result.error_offset = exn.what, exn.offset
    except Exception as exn:  # a non-gzip stream, an unreadable file
        result.error = f"cannot be read as {compression}: {exn}"
    result.size, result.sha256 = digest.size, digest.hexdigest()
    return result


def _whole_shard(path: str, compression: str, make: Callable[[], Accumulator]) -> ShardResult:
    acc = make()
    name = posixpath.basename(path)

    def each(chunk: RecordChunk) -> None:
        acc.add(chunk, name)
        _count(len(chunk), chunk.raw_bytes)

    result = _read(path, compression, each)
    result.acc = acc
    return result


def _one_chunk(chunk: RecordChunk, name: str, make: Callable[[], Accumulator]) -> Accumulator:
    acc = make()
    acc.add(chunk, name)
    return acc


def scan_shards(
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    *,
    what: str,
    total_bytes: int | None = None,
    workers: int | None = None,
) -> list[ShardResult]:
    """(path, compression) shards through `make()`'s accumulators, merged per shard."""
    workers = workers or os.cpu_count() or 1
    progress = Progress(what, len(shards), total_bytes=total_bytes)
    context = multiprocessing.get_context(
        "fork" if "fork" in multiprocessing.get_all_start_methods() else None
    )
    counters = context.Array("q", 2)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_init, initargs=(counters,)) as pool:
        if len(shards) >= workers:
            results = _by_shard(pool, shards, make, progress, counters)
        else:
            results = _by_chunk(pool, shards, make, progress, workers)
    progress.done()
    return results


def _by_shard(
    pool: ProcessPoolExecutor,
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    progress: Progress,
    counters: Any,
) -> list[ShardResult]:
    futures = {pool.submit(_whole_shard, path, comp, make): i for i, (path, comp) in enumerate(shards)}
    results: list[ShardResult | None] = [None] * len(shards)
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
        for f in done:
            results[futures[f]] = f.result()
        progress.set(files=sum(r is not None for r in results), records=counters[0], raw=counters[1])
    return [r for r in results if r is not None]


def _by_chunk(
    pool: ProcessPoolExecutor,
    shards: list[tuple[str, str]],
    make: Callable[[], Accumulator],
    progress: Progress,
    workers: int,
) -> list[ShardResult]:
    lock = threading.Lock()
    in_flight = threading.BoundedSemaphore(2 * workers)  # chunks read but not yet processed
    results: list[ShardResult] = [ShardResult(path) for path, _ in shards]
    accs: list[list[Future]] = [[] for _ in shards]
    state = {"records": 0, "raw": 0, "files": 0}

    def finished(f: Future, chunk_records: int, raw: int) -> None:
        in_flight.release()
        with lock:
            state["records"] += chunk_records
            state["raw"] += raw

    def reader(i: int) -> None:
        path, compression = shards[i]
        name = posixpath.basename(path)

        def each(chunk: RecordChunk) -> None:
            in_flight.acquire()
            f = pool.submit(_one_chunk, chunk, name, make)
            n, raw = len(chunk), chunk.raw_bytes
            f.add_done_callback(lambda f: finished(f, n, raw))
            accs[i].append(f)

        results[i] = _read(path, compression, each)
        with lock:
            state["files"] += 1

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(len(shards))]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.25)
            with lock:
                progress.set(files=state["files"], records=state["records"], raw=state["raw"])
    for i, futures in enumerate(accs):
        acc = make()
        for f in futures:
            acc.merge(f.result())
        results[i].acc = acc
    with lock:
        progress.set(files=len(shards), records=state["records"], raw=state["raw"])
    return results
