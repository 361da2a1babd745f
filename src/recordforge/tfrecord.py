"""The TFRecord container format: framing, masked CRC32C, and scanning written shards."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import google_crc32c
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

__all__ = [
    "Compression",
    "ShardInfo",
    "frame_records",
    "iter_records",
    "masked_crc32c",
    "describe_shard",
]

_MASK_DELTA = 0xA282EAD8


class Compression:
    """The compression names users give, mapped to Beam's and tf.data's names and file suffixes."""

    CHOICES = ("gzip", "zlib", "none")
    _BEAM = {"gzip": CompressionTypes.GZIP, "zlib": CompressionTypes.DEFLATE,
             "none": CompressionTypes.UNCOMPRESSED}
    _TF = {"gzip": "GZIP", "zlib": "ZLIB", "none": ""}
    _SUFFIX = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.zz", "none": ".tfrecord"}

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
    crc = google_crc32c.value(bytes(data)) if isinstance(data, memoryview) else \
        google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _masked(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint64)
    return ((((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA))
            & np.uint64(0xFFFFFFFF)).astype("<u4")


def frame_records(offsets: np.ndarray, data: np.ndarray) -> bytes:
    """Frames many records at once: for each, length, masked CRC of length, data, masked CRC.

    `offsets` (n+1, int64) delimit the records in `data` (uint8). The per-record CRCs are C calls;
    everything else is done on whole arrays.
    """
    n = len(offsets) - 1
    lengths = np.diff(offsets).astype("<u8")
    len_bytes = lengths.view(np.uint8).reshape(n, 8)
    value = google_crc32c.value
    mv = memoryview(data)
    len_crc = np.fromiter((value(row.tobytes()) for row in len_bytes), np.uint64, n)
    data_crc = np.fromiter(
        (value(mv[offsets[i] : offsets[i + 1]]) for i in range(n)), np.uint64, n
    )
    head = np.empty((n, 12), dtype=np.uint8)
    head[:, :8] = len_bytes
    head[:, 8:] = _masked(len_crc).view(np.uint8).reshape(n, 4)
    tail = _masked(data_crc).view(np.uint8).reshape(n, 4)
    total = int(offsets[-1] - offsets[0]) + 16 * n
    out = np.empty(total, dtype=np.uint8)
    # Record i starts at its data offset plus 16 bytes for every record before it.
    starts = (offsets[:-1] - offsets[0]) + 16 * np.arange(n, dtype=np.int64)
    idx = starts[:, None] + np.arange(12)
    out[idx] = head
    body_lens = np.diff(offsets)
    body_dst = np.repeat(starts + 12 - (offsets[:-1] - offsets[0]), body_lens) + np.arange(
        int(offsets[-1] - offsets[0])
    )
    out[body_dst] = data[offsets[0] : offsets[-1]]
    out[(starts + 12 + body_lens)[:, None] + np.arange(4)] = tail
    return out.tobytes()


def iter_records(path: str, compression: str, *, check_crc: bool = False) -> Iterator[bytes]:
    """Yields the records of one TFRecord file (any Beam filesystem)."""
    with FileSystems.open(path, compression_type=Compression.beam(compression)) as f:
        offset = 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"{path}: truncated record header at byte {offset}")
            (length,) = struct.unpack("<Q", head[:8])
            if check_crc and struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
                raise ValueError(f"{path}: corrupt length CRC at byte {offset}")
            body = f.read(length + 4)
            if len(body) < length + 4:
                raise ValueError(f"{path}: truncated record at byte {offset}")
            if check_crc and struct.unpack("<I", body[length:])[0] != masked_crc32c(body[:length]):
                raise ValueError(f"{path}: corrupt data CRC at byte {offset}")
            offset += 16 + length
            yield body[:length]


@dataclass(frozen=True)
class ShardInfo:
    """What a shard file on disk holds, measured after it was written."""

    path: str
    records: int
    bytes: int
    sha256: str


def describe_shard(path: str, compression: str) -> ShardInfo:
    """Counts the records of a written shard and checksums its bytes, so that the manifest
    describes the files as they are on disk, not as the writer meant them to be."""
    digest = hashlib.sha256()
    size = 0
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
            size += len(chunk)
    records = sum(1 for _ in iter_records(path, compression))
    return ShardInfo(path=path, records=records, bytes=size, sha256=digest.hexdigest())
