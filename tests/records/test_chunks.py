"""read_record_chunks on crafted files: every length checked before its record is gathered, and
the pending bytes of a long record joined once, not at every read."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from recordforge.records import chunks
from recordforge.records.chunks import read_record_chunks
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.tfrecord import CorruptRecord


def _header(length: int) -> bytes:
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw))


def _frame(data: bytes) -> bytes:
    return _header(len(data)) + data + struct.pack("<I", masked_crc32c(data))


class _CountingNative:
    """chunks' C module, counting the bytes framed (the work a framing does)."""

    def __init__(self, native: Any) -> None:
        self._native = native
        self.framed = 0

    def find_records(self, data: bytes) -> Any:
        self.framed += len(data)
        return self._native.find_records(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._native, name)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> _CountingNative:
    native = _CountingNative(chunks._native)
    monkeypatch.setattr(chunks, "_native", native)
    return native


def test_a_huge_claimed_length_is_refused_at_once(tmp_path: Path, counting: _CountingNative) -> None:
    """A header claiming 2**40 bytes in a 32 MB file: refused at the first framing, naming what
    the file holds (before: framed again at every 256 KiB read, quadratic in the file)."""
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(_header(1 << 40) + bytes((32 << 20) - 12))
    with pytest.raises(CorruptRecord, match="claims 1099511627776 bytes, 33554420 follow"):
        list(read_record_chunks(str(path), chunk_bytes=2 << 20))
    assert counting.framed <= 2 * (32 << 20)


def test_a_long_record_is_framed_once(tmp_path: Path, counting: _CountingNative) -> None:
    """A 12 MB record between short ones, in a gzip stream stored uncompressed (so that it
    comes in reads of 256 KiB): read back whole, the bytes framed about once."""
    small = [b"before %d" % i for i in range(100)]
    big = bytes(range(256)) * (12 << 12)
    records = [*small, big, *small]
    deflate = zlib.compressobj(0, zlib.DEFLATED, 31)
    path = tmp_path / "long.tfrecord.gz"
    path.write_bytes(deflate.compress(b"".join(_frame(r) for r in records)) + deflate.flush())
    got = []
    for chunk in read_record_chunks(str(path), chunk_bytes=2 << 20):
        got += [
            bytes(chunk.data[s:e]) for s, e in zip(chunk.starts.tolist(), chunk.ends.tolist(), strict=True)
        ]
    assert got == records
    assert counting.framed <= 3 * len(big)


def test_a_stored_gzip_claim_under_the_limit_waits_for_its_bytes(
    tmp_path: Path, counting: _CountingNative
) -> None:
    """A header claiming 2 GiB - 2 (within the limit) then 24 MB in a stored gzip stream: the
    record is gathered (a compressed file's size says nothing of what it inflates to), framed
    once at the end, and reported truncated."""
    deflate = zlib.compressobj(0, zlib.DEFLATED, 31)
    path = tmp_path / "claim.tfrecord.gz"
    path.write_bytes(deflate.compress(_header((2 << 30) - 2) + bytes(24 << 20)) + deflate.flush())
    with pytest.raises(CorruptRecord, match="truncated record"):
        list(read_record_chunks(str(path), chunk_bytes=2 << 20))
    assert counting.framed <= 3 * (24 << 20)


def test_a_claim_over_max_record_bytes_is_refused(tmp_path: Path) -> None:
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    path = tmp_path / "bomb.tfrecord.gz"
    path.write_bytes(deflate.compress(_frame(b"ok") + _header(5000) + bytes(6000)) + deflate.flush())
    with pytest.raises(CorruptRecord, match="record length 5000 over the limit of 4096 bytes") as info:
        list(read_record_chunks(str(path), max_record_bytes=4096))
    assert info.value.offset == 18
