"""Compressed shard files written in segments that are spliced without recompressing them."""

from __future__ import annotations

import hashlib
import queue
import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from recordforge.files.storage import open_read, open_write
from recordforge.tracing.spans import span

if TYPE_CHECKING:  # imported where a stream is compressed
    from isal import isal_zlib

__all__ = ["Segment", "HashingFile", "StreamWriter", "splice", "combine_checks", "stream_file"]

_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no flags, mtime 0, OS unknown
_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest level; (0x7801 % 31 == 0)
_END_BLOCK = b"\x01\x00\x00\xff\xff"  # an empty final stored block: the deflate stream ends
_EMPTY_CHECK = {"gzip": 0, "zlib": 1, "none": 0}  # CRC-32 and Adler-32 of no bytes
_ADLER_BASE = 65521
_COPY_CHUNK = 8 << 20
# Calls waiting for a stream's thread: a batch's write and its segment's end, and the next pair.
_BEHIND_DEPTH = 4
# What a deflate stream may add to the bytes given to it, at most (a generous bound: stored
# blocks add 5 bytes per 64 KiB, a flush a few bytes).
_GROWTH, _SLACK = 2, 4096


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


def stream_file(path: str, compression: str) -> HashingFile:
    """A new file for a stream of `compression`. An uncompressed one bypasses the page cache
    (storage._DirectWriter): copying it there was the largest cost left beside encoding; a
    deflated stream is ~2.4x smaller, its thread busy deflating, and measured no faster that way
    (docs/performance.md)."""
    return HashingFile(open_write(path, direct=compression == "none"))


class _Behind:
    """Calls run in order on a thread of their own, at most `depth` of them waiting: what a stream
    does with a batch (deflate, hash, the file's write; each releases the GIL) overlaps what its
    caller does next (encoding the next batch). The first error is raised to the caller at its
    next call, and no call after it runs."""

    def __init__(self, depth: int) -> None:
        self._jobs: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.Queue(depth)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def call(self, fn: Callable[..., None], *args: Any) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="recordforge-stream", daemon=True)
            self._thread.start()
        if self._jobs.full():  # the stream's thread is behind: the caller waits for it
            with span("wait for writer"):
                self._jobs.put((fn, args))
        else:
            self._jobs.put((fn, args))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                if self._error is None:
                    fn, args = job
                    with span("deflate, hash, write"):
                        fn(*args)
            except BaseException as exn:  # handed to the caller's thread
                self._error = exn
            finally:
                self._jobs.task_done()

    def wait(self) -> None:
        """Returns once every call made has run; raises the first error."""
        if self._thread is not None:
            self._jobs.join()
        self._raise()

    def stop(self) -> None:
        """Ends the thread once the calls made have run (errors are kept, not raised)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error


class StreamWriter:
    """Writes framed TFRecords to `file` (a HashingFile) as one stream of `compression`.

    `write` takes whole records; `end_segment` closes a segment (a full flush); `close` ends the
    stream and returns its segments. Writes and segment ends run on the writer's own thread, in
    order, behind the caller (`holds` and `close` wait for them where they must); `discard`
    stops it before a failed stream is deleted."""

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
        self._behind = _Behind(_BEHIND_DEPTH)
        self._given = 0  # raw bytes given to `write` (the caller's count)
        self._flushed = 0  # raw bytes whose compressed bytes have all reached the file

    def write(self, framed: bytes | memoryview, records: int) -> None:
        """Queues `framed` (which must not change until the stream has written it)."""
        self._given += len(framed)
        self._behind.call(self._write, framed, records)

    @property
    def given(self) -> int:
        """Bytes given to `write` so far: an uncompressed stream's offset of the next record."""
        return self._given

    def end_segment(self) -> None:
        self._behind.call(self._end_segment)

    def holds(self, size: int) -> bool:
        """Whether the file holds at least `size` bytes once all that was given has reached it:
        exactly as if it were written at once. Waits for the stream's thread only where the
        bytes still to come could decide it."""
        flushed = self._flushed  # read first: the file's bytes grow before it does
        if self.file.bytes + _GROWTH * (self._given - flushed) + _SLACK < size:
            return False
        self._behind.wait()
        return self.file.bytes >= size

    def _write(self, framed: bytes | memoryview, records: int) -> None:
        if self._deflate is None:
            self.file.write(framed)
        else:
            from isal import isal_zlib

            checksum = isal_zlib.crc32 if self._compression == "gzip" else isal_zlib.adler32
            self._seg_check = checksum(framed, self._seg_check)
            self.file.write(self._deflate.compress(framed))
        self._seg_raw += len(framed)
        self._seg_records += records

    def _end_segment(self) -> None:
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
        self._flushed = self._raw
        self._seg_check = _EMPTY_CHECK[self._compression]
        self._seg_raw = self._seg_records = 0
        self._seg_start = self.file.bytes

    def close(self) -> tuple[Segment, ...]:
        self._behind.call(self._end_segment)
        self._behind.wait()
        self._behind.stop()
        self.file.write(_end(self._compression, self._check, self._raw))
        self.file.close()
        return tuple(self._segments)

    def discard(self) -> None:
        """Stops the stream's thread (what it was given is written or dropped, errors kept)."""
        self._behind.stop()


def splice(
    path: str, compression: str, pieces: Iterable[tuple[str, Segment]], trailer: bytes = b""
) -> tuple[int, int, str, tuple[Segment, ...]]:
    """Writes the segments `pieces` ((file, segment), in order) as one new stream at `path`,
    `trailer` after them (a tar's end). Returns its records, bytes, sha256 and segments."""
    out = stream_file(path, compression)
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
    out.write(_end(compression, check, raw) + trailer)
    out.close()
    return records, out.bytes, out.hexdigest(), tuple(segments)
