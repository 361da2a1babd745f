"""scan_shards: chunks of a few shards spread over worker processes, one summary per shard."""

from __future__ import annotations

import gzip
import sys
import time
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recordforge.records.chunks import RecordChunk
from recordforge.records.tfrecord import frame_records, read_records
from recordforge.tools import scan
from recordforge.tools.scan import scan_shards


def write_tfrecord(path: Path, records: list[bytes]) -> None:
    framed = frame_records(pa.array(records, pa.binary()))
    path.write_bytes(gzip.compress(b"".join(framed.to_pylist())))


class _Sum:
    def __init__(self) -> None:
        self.records = 0
        self.bytes = 0
        self.chunks = 0

    def add(self, chunk: RecordChunk, shard: str) -> None:
        self.records += len(chunk)
        self.bytes += int(chunk.lengths.sum())
        self.chunks += 1

    def merge(self, other: _Sum) -> None:
        self.records += other.records
        self.bytes += other.bytes
        self.chunks += other.chunks


class _Fails(_Sum):
    def add(self, chunk: RecordChunk, shard: str) -> None:
        raise ValueError("no such feature")


def _shards(tmp_path: Path) -> list[tuple[str, str]]:
    rng = np.random.default_rng(0)
    out = []
    for i, n in enumerate((30_000, 7)):
        path = tmp_path / f"s{i}.tfrecord.gz"
        write_tfrecord(path, [rng.bytes(int(k)) for k in rng.integers(0, 700, n)])
        out.append((str(path), "gzip"))
    return out


def test_chunks_of_few_shards_over_workers(tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    results = scan_shards(shards, _Sum, what="test", workers=3)
    for (path, comp), result in zip(shards, results, strict=True):
        records = [r for _, r in read_records(path, comp)]
        assert result.records == result.acc.records == len(records)
        assert result.acc.bytes == sum(len(r) for r in records)
        assert result.error is None and len(result.sha256) == 64
    assert results[0].acc.chunks >= 2  # a shard of several chunks, merged


def test_no_shards_and_missing_shards_end_the_scan(tmp_path: Path) -> None:
    """The workers are told to end when the last reader is done, also where there is none, or
    where every shard is missing."""
    assert scan_shards([], _Sum, what="test", workers=2) == []
    missing = [(str(tmp_path / "a.tfrecord.gz"), "gzip"), (str(tmp_path / "b.tfrecord.gz"), "gzip")]
    results = scan_shards(missing, _Sum, what="test", workers=3)
    assert [r.missing for r in results] == [True, True]
    assert [r.acc.records for r in results] == [0, 0]


def test_a_failing_worker_stops_the_scan(tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="no such feature"):
        scan_shards(shards, _Fails, what="test", workers=3)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("chunk_bytes", [1 << 10, 50_000, 8 << 20])
def test_chunks_split_into_whole_records(tmp_path: Path, chunk_bytes: int) -> None:
    """Chunks of any size hold whole records: their offsets, first record indices and
    payloads are read_records', and their raw bytes add up to the file's size."""
    from recordforge.records.chunks import read_record_chunks

    path, comp = _shards(tmp_path)[0]
    want = list(read_records(path, comp))
    got, raw = [], 0
    for chunk in read_record_chunks(path, comp, chunk_bytes=chunk_bytes):
        assert chunk.first_record == len(got)
        assert len(chunk.data) <= max(2 * chunk_bytes, 16_000)
        raw += chunk.raw_bytes
        for head, length in zip(chunk.heads.tolist(), chunk.lengths.tolist(), strict=True):
            got.append((chunk.offset + head, chunk.data[head + 12 : head + 12 + length]))
    assert got == want
    assert raw == Path(path).stat().st_size


class _Digest:
    """Every record's payload, by its index in the shard, from the chunks as a worker gets them;
    and whether each came padded (`padded` ends in zeros and starts with the chunk's bytes)."""

    def __init__(self) -> None:
        self.records: dict[int, bytes] = {}
        self.padded = 0
        self.chunks = 0

    def add(self, chunk: RecordChunk, shard: str) -> None:
        data = bytes(chunk.data)
        for k, (head, length) in enumerate(zip(chunk.heads.tolist(), chunk.lengths.tolist(), strict=True)):
            self.records[chunk.first_record + k] = data[head + 12 : head + 12 + length]
        if chunk.padded is not None:
            pad = chunk.padded[len(data) :]
            assert chunk.padded[: len(data)].tobytes() == data and len(pad) >= 128 and not pad.any()
            self.padded += 1
        self.chunks += 1

    def merge(self, other: _Digest) -> None:
        self.records.update(other.records)
        self.padded += other.padded
        self.chunks += other.chunks


def test_chunks_handed_over_in_shared_slots_arrive_whole_however_often_slots_are_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks: many times more chunks than slots, each slot written again only once the
    worker that read it is done; a record too big for a slot travels through the pipe. (Slots are
    shared by forked workers: forked here even where this process has loaded ArrayRecord.)"""
    monkeypatch.setattr(scan, "CHUNK_BYTES", 16 << 10)
    monkeypatch.setattr(scan, "start_method", lambda: "fork")
    rng = np.random.default_rng(3)
    records = [rng.bytes(int(k)) for k in rng.integers(0, 900, 4000)]
    records[1234] = rng.bytes(100_000)  # more than a slot holds
    paths = []
    for i, part in enumerate((records, records[:50])):
        write_tfrecord(tmp_path / f"s{i}.tfrecord.gz", part)
        paths.append((str(tmp_path / f"s{i}.tfrecord.gz"), "gzip"))
    results = scan_shards(paths, _Digest, what="test", workers=3)
    for result, expected in zip(results, (records, records[:50]), strict=True):
        assert result.error is None
        assert [result.acc.records[k] for k in range(len(expected))] == expected
    acc = results[0].acc
    assert acc.chunks > 3 * (3 * 3 + 2)  # far more chunks than slots
    assert 0 < acc.padded < acc.chunks  # the big record's chunk came through the pipe


@pytest.mark.parametrize("workers", [1, 3])
def test_a_scan_without_hashes_counts_the_same_bytes(tmp_path: Path, workers: int) -> None:
    shards = _shards(tmp_path)
    hashed = scan_shards(shards, _Sum, what="test", workers=workers)
    counted = scan_shards(shards, _Sum, what="test", workers=workers, hashed=False)
    for a, b in zip(hashed, counted, strict=True):
        assert len(a.sha256) == 64 and b.sha256 == ""
        assert (a.size, a.records, a.acc.bytes) == (b.size, b.records, b.acc.bytes) and b.size > 0


def test_a_process_that_loaded_a_threaded_native_library_spawns_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child forked after ArrayRecord's (or TensorFlow's) native thread pools ran may inherit
    their locks held: a verify worker forked from a process that had just written ArrayRecord
    shards died in CI. Mutation this catches: `start_method` returning "fork" always."""
    assert "array_record.python.array_record_module" in scan._FORK_UNSAFE_MODULES
    monkeypatch.setattr(scan, "_FORK_UNSAFE_MODULES", ("_recordforge_test_native",))
    assert scan.start_method() == "fork"
    monkeypatch.setitem(sys.modules, "_recordforge_test_native", types.ModuleType("_recordforge_test_native"))
    assert scan.start_method() == "spawn"


@pytest.mark.parametrize("workers", [1, 3])  # a pool of whole shards; chunks over processes
def test_spawned_workers_see_what_forked_ones_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    shards = _shards(tmp_path)
    forked = scan_shards(shards, _Sum, what="test", workers=workers)
    monkeypatch.setattr(scan, "start_method", lambda: "spawn")
    spawned = scan_shards(shards, _Sum, what="test", workers=workers)
    assert [(r.records, r.acc.records, r.acc.bytes, r.sha256) for r in spawned] == [
        (r.records, r.acc.records, r.acc.bytes, r.sha256) for r in forked
    ]
    assert all(len(r.sha256) == 64 and r.error is None for r in spawned)


def test_one_worker_reads_in_this_process_and_finds_what_many_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """workers=1 starts no process (the tools' fuzz harnesses read thousands of bundles so):
    the same records, bytes, sizes and hashes as workers over chunks, and a missing shard and
    an accumulator's error reported as a whole-shard worker reports it. Mutation: dropping the
    in-process path makes the first scan below start a process and fail."""
    shards = _shards(tmp_path) + [(str(tmp_path / "gone.tfrecord.gz"), "gzip")]
    many = scan_shards(shards, _Sum, what="test", workers=3)

    def no_processes(*args: object) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr(scan.multiprocessing, "get_context", no_processes)
    monkeypatch.setattr(scan, "ProcessPoolExecutor", no_processes)
    started: list[bool] = []
    one = scan_shards(shards, _Sum, what="test", workers=1, started=lambda: started.append(True))
    assert started == [True]
    assert [(r.path, r.missing, r.records, r.size, r.sha256) for r in one] == [
        (r.path, r.missing, r.records, r.size, r.sha256) for r in many
    ]
    assert [(r.acc.records, r.acc.bytes) for r in one[:2]] == [(r.acc.records, r.acc.bytes) for r in many[:2]]
    # As a worker reading whole shards reports it: the shard's error, not an exception.
    (failed,) = scan_shards(shards[:1], _Fails, what="test", workers=1)
    assert failed.error is not None and "no such feature" in failed.error


class _Slow(_Sum):
    def add(self, chunk: RecordChunk, shard: str) -> None:
        time.sleep(0.3)
        super().add(chunk, shard)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_recorded_interrupt_ends_the_scan_at_its_next_wait(tmp_path: Path, workers: int) -> None:
    """The command's signal handler only records (recordforge/interrupts.py); the scan's loops
    raise Interrupted at their next wait, its workers ended rather than left to read every queued
    shard: in this process per chunk (1 worker), a pool of whole shards (2 workers, 12 shards),
    chunks over workers (3 workers, 2 shards). Mutation: the `interrupts.check()` of any of the
    three loops removed: that case reads on for seconds, or to the end, and fails."""
    from recordforge import interrupts
    from recordforge.errors import Interrupted

    if workers == 3:
        shards = _shards(tmp_path)
    else:
        shards = []
        for i in range(12):
            path = tmp_path / f"s{i}.tfrecord.gz"
            write_tfrecord(path, [b"x" * 100] * 50)
            shards.append((str(path), "gzip"))
    interrupts.clear()
    try:
        start = time.monotonic()
        with pytest.raises(Interrupted):
            scan_shards(shards, _Slow, what="test", workers=workers, started=lambda: interrupts.record(15))
        assert time.monotonic() - start < 2.0
    finally:
        interrupts.clear()
