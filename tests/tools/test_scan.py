"""scan_shards: chunks of a few shards spread over worker processes, one summary per shard."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recordforge.record_chunks import RecordChunk
from recordforge.tfrecord import frame_records, read_records
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
    from recordforge.record_chunks import read_record_chunks

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
