"""Segmented streams and joined shards: every file is one valid gzip/zlib stream, checked by
zlib's own checksums and read back by tf.data; joining by bytes copies compressed segments."""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from recordforge.streams import HashingFile, StreamWriter, combine_checks, splice
from recordforge.tfrecord import frame_records, iter_records
from recordforge.transforms.rolling import (
    FULL_FRACTION,
    Limits,
    _join,
    _plan,
    _publish,
    _Roller,
    _RollingWriteFn,
)


def _records(n: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    # Compressible and varied: words from a small vocabulary, some random bytes, varied lengths.
    words = [b"alpha", b"beta", b"gamma", b"delta", b"epsilon"]
    return [
        b" ".join(rng.choice(words) for _ in range(rng.randint(0, 60))) + rng.randbytes(rng.randint(0, 20))
        for _ in range(n)
    ]


def _framed(records: list[bytes]) -> bytes:
    return b"".join(frame_records(pa.array(records, pa.large_binary())).to_pylist())


def _decode(path: Path, compression: str) -> bytes:
    data = path.read_bytes()
    if compression == "gzip":
        return gzip.decompress(data)  # checks CRC-32 and length; rejects trailing garbage
    if compression == "zlib":
        d = zlib.decompressobj()
        out = d.decompress(data)
        assert d.eof and not d.unused_data  # one stream, Adler-32 checked
        return out
    return data


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_checksums_combine_like_the_joined_bytes(compression: str) -> None:
    rng = random.Random(1)
    check = zlib.crc32 if compression == "gzip" else zlib.adler32
    for _ in range(200):
        a, b = os.urandom(rng.randint(0, 3000)), os.urandom(rng.randint(0, 3000))
        assert combine_checks(compression, check(a), check(b), len(b)) == check(a + b)


def _write(path: Path, compression: str, chunks: list[list[bytes]], *, segment_every: int = 1) -> tuple:
    writer = StreamWriter(HashingFile(open(path, "wb")), compression, 1)  # noqa: SIM115 - closed by close()
    for i, chunk in enumerate(chunks):
        writer.write(_framed(chunk), len(chunk))
        if (i + 1) % segment_every == 0:
            writer.end_segment()
    return writer.close()


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_a_written_stream_is_one_valid_stream_and_its_segments_decode_alone(
    tmp_path: Path, compression: str
) -> None:
    chunks = [_records(300, seed) for seed in range(6)]
    path = tmp_path / "a"
    segments = _write(path, compression, chunks, segment_every=2)
    assert len(segments) == 3 and [s.records for s in segments] == [600] * 3
    assert _decode(path, compression) == b"".join(_framed(c) for c in chunks)
    data = path.read_bytes()
    for i, seg in enumerate(segments):
        body = data[seg.start : seg.end]
        expected = _framed(chunks[2 * i]) + _framed(chunks[2 * i + 1])
        raw = zlib.decompressobj(-15).decompress(body) if compression != "none" else body
        assert raw == expected and seg.raw == len(expected)


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_spliced_segments_of_several_files_are_one_valid_stream(tmp_path: Path, compression: str) -> None:
    files = []
    for f in range(3):
        chunks = [_records(200, 10 * f + k) for k in range(4)]
        path = tmp_path / f"p{f}"
        files.append((path, chunks, _write(path, compression, chunks)))
    # A file's tail, a whole file, another's head: in that order.
    pieces = [(files[0], 2), (files[0], 3), (files[1], 0), (files[1], 1), (files[1], 2), (files[1], 3)]
    pieces += [(files[2], 0)]
    out = tmp_path / "joined"
    records, size, sha, segments = splice(
        str(out), compression, [(str(p), segs[i]) for (p, _, segs), i in pieces]
    )
    expected = b"".join(_framed(chunks[i]) for (_, chunks, _), i in pieces)
    assert _decode(out, compression) == expected
    assert records == 200 * len(pieces) and size == out.stat().st_size and len(segments) == len(pieces)
    assert sha == hashlib.sha256(out.read_bytes()).hexdigest()
    # The joined file's own segments can be spliced again.
    again = tmp_path / "again"
    splice(str(again), compression, [(str(out), segments[-1]), (str(out), segments[0])])
    assert _decode(again, compression) == _framed(files[2][1][0]) + _framed(files[0][1][2])


def _bundles(tmp: Path, sizes: list[int], limits: Limits, compression: str) -> tuple[list, list[bytes]]:
    """Parts as a runner with bundles of `sizes` batches of 100 records would leave them."""
    parts, everything, key = [], [], 0
    for bundle in sizes:
        roller = _Roller(str(tmp), compression, 1, limits)
        for _ in range(bundle):
            batch = _records(100, key)
            everything += batch
            parts += roller.add((key,), pa.array(batch, pa.large_binary()))
            key += 1
        last = roller.close()
        parts += [last] if last else []
    return parts, everything


def _shards(tmp_path: Path, sizes: list[int], limits: Limits, compression: str = "gzip") -> tuple[list, list]:
    tmp = tmp_path / "_tmp"
    tmp.mkdir()
    parts, everything = _bundles(tmp, sizes, limits, compression)
    joined = [_join(j, str(tmp), compression, 1, limits) for j in _plan(b"", parts, limits)]
    shards = _publish(b"", parts, joined, str(tmp_path / "data"), ".tfrecord.gz", str(tmp), limits)
    assert not tmp.exists()
    written = [r for s in shards for r in iter_records(s.path, compression, check_crc=True)]
    assert sorted(written) == sorted(everything)  # nothing lost, nothing twice
    for s in shards:
        assert s.records == sum(1 for _ in iter_records(s.path, compression))
        assert s.bytes == os.path.getsize(s.path)
    return shards, parts


def test_many_small_bundles_make_shards_of_the_target_size(tmp_path: Path) -> None:
    limits = Limits(max_bytes=60_000, max_records=0)
    shards, parts = _shards(tmp_path, [1, 2, 1, 3, 1, 1, 2, 1, 4, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1], limits)
    assert len(parts) > 3 * len(shards)
    short = [s.bytes for s in shards if not FULL_FRACTION * 60_000 <= s.bytes <= 1.25 * 60_000]
    assert len(short) <= 1 and all(b < 60_000 for b in short), [s.bytes for s in shards]
    for s in shards:
        gzip.decompress(Path(s.path).read_bytes())  # one valid member, checksums right


def test_large_bundles_keep_their_full_parts_untouched(tmp_path: Path) -> None:
    limits = Limits(max_bytes=40_000, max_records=0)
    shards, parts = _shards(tmp_path, [12, 12], limits)
    full = {p.sha256 for p in parts if limits.full(p.records, p.bytes)}
    assert full and full <= {s.sha256 for s in shards}
    assert sum(1 for s in shards if s.bytes < FULL_FRACTION * 40_000) <= 1


def test_joining_by_records_is_exact(tmp_path: Path) -> None:
    limits = Limits(max_bytes=10**9, max_records=250)
    shards, parts = _shards(tmp_path, [1, 1, 2, 1, 3, 1], limits)
    counts = sorted(s.records for s in shards)
    assert counts[1:] == [250] * (len(counts) - 1) and sum(counts) == 900


def test_joined_shards_are_read_by_tf_data(tmp_path: Path) -> None:
    import tensorflow as tf

    limits = Limits(max_bytes=30_000, max_records=0)
    shards, _ = _shards(tmp_path, [1, 1, 1, 1, 1, 1], limits)
    for s in shards:
        got = [r.numpy() for r in tf.data.TFRecordDataset(s.path, compression_type="GZIP")]
        assert got == list(iter_records(s.path, "gzip", check_crc=True))


def _attempt(fn: _RollingWriteFn, batches: list[tuple]) -> list:
    """One bundle attempt: what a runner would commit if this attempt succeeded."""
    fn.start_bundle()
    out = [p for b in batches for p in fn.process(b)]
    return out + [w.value for w in fn.finish_bundle()]


def test_a_bundle_or_a_join_run_twice_writes_each_record_once(tmp_path: Path) -> None:
    limits = Limits(max_bytes=25_000, max_records=0)
    tmp = tmp_path / "_tmp"
    tmp.mkdir()
    fn = _RollingWriteFn(str(tmp), "gzip", 1, limits)
    bundles = [
        [((k,), pa.array(_records(100, k), pa.large_binary())) for k in range(b, b + 2)] for b in (0, 2, 4)
    ]
    parts = []
    for batches in bundles:
        _attempt(fn, batches)  # an attempt that failed after writing: its outputs are discarded
        parts += _attempt(fn, batches)  # the retry the runner commits
    joins = list(_plan(b"", parts, limits))
    assert joins
    for j in joins:
        _join(j, str(tmp), "gzip", 1, limits)  # a join attempt whose result is lost
    joined = [_join(j, str(tmp), "gzip", 1, limits) for j in joins]
    shards = _publish(b"", parts, joined, str(tmp_path / "data"), ".tfrecord.gz", str(tmp), limits)
    again = _publish(b"", parts, joined, str(tmp_path / "data"), ".tfrecord.gz", str(tmp), limits)
    assert shards == again and not tmp.exists()  # the orphans of failed attempts went with it
    written = sorted(r for s in shards for r in iter_records(s.path, "gzip", check_crc=True))
    assert written == sorted(r for k in range(6) for r in _records(100, k))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(s.path).name for s in shards)


@pytest.mark.parametrize("count", [2, 3, 40])
def test_a_fixed_count_is_that_many_shards_in_input_order_within_a_segment_of_each_other(
    tmp_path: Path, count: int
) -> None:
    limits = Limits(max_bytes=0, max_records=0, num_shards=count)
    shards, parts = _shards(tmp_path, [3, 1, 2, 5, 1], limits)
    assert len(parts) == 5 and len(shards) == count
    assert [Path(s.path).name for s in shards] == [
        f"data-{i:05d}-of-{count:05d}.tfrecord.gz" for i in range(count)
    ]
    # Read in name order, the shards are the input in order; empty shards (more shards than
    # segments) come last.
    everything = [r for key in range(12) for r in _records(100, key)]  # as _bundles made them
    assert [r for s in shards for r in iter_records(s.path, "gzip")] == everything
    filled = [s for s in shards if s.records]
    assert all(s.records for s in shards[: len(filled)])
    segment = max(seg.bytes for p in parts for seg in p.segments)
    sizes = [s.bytes for s in filled]
    assert max(sizes) - min(sizes) <= 2 * segment


def test_a_fixed_count_of_one_keeps_a_lone_part_untouched(tmp_path: Path) -> None:
    shards, parts = _shards(tmp_path, [4], Limits(max_bytes=0, max_records=0, num_shards=1))
    assert [(s.records, s.sha256) for s in shards] == [(p.records, p.sha256) for p in parts]
