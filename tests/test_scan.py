"""scan_shards: chunks of a few shards spread over worker processes, one summary per shard."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recordforge.tfrecord import RecordChunk, frame_records, read_records
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


def test_a_failing_worker_stops_the_scan(tmp_path: Path) -> None:
    shards = _shards(tmp_path)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="no such feature"):
        scan_shards(shards, _Fails, what="test", workers=3)
    assert time.monotonic() - start < 30
