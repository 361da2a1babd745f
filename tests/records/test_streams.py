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
from record_cases import sample_records

from recordforge.records.streams import HashingFile, StreamWriter, combine_checks, splice
from recordforge.records.tfrecord import frame_records


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
    chunks = [sample_records(300, seed) for seed in range(6)]
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
def test_a_segments_bytes_are_those_a_stream_starting_there_writes(tmp_path: Path, compression: str) -> None:
    """What a splice, a resumed run and an appended run rely on: a segment's compressed bytes
    depend on its own records, not on the segments written before it in the same stream."""
    chunks = [sample_records(400, seed) for seed in range(5)]
    whole = _write(tmp_path / "whole", compression, chunks)
    data = (tmp_path / "whole").read_bytes()
    for i, seg in enumerate(whole):
        alone = _write(tmp_path / f"alone{i}", compression, [chunks[i]])
        (only,) = alone
        assert data[seg.start : seg.end] == (tmp_path / f"alone{i}").read_bytes()[only.start : only.end]


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_spliced_segments_of_several_files_are_one_valid_stream(tmp_path: Path, compression: str) -> None:
    files = []
    for f in range(3):
        chunks = [sample_records(200, 10 * f + k) for k in range(4)]
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


@pytest.mark.parametrize("compression", ["gzip", "none"])
def test_holds_answers_as_the_written_file_would(tmp_path: Path, compression: str) -> None:
    """The writes run behind the caller; `holds` answers for the file as it will be once all
    that was given is written, at every size near it and far from it."""
    writer = StreamWriter(HashingFile(open(tmp_path / "a", "wb")), compression, 1)  # noqa: SIM115 - closed by close()
    chunks = [sample_records(200, seed) for seed in range(5)]
    for chunk in chunks:
        writer.write(_framed(chunk), len(chunk))
        writer.end_segment()
        answers = {size: writer.holds(size) for size in (1, 1 << 30)}
        writer._behind.wait()
        size = writer.file.bytes
        for probe in (size - 1, size, size + 1):
            assert writer.holds(probe) == (probe <= size)
        assert answers == {1: True, 1 << 30: False}
    writer.close()
    assert _decode(tmp_path / "a", compression) == b"".join(_framed(c) for c in chunks)


def test_an_error_behind_the_caller_is_raised_to_it(tmp_path: Path) -> None:
    """A write that fails on the stream's thread fails the caller's next call, and nothing after it
    is written."""

    first = _framed(sample_records(10, 0))

    class Failing(HashingFile):
        def write(self, data: bytes | memoryview) -> None:
            if self.bytes >= len(first):
                raise OSError("disk full")
            super().write(data)

    writer = StreamWriter(Failing(open(tmp_path / "a", "wb")), "none", 1)  # noqa: SIM115 - closed below
    writer.write(first, 10)
    with pytest.raises(OSError, match="disk full"):  # at the third write or at close
        writer.write(_framed(sample_records(10, 1)), 10)  # fails on the stream's thread
        writer.write(_framed(sample_records(10, 2)), 10)  # never written
        writer.close()
    writer.discard()
    writer.file.close()
    assert (tmp_path / "a").read_bytes() == first
