"""The TFRecord container format: framing, masked CRC32C, and scanning written shards."""

from __future__ import annotations

import hashlib
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_array, binary_parts
from recordforge.errors import RecordForgeError
from recordforge.image_headers import image_format
from recordforge.storage import open_read

__all__ = [
    "Compression",
    "CorruptRecord",
    "FileDigest",
    "detect_compression",
    "read_records",
    "RecordChunk",
    "read_record_chunks",
    "data_crc_mismatches",
    "ShardInfo",
    "frame_records",
    "iter_records",
    "masked_crc32c",
    "describe_shard",
]

_MASK_DELTA = 0xA282EAD8
# File bytes per read: inflated, about 0.6 MB of records of the benchmark table. Larger reads
# made larger buffers to copy and fault in (4 MB reads cost a quarter more CPU per shard).
_READ_CHUNK = 256 << 10


class Compression:
    """The compression names users give, mapped to Beam's and tf.data's names and file suffixes."""

    CHOICES = ("gzip", "zlib", "none")
    # Beam's CompressionTypes values, spelled out: reading shards must not need Beam (a test
    # checks they match).
    _BEAM = {"gzip": "gzip", "zlib": "deflate", "none": "uncompressed"}
    _TF = {"gzip": "GZIP", "zlib": "ZLIB", "none": ""}
    # Suffixes that Beam's CompressionTypes.detect_compression_type maps to the same compression,
    # so readers that go by the name (ReadFromTFRecord's AUTO, tfx-bsl's Beam source, TFDV) need
    # no setting: Beam's DEFLATE is a zlib stream, as tf.data's "ZLIB" is.
    _SUFFIX = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.deflate", "none": ".tfrecord"}

    @classmethod
    def beam(cls, name: str) -> str:
        return cls._BEAM[name]

    @classmethod
    def tf(cls, name: str) -> str:
        return cls._TF[name]

    @classmethod
    def suffix(cls, name: str) -> str:
        return cls._SUFFIX[name]


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = google_crc32c.value(bytes(data)) if isinstance(data, memoryview) else google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _masked(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint64)
    return (
        (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)
    ).astype("<u4")


def _crc32c_table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ poly, table >> 1).astype(np.uint32)
    return table


_CRC_TABLE = _crc32c_table()


def _crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a small (n, k) uint8 matrix at once: k table lookups over n rows."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for k in range(rows.shape[1]):
        crc = _CRC_TABLE[(crc ^ rows[:, k]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


def frame_records(records: pa.Array) -> pa.Array:
    """Frames a batch of records as TFRecords: one large_binary element per framed record.

    Each record becomes: uint64 length, masked CRC32C of those 8 bytes, the data, masked CRC32C of
    the data. The length CRCs are computed for the whole batch at once; the data CRCs are one C
    call per record; the layout is one Arrow element-wise join.
    """
    offsets, data = binary_parts(records)
    n = len(offsets) - 1
    lengths = np.diff(offsets).astype("<u8")
    head = np.empty((n, 12), dtype=np.uint8)
    head[:, :8] = lengths.view(np.uint8).reshape(n, 8)
    head[:, 8:] = _masked(_crc32c_rows(head[:, :8])).view(np.uint8).reshape(n, 4)
    raw = data[offsets[0] : offsets[-1]].tobytes()
    rel = (offsets - offsets[0]).tolist()
    value = google_crc32c.value
    data_crc = np.fromiter((value(raw[rel[i] : rel[i + 1]]) for i in range(n)), np.uint64, n)
    tail = _masked(data_crc).view(np.uint8)
    return pc.binary_join_element_wise(
        binary_array(head.reshape(-1), np.full(n, 12)),
        records.cast(pa.large_binary()),
        binary_array(tail, np.full(n, 4)),
        pa.scalar(b"", pa.large_binary()),
    )


class CorruptRecord(RecordForgeError, ValueError):
    """A record whose framing or CRC is wrong; `offset` is its byte offset in the decompressed
    stream. At offset 0 the file is most likely not a TFRecord file at all, and says so."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        self.path = path
        self.offset = offset
        self.what = what
        if offset == 0:
            found = _looks_like(path)
            super().__init__(f"{path}: not a TFRecord file ({found}{what} at byte 0)")
        else:
            super().__init__(f"{path}: {what} at byte {offset}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Three-argument __init__: tell pickle how to rebuild it across Beam worker boundaries.
        return (type(self), (self.path, self.offset, self.what))


# Files that are not images; images are told by their signatures (image_headers.py).
_MAGIC = (
    (b"PAR1", "a Parquet file"),
    (b"PK\x03\x04", "a zip archive"),
    (b"ARROW1", "an Arrow file"),
)


def _looks_like(path: str) -> str:
    """What a file that is not a TFRecord file seems to be, from its first bytes, as a prefix
    for the error ("" when nothing is recognised)."""
    try:
        with open_read(path) as f:
            head = f.read(4096)
        found = _looks_like_bytes(head[:64])
        if head[:2] == b"\x1f\x8b":  # say what the gzip stream holds
            inner = _looks_like_bytes(zlib.decompressobj(31).decompress(head, 64))
            found = f"gzip of {inner}" if inner else ""
    except Exception:  # noqa: BLE001 - a description only; the error stands without it
        return ""
    return f"{found}; " if found else ""


def _looks_like_bytes(head: bytes) -> str:
    image = image_format(head)
    if image:
        return f"a {image.upper()} image"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    for cut in range(4):  # the bytes may end inside a character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip() and all(c.isprintable() or c in "\n\r\t" for c in text):
            return f"text, starting {text.strip().splitlines()[0][:40]!r}"
        break
    return ""


def detect_compression(path: str) -> str:
    """ "gzip", "zlib" or "none", from the first bytes (the suffix is not trusted)."""
    with open_read(path) as f:
        head = f.read(16)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        # A zlib header. An uncompressed TFRecord starts with a little-endian length instead;
        # tell them apart by the length's CRC.
        if len(head) >= 12 and struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8]):
            return "none"
        return "zlib"
    return "none"


def _chunks(path: str, compression: str, on_raw: Callable[[bytes], None] | None = None) -> Iterator[bytes]:
    from isal import isal_zlib  # zlib-compatible, several times faster to inflate

    inflate = None
    if compression != "none":
        inflate = isal_zlib.decompressobj(47 if compression == "gzip" else 15)
    read = 0  # compressed bytes read: where a bad deflate stream is reported
    try:
        with open_read(path) as f:
            while raw := f.read(_READ_CHUNK):
                if on_raw is not None:
                    on_raw(raw)
                read += len(raw)
                yield inflate.decompress(raw) if inflate else raw
                while inflate and inflate.unused_data:  # concatenated gzip members
                    rest = inflate.unused_data
                    inflate = isal_zlib.decompressobj(47)
                    yield inflate.decompress(rest)
        if inflate:
            yield inflate.flush()
            if not inflate.eof:  # a deflate stream cut short, its gzip trailer (CRC, size) missing
                raise CorruptRecord(path, read, f"the {compression} stream is truncated (no end of stream)")
    except isal_zlib.error as exn:
        # Offsets count decompressed bytes, unknown here: the first chunk stands for the start.
        offset = 0 if read <= _READ_CHUNK else read
        raise CorruptRecord(path, offset, f"invalid {compression} stream: {exn}") from exn


class _Stream:
    """Bytes from an iterator of chunks, read by length, with the offset of what comes next."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0
        self.offset = 0

    def read(self, n: int) -> bytes:
        while len(self._buf) - self._pos < n:
            more = next(self._chunks, None)
            if more is None:
                break
            self._buf = self._buf[self._pos :] + more
            self._pos = 0
        out = self._buf[self._pos : self._pos + n]
        self._pos += len(out)
        self.offset += len(out)
        return out


def read_records(
    path: str,
    compression: str | None = None,
    *,
    check_crc: bool = True,
    on_raw: Callable[[bytes], None] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """(offset, record) for each record, streaming in bounded memory. Raises CorruptRecord at the
    first bad frame or CRC, naming its offset. `on_raw` sees the file's bytes as read (to hash)."""
    stream = _Stream(_chunks(path, compression or detect_compression(path), on_raw))
    while True:
        offset = stream.offset
        head = stream.read(12)
        if not head:
            return
        if len(head) < 12:
            raise CorruptRecord(path, offset, "truncated record header")
        (length,) = struct.unpack("<Q", head[:8])
        if check_crc and struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
            raise CorruptRecord(path, offset, "corrupt length (CRC mismatch)")
        body = stream.read(length + 4)
        if len(body) < length + 4:
            raise CorruptRecord(path, offset, "truncated record")
        data = body[:length]
        if check_crc and struct.unpack("<I", body[length:])[0] != masked_crc32c(data):
            raise CorruptRecord(path, offset, "corrupt data (CRC mismatch)")
        yield offset, data


@dataclass
class RecordChunk:
    """Whole records of a stream, as one buffer: record i's header is at heads[i] in `data`,
    its payload data[heads[i] + 12 : heads[i] + 12 + lengths[i]]; `offset` is where `data`
    begins in the decompressed stream, `raw_bytes` how many file bytes were read for it."""

    data: bytes
    offset: int
    heads: np.ndarray
    lengths: np.ndarray
    raw_bytes: int = 0
    first_record: int = 0  # the index in the file of the chunk's first record

    def __len__(self) -> int:
        return len(self.heads)

    @property
    def starts(self) -> np.ndarray:
        return self.heads + 12

    @property
    def ends(self) -> np.ndarray:
        return self.heads + 12 + self.lengths


_U64 = struct.Struct("<Q")


def _hop(data: bytes) -> tuple[list[int], int]:
    """Where each whole record starts, by its length field; and where the rest begins. Record
    boundaries depend on every length before them, so this one loop is sequential; every check
    of what it finds is done over the whole chunk at once."""
    unpack = _U64.unpack_from
    heads: list[int] = []
    append = heads.append
    pos, n = 0, len(data)
    while pos + 12 <= n:
        end = pos + unpack(data, pos)[0] + 16
        if end > n:
            break
        append(pos)
        pos = end
    return heads, pos


def _gather(arr: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    return arr[at[:, None] + np.arange(width)] if len(at) else np.zeros((0, width), np.uint8)


def _frame(
    path: str, data: bytes, base: int, raw_bytes: int, final: bool
) -> tuple[RecordChunk, bytes, str | None]:
    """The whole records at the front of `data` whose length CRC holds, the bytes after them,
    and what is wrong at the first byte not taken (None: only an incomplete record, more to come)."""
    heads_list, used = _hop(data)
    arr = np.frombuffer(data, np.uint8)
    heads = np.asarray(heads_list, np.int64)
    head_rows = _gather(arr, heads, 12)
    lengths = np.ascontiguousarray(head_rows[:, :8]).view("<u8").ravel().astype(np.int64)
    stored = np.ascontiguousarray(head_rows[:, 8:]).view("<u4").ravel()
    bad = np.flatnonzero(_masked(_crc32c_rows(head_rows[:, :8])) != stored)
    problem = None
    if len(bad):
        cut = int(bad[0])
        heads, lengths, used = heads[:cut], lengths[:cut], int(heads[cut])
        problem = "corrupt length (CRC mismatch)"
    elif used < len(data):
        tail = data[used : used + 12]
        if len(tail) == 12 and struct.unpack("<I", tail[8:])[0] != masked_crc32c(tail[:8]):
            problem = "corrupt length (CRC mismatch)"  # else a garbage length would keep it waiting
        elif final:
            problem = "truncated record header" if len(tail) < 12 else "truncated record"
    chunk = RecordChunk(data[:used], base, heads, lengths, raw_bytes)
    return chunk, data[used:], problem


def read_record_chunks(
    path: str,
    compression: str | None = None,
    *,
    on_raw: Callable[[bytes], None] | None = None,
    chunk_bytes: int = 8 << 20,
) -> Iterator[RecordChunk]:
    """The records of a file in chunks of about `chunk_bytes`, streaming in bounded memory, every
    length CRC checked (data CRCs: `data_crc_mismatches`, where the chunk is used). Raises
    CorruptRecord after the last good chunk, at the first bad frame, as `read_records` does."""
    pending = b""
    base = 0
    records = 0
    raw_seen = 0
    raw_at_last = 0

    def count_raw(raw: bytes) -> None:
        nonlocal raw_seen
        raw_seen += len(raw)
        if on_raw is not None:
            on_raw(raw)

    for piece in _chunks(path, compression or detect_compression(path), count_raw):
        pending = pending + piece if pending else piece
        if len(pending) < chunk_bytes:
            continue
        chunk, pending, problem = _frame(path, pending, base, raw_seen - raw_at_last, False)
        raw_at_last = raw_seen
        chunk.first_record = records
        records += len(chunk)
        if len(chunk):
            yield from _split(chunk, chunk_bytes)
        if problem:
            raise CorruptRecord(path, base + len(chunk.data), problem)
        base += len(chunk.data)
    chunk, pending, problem = _frame(path, pending, base, raw_seen - raw_at_last, True)
    chunk.first_record = records
    if len(chunk) or chunk.raw_bytes:
        yield from _split(chunk, chunk_bytes)
    if problem:
        raise CorruptRecord(path, base + len(chunk.data), problem)


def _split(chunk: RecordChunk, chunk_bytes: int) -> Iterator[RecordChunk]:
    """The chunk in pieces of whole records, about `chunk_bytes` each (an inflated read is often
    several times that: batches decoded by numpy run faster when their arrays stay in cache)."""
    size = len(chunk.data)
    if size <= chunk_bytes * 3 // 2 or len(chunk) < 2:
        yield chunk
        return
    cuts = np.unique(np.searchsorted(chunk.heads, np.arange(chunk_bytes, size, chunk_bytes)))
    cuts = [0, *[int(c) for c in cuts if 0 < c < len(chunk)], len(chunk)]
    raw_given = 0
    for a, b in zip(cuts, cuts[1:], strict=False):
        lo = int(chunk.heads[a])
        hi = int(chunk.heads[b]) if b < len(chunk) else size
        raw = chunk.raw_bytes - raw_given if b == len(chunk) else chunk.raw_bytes * (hi - lo) // size
        raw_given += raw
        yield RecordChunk(
            chunk.data[lo:hi],
            chunk.offset + lo,
            chunk.heads[a:b] - lo,
            chunk.lengths[a:b],
            raw,
            chunk.first_record + a,
        )


def data_crc_mismatches(chunk: RecordChunk) -> np.ndarray:
    """Indices of the chunk's records whose data CRC does not hold (one C call per record:
    google-crc32c uses the CPU's CRC32C instruction)."""
    n = len(chunk)
    if not n:
        return np.zeros(0, np.int64)
    value = google_crc32c.value
    data = chunk.data
    starts, ends = chunk.starts, chunk.ends
    crcs = np.fromiter(
        (value(data[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)), np.uint64, n
    )
    stored = np.ascontiguousarray(_gather(np.frombuffer(data, np.uint8), ends, 4)).view("<u4").ravel()
    return np.flatnonzero(_masked(crcs) != stored)


def iter_records(path: str, compression: str, *, check_crc: bool = False) -> Iterator[bytes]:
    """Yields the records of one TFRecord file (any Beam filesystem)."""
    for _, record in read_records(path, compression, check_crc=check_crc):
        yield record


@dataclass(frozen=True)
class ShardInfo:
    """What a shard file on disk holds, measured after it was written."""

    path: str
    records: int
    bytes: int
    sha256: str


class FileDigest:
    """Size and sha256 of a file's bytes, fed chunk by chunk (as `read_records`' `on_raw`)."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.size = 0

    def __call__(self, raw: bytes) -> None:
        self._sha.update(raw)
        self.size += len(raw)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def describe_shard(path: str, compression: str) -> ShardInfo:
    """Counts the records of a written shard and checksums its bytes, so that the manifest
    describes the files as they are on disk, not as the writer meant them to be."""
    digest = FileDigest()
    records = sum(1 for _ in read_records(path, compression, check_crc=False, on_raw=digest))
    return ShardInfo(path=path, records=records, bytes=digest.size, sha256=digest.hexdigest())
