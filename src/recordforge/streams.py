"""Compressed shard files written in segments that are spliced without recompressing them."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from recordforge.storage import open_read, open_write

if TYPE_CHECKING:  # imported where a stream is compressed
    from isal import isal_zlib

__all__ = ["Segment", "HashingFile", "StreamWriter", "splice", "combine_checks"]

_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, OS unknown
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest level; (0x7801 % 31 == 0)
_END_BLOCK = b"\x01\x00\x00\xff\xff"  # an empty final stored block: the deflate stream ends
_EMPTY_CHECK = {"gzip": 0, "zlib": 1, "none": 0}  # CRC-32 and Adler-32 of no bytes
_ADLER_BASE = 65521
_COPY_CHUNK = 8 << 20


@dataclass(frozen=True)
class Segment:
    """Compressed bytes [start, end) of a file that decode on their own to `raw` bytes holding
    `records` whole TFRecords; `check` is their CRC-32 (gzip) or Adler-32 (zlib). In a file that
    cannot be cut by bytes (ArrayRecord), [start, end) is only its size, and `first` the index
    of its first record in the file."""

    start: int
    end: int
    raw: int
    check: int
    records: int
    first: int = 0

    @property
    def bytes(self) -> int:
        return self.end - self.start


def combine_checks(compression: str, first: int, second: int, second_length: int) -> int:
    """The checksum of two byte strings joined, from the checksum of each (zlib's *_combine)."""
    if compression == "gzip":
        from isal import isal_zlib

        return isal_zlib.crc32_combine(first, second, second_length)
    if compression == "zlib":
        rem = second_length % _ADLER_BASE
        low1, high1 = first & 0xFFFF, first >> 16
        low = (low1 + (second & 0xFFFF) + _ADLER_BASE - 1) % _ADLER_BASE
        high = (rem * low1 + high1 + (second >> 16) + _ADLER_BASE - rem) % _ADLER_BASE
        return low | (high << 16)
    return 0


def _header(compression: str) -> bytes:
    return {"gzip": _GZIP_HEADER, "zlib": _ZLIB_HEADER}.get(compression, b"")


def _end(compression: str, check: int, raw: int) -> bytes:
    if compression == "gzip":
        return _END_BLOCK + struct.pack("<II", check, raw & 0xFFFFFFFF)
    if compression == "zlib":
        return _END_BLOCK + struct.pack(">I", check)
    return b""


class HashingFile:
    """A file handle that counts and hashes the bytes that reach it (after compression)."""

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: bytes | memoryview) -> None:
        self._sha.update(data)
        self.bytes += len(data)
        self._handle.write(data)

    def close(self) -> None:
        self._handle.close()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


class StreamWriter:
    """Writes framed TFRecords to `file` (a HashingFile) as one stream of `compression`.

    `write` takes whole records; `end_segment` closes a segment (a full flush); `close` ends the
    stream and returns its segments."""

    def __init__(self, file: HashingFile, compression: str, level: int) -> None:
        self.file = file
        self._compression = compression
        self._deflate: isal_zlib.Compress | None = None
        if compression != "none":
            from isal import isal_zlib

            self._deflate = isal_zlib.compressobj(level, isal_zlib.DEFLATED, -15)  # raw deflate
        file.write(_header(compression))
        self._segments: list[Segment] = []
        self._check = self._seg_check = _EMPTY_CHECK[compression]
        self._raw = self._seg_raw = self._seg_records = 0
        self._seg_start = file.bytes

    def write(self, framed: bytes | memoryview, records: int) -> None:
        if self._deflate is None:
            self.file.write(framed)
        else:
            from isal import isal_zlib

            checksum = isal_zlib.crc32 if self._compression == "gzip" else isal_zlib.adler32
            self._seg_check = checksum(framed, self._seg_check)
            self.file.write(self._deflate.compress(framed))
        self._seg_raw += len(framed)
        self._seg_records += records

    def end_segment(self) -> None:
        if not self._seg_records:
            return
        if self._deflate is not None:
            from isal import isal_zlib

            self.file.write(self._deflate.flush(isal_zlib.Z_FULL_FLUSH))
        self._segments.append(
            Segment(self._seg_start, self.file.bytes, self._seg_raw, self._seg_check, self._seg_records)
        )
        self._check = combine_checks(self._compression, self._check, self._seg_check, self._seg_raw)
        self._raw += self._seg_raw
        self._seg_check = _EMPTY_CHECK[self._compression]
        self._seg_raw = self._seg_records = 0
        self._seg_start = self.file.bytes

    def close(self) -> tuple[Segment, ...]:
        self.end_segment()
        self.file.write(_end(self._compression, self._check, self._raw))
        self.file.close()
        return tuple(self._segments)


def splice(
    path: str, compression: str, pieces: Iterable[tuple[str, Segment]]
) -> tuple[int, int, str, tuple[Segment, ...]]:
    """Writes the segments `pieces` ((file, segment), in order) as one new stream at `path`.
    Returns its records, bytes, sha256 and segments."""
    out = HashingFile(open_write(path))
    out.write(_header(compression))
    check, raw, records, segments = _EMPTY_CHECK[compression], 0, 0, []
    runs: list[tuple[str, int, int]] = []  # contiguous byte ranges to copy, file by file
    at = out.bytes
    for source, seg in pieces:
        segments.append(Segment(at, at + seg.bytes, seg.raw, seg.check, seg.records))
        at += seg.bytes
        if runs and runs[-1][0] == source and runs[-1][2] == seg.start:
            runs[-1] = (source, runs[-1][1], seg.end)
        else:
            runs.append((source, seg.start, seg.end))
        check = combine_checks(compression, check, seg.check, seg.raw)
        raw += seg.raw
        records += seg.records
    for source, start, end in runs:
        with open_read(source) as f:
            f.seek(start)
            left = end - start
            while left:
                data = f.read(min(left, _COPY_CHUNK))
                if not data:
                    raise OSError(f"{source}: ended before byte {end} while splicing a shard")
                out.write(data)
                left -= len(data)
    out.write(_end(compression, check, raw))
    out.close()
    return records, out.bytes, out.hexdigest(), tuple(segments)
