"""Shard formats (transforms/shard_format.py) on real files: what each writes, its index, splices
of parts, and failures that leave nothing behind."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recordforge.files import layout
from recordforge.output.shard_files import write_shard
from recordforge.records.array_records import batches
from recordforge.records.shard_format import ArrayRecordFormat, TFRecordFormat
from recordforge.records.tfrecord import describe_shard, read_records


def _records(n: int, seed: int) -> list[bytes]:
    # An empty record, bytes that are not UTF-8, a zero byte, then records of many lengths.
    out = [b"", b"\xff\xfe\x00", b"0"]
    out += [hashlib.sha256(f"{seed}-{i}".encode()).digest() * (i % 9) for i in range(n - 3)]
    return out[:n]


def _array(records: list[bytes]) -> pa.Array:
    return pa.array(records, pa.large_binary())


def _index(path: str) -> list[tuple[int, int]]:
    """What the index must say: each frame's offset and length, as read back from the file."""
    offsets = [offset for offset, _ in read_records(path, "none")]
    return list(zip(offsets, np.diff([*offsets, os.path.getsize(path)]).tolist(), strict=True))


def _listed(path: str) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in Path(layout.temp_index(path)).read_text().splitlines()]


def test_an_index_lists_every_frame_as_written(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    arrays = [_array(_records(50, i)) for i in range(3)]
    temp, segments = write_shard(path, arrays, TFRecordFormat("none", index=True))
    shard = describe_shard(path, "none")
    assert (temp.records, temp.bytes, temp.sha256) == (shard.records, shard.bytes, shard.sha256)
    assert temp.records == 150 and [s.records for s in segments] == [150]
    assert _listed(path) == _index(path) and len(_listed(path)) == 150
    assert [r for _, r in read_records(path, "none")] == [r for a in arrays for r in a.to_pylist()]


def test_a_splice_moves_the_parts_index_lines(tmp_path: Path) -> None:
    fmt = TFRecordFormat("none", index=True)
    parts = []
    for i in range(2):
        writer = fmt.open(str(tmp_path / f"part-{i}"))
        for j in range(3):
            framed = fmt.frame(_array(_records(20, 10 * i + j)))
            writer.write(framed, 0, 20)
            writer.end_segment()
        parts.append(writer.close())
    # The second segment of part 0, then all of part 1: offsets move to where they now start.
    pieces = [(parts[0][0].tmp, parts[0][1][1]), *((parts[1][0].tmp, s) for s in parts[1][1])]
    joined, segments = fmt.splice(str(tmp_path / "joined"), pieces)
    assert joined.records == 80 and len(segments) == 4
    assert _listed(joined.tmp) == _index(joined.tmp)


def test_array_record_splice_takes_records_by_index(tmp_path: Path) -> None:
    fmt = ArrayRecordFormat("zstd")
    records = _records(90, 1)
    writer = fmt.open(str(tmp_path / "part"))
    for start in (0, 30, 60):
        writer.write(fmt.frame(_array(records[start : start + 30])), 0, 30)
        writer.end_segment()
    part, segments = writer.close()
    assert [s.first for s in segments] == [0, 30, 60] and [s.records for s in segments] == [30] * 3
    joined, _ = fmt.splice(str(tmp_path / "joined"), [(part.tmp, segments[2]), (part.tmp, segments[0])])
    got = [r for b in batches(joined.tmp) for r in b]
    assert got == records[60:90] + records[0:30]
    assert joined.bytes == os.path.getsize(joined.tmp)
    assert joined.sha256 == hashlib.sha256(Path(joined.tmp).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "fmt", [TFRecordFormat("none", index=True), ArrayRecordFormat()], ids=["tfrecord", "array_record"]
)
def test_a_failed_write_leaves_no_file(tmp_path: Path, fmt: object) -> None:
    def failing() -> object:
        yield _array(_records(10, 0))
        raise OSError("injected: the source failed mid-shard")

    with pytest.raises(OSError, match="injected"):
        write_shard(str(tmp_path / "shard"), failing(), fmt)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_an_index_needs_uncompressed_shards() -> None:
    with pytest.raises(ValueError, match="uncompressed"):
        TFRecordFormat("gzip", index=True)
    with pytest.raises(ValueError, match="none, zstd"):
        ArrayRecordFormat("gzip")
