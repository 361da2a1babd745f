"""read_records and decompressed_chunks on crafted files: lengths checked before a record is
gathered, inflated bytes in bounded pieces, a long record gathered in linear time."""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import pytest

from recordforge.records.crc32c import masked_crc32c
from recordforge.records.tfrecord import CorruptRecord, FileDigest, decompressed_chunks, read_records


def _header(length: int) -> bytes:
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw))


def _frame(data: bytes) -> bytes:
    return _header(len(data)) + data + struct.pack("<I", masked_crc32c(data))


def test_a_huge_claimed_length_is_refused_before_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(_frame(b"first") + _header(1 << 40) + bytes(16 << 20))
    digest = FileDigest(hashed=False)
    got = []
    with pytest.raises(CorruptRecord, match="truncated record \\(its header claims 1099511627776 bytes"):
        for _, record in read_records(str(path), on_raw=digest):
            got.append(record)
    assert got == [b"first"]
    assert digest.size <= 1 << 20  # a read or two, not the 16 MB


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_a_bomb_is_refused_at_its_header(tmp_path: Path, compression: str) -> None:
    """A header claiming 2**40 bytes then 256 MiB of zeros (256 KB compressed): refused at the
    header by the record limit, only a few MiB inflated on the way."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31 if compression == "gzip" else 15)
    path = tmp_path / "bomb"
    with open(path, "wb") as f:
        f.write(deflate.compress(_header(1 << 40)))
        for _ in range(16):
            f.write(deflate.compress(bytes(16 << 20)))
        f.write(deflate.flush())
    with pytest.raises(CorruptRecord, match="record length 1099511627776 over the limit"):
        list(read_records(str(path), compression))


def test_inflated_pieces_are_bounded(tmp_path: Path) -> None:
    """64 MiB of zeros in a 64 KB gzip file, and a second gzip member after it: every piece a
    few MiB at most, all the bytes there, in order."""
    first = zlib.compressobj(9, zlib.DEFLATED, 31)
    second = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = tmp_path / "zeros.gz"
    path.write_bytes(
        first.compress(bytes(64 << 20)) + first.flush() + second.compress(b"tail") + second.flush()
    )
    total = 0
    tail = b""
    for piece in decompressed_chunks(str(path), "gzip"):
        assert len(piece) <= 4 << 20
        total += len(piece)
        tail = (tail + piece)[-4:]
    assert total == (64 << 20) + 4 and tail == b"tail"


def _read_seconds(path: Path) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in read_records(str(path)):
            pass
        best = min(best, time.perf_counter() - start)
    return best


def test_a_long_record_is_read_in_linear_time(tmp_path: Path) -> None:
    """One 48 MiB record takes about as long as the same bytes in 48 records of 1 MiB (before:
    the pending bytes were joined again at every 256 KiB read, 4.6 GB copied)."""
    block = bytes(range(256)) * (1 << 12)
    one = tmp_path / "one.tfrecord"
    one.write_bytes(_frame(block * 48))
    many = tmp_path / "many.tfrecord"
    many.write_bytes(_frame(block) * 48)
    assert [len(r) for _, r in read_records(str(one))] == [48 << 20]
    assert _read_seconds(one) <= 5 * _read_seconds(many) + 0.5
