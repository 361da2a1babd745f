"""Shards by size: each worker streams its batches into temporary files, starting a new one at a
target size or record count, counting and hashing what it writes; a final step names them
`data-SSSSS-of-NNNNN` and moves them into place."""

from __future__ import annotations

import hashlib
import logging
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from recordforge.encoding import binary_parts
from recordforge.storage import delete_tree
from recordforge.tfrecord import ShardInfo, frame_records

__all__ = ["DEFAULT_SHARD_SIZE", "WriteShardsBySize", "parse_size"]

_LOGGER = logging.getLogger(__name__)
DEFAULT_SHARD_SIZE = 128 << 20  # TensorFlow's guidance: 100-200 MB per shard
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """`128MB`, `1.5GB`, `64MiB` or a number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 128MB, 1GB, 64MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass(frozen=True)
class _Part:
    """A finished temporary shard, described by what was written to it."""

    tmp: str
    records: int
    bytes: int
    sha256: str
    first_key: Any


class _HashingFile:
    """Counts and hashes the bytes that reach the file (after compression)."""

    def __init__(self, handle: Any) -> None:
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


class _RollingWriteFn(beam.DoFn):
    def __init__(self, tmp_dir: str, compression: str, level: int, max_bytes: int, max_records: int) -> None:
        self._tmp_dir = tmp_dir
        self._compression = compression
        self._level = level
        self._max_bytes = max_bytes
        self._max_records = max_records

    def start_bundle(self) -> None:
        self._file: _HashingFile | None = None

    def _open(self, key: Any) -> None:
        from recordforge.transforms.sinks import _DeflateWriter

        self._tmp = f"{self._tmp_dir}/{uuid.uuid4().hex}.part"
        self._file = _HashingFile(
            FileSystems.create(self._tmp, compression_type=CompressionTypes.UNCOMPRESSED)
        )
        self._out: Any = self._file
        if self._compression != "none":
            self._out = _DeflateWriter(self._file, self._compression, self._level)
        self._records = 0
        self._first_key = key

    def _close(self) -> _Part:
        assert self._file is not None
        self._out.close()  # flushes the deflate stream into the hashing file, then closes
        part = _Part(self._tmp, self._records, self._file.bytes, self._file.hexdigest(), self._first_key)
        self._file = None
        return part

    def process(self, element: tuple[Any, pa.Array]) -> Iterator[_Part]:
        key, records = element
        start, n = 0, len(records)
        while start < n:
            if self._file is None:
                self._open(key)
            room = self._max_records - self._records if self._max_records else n - start
            take = min(room, n - start)
            offsets, data = binary_parts(frame_records(records.slice(start, take)))
            self._out.write(memoryview(data[offsets[0] : offsets[-1]]))
            self._records += take
            start += take
            full_records = self._max_records and self._records >= self._max_records
            assert self._file is not None
            if full_records or (self._max_bytes and self._file.bytes >= self._max_bytes):
                yield self._close()

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._file is not None:
            yield WindowedValue(self._close(), MIN_TIMESTAMP, [GlobalWindow()])


def _publish(_: bytes, parts: list[_Part], prefix: str, suffix: str, tmp_dir: str) -> list[ShardInfo]:
    """Names the parts in input order and moves them into place; leftovers of retried bundles
    go with the temporary folder. Idempotent: a part already moved (a retried publish) is not
    moved again, and its description is the one recorded when it was written."""
    parts = sorted(parts, key=lambda p: (p.first_key, p.tmp))
    n = len(parts)
    finals = [f"{prefix}-{i:05d}-of-{n:05d}{suffix}" for i in range(n)]
    pending = [(p.tmp, f) for p, f in zip(parts, finals, strict=True) if FileSystems.exists(p.tmp)]
    if pending:
        FileSystems.rename([t for t, _ in pending], [f for _, f in pending])
    missing = [f for f in finals if not FileSystems.exists(f)]
    if missing:
        raise RuntimeError(f"{len(missing)} shard(s) lost before publishing, first {missing[0]}")
    delete_tree(tmp_dir)
    _LOGGER.info("published %d shards as %s-*-of-%05d%s", n, prefix, n, suffix)
    return [
        ShardInfo(path=f, records=p.records, bytes=p.bytes, sha256=p.sha256)
        for f, p in zip(finals, parts, strict=True)
    ]


class WriteShardsBySize(beam.PTransform):
    """In: `(key, records)` batches. Out: a `ShardInfo` per shard, from the bytes as written.

    Each shard holds up to `max_records` records (exact) and stops growing once its compressed
    size reaches `max_bytes` (it may exceed it by at most one batch's worth).
    """

    def __init__(
        self, prefix: str, suffix: str, *, compression: str, level: int, max_bytes: int, max_records: int
    ) -> None:
        super().__init__()
        self._prefix = prefix
        self._suffix = suffix
        self._compression = compression
        self._level = level
        self._max_bytes = max_bytes
        self._max_records = max_records
        # Under the output folder, not hidden: a crashed run's leftovers are visible and cleaned.
        self._tmp_dir = f"{prefix.rsplit('/', 1)[0]}/_tmp-{uuid.uuid4().hex[:12]}"

    def expand(self, batches: beam.PCollection[tuple[Any, pa.Array]]) -> beam.PCollection:
        parts = batches | "WriteParts" >> beam.ParDo(
            _RollingWriteFn(self._tmp_dir, self._compression, self._level, self._max_bytes, self._max_records)
        )
        # _Part: a temporary file with its record count, size and sha256. Published once, with
        # the parts as a side input (one stage; a global combine would add two). Impulse is the
        # one element that starts it: Create([None]) would add three steps to every stage's
        # graph, built by the driver and by each worker.
        return (
            batches.pipeline
            | "Once" >> beam.Impulse()
            | "Publish"
            >> beam.FlatMap(_publish, beam.pvalue.AsList(parts), self._prefix, self._suffix, self._tmp_dir)
        )
