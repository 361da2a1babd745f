"""Shards by size, whatever the runner's bundles: each worker streams its batches into temporary
parts, starting a new one at the target size or record count. A bundle's last part is usually
short, and runners that make many small bundles (Dataflow) make many such parts: those are joined
into shards of the target size, by copying their compressed segments (streams.py) or, when shards
are counted in records, by rewriting them. A final step names every shard
`data-SSSSS-of-NNNNN` and moves it into place."""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from recordforge.arrays import binary_parts
from recordforge.storage import delete_tree
from recordforge.streams import HashingFile, Segment, StreamWriter, splice
from recordforge.tfrecord import ShardInfo, frame_records, read_records

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


# A part at least this fraction of the target size is a shard as it is; smaller parts are joined.
FULL_FRACTION = 0.75
# Batches are written in slices of at most 1/16 of the target (uncompressed), each ending a
# segment: the flush makes the size on disk exact where a part is checked against the target, so
# a part overshoots it by less than one slice, compressed.
_SLICES_PER_SHARD = 16
_MIN_SLICE = 4 << 10
_REWRITE_BATCH = 8192


@dataclass(frozen=True)
class Limits:
    """When a shard is full: `max_bytes` compressed bytes or `max_records` records (0: no limit)."""

    max_bytes: int
    max_records: int

    @property
    def slice_bytes(self) -> int:
        return max(_MIN_SLICE, self.max_bytes // _SLICES_PER_SHARD) if self.max_bytes else 4 << 20

    def full(self, records: int, size: int) -> bool:
        """A finished shard needs no joining."""
        if self.max_records and records >= self.max_records:
            return True
        if self.max_bytes and size >= FULL_FRACTION * self.max_bytes:
            return True
        return not (self.max_bytes or self.max_records)


@dataclass(frozen=True)
class _Part:
    """A finished temporary shard, described by what was written to it."""

    tmp: str
    records: int
    bytes: int
    sha256: str
    first_key: Any
    segments: tuple[Segment, ...] = ()


class _Roller:
    """Streams batches of records into parts of `tmp_dir`, a new part whenever one is full."""

    def __init__(self, tmp_dir: str, compression: str, level: int, limits: Limits) -> None:
        self._tmp_dir = tmp_dir
        self._compression = compression
        self._level = level
        self._limits = limits
        self._writer: StreamWriter | None = None

    def _open(self, key: Any) -> StreamWriter:
        self._tmp = f"{self._tmp_dir}/{uuid.uuid4().hex}.part"
        handle = FileSystems.create(self._tmp, compression_type=CompressionTypes.UNCOMPRESSED)
        self._writer = StreamWriter(HashingFile(handle), self._compression, self._level)
        self._records = 0
        self._first_key = key
        return self._writer

    def close(self, *, full: bool = False) -> _Part | None:
        """The part being written, finished. A full part is never joined: its segments, the
        bulk of what the planning step would otherwise receive, are not kept."""
        if self._writer is None:
            return None
        file = self._writer.file
        segments = self._writer.close()
        self._writer = None
        return _Part(
            self._tmp, self._records, file.bytes, file.hexdigest(), self._first_key, () if full else segments
        )

    def add(self, key: Any, records: pa.Array) -> Iterator[_Part]:
        limits = self._limits
        offsets, data = binary_parts(frame_records(records))
        start, n = 0, len(records)
        while start < n:
            writer = self._writer or self._open(key)
            end = n if not limits.max_records else min(n, start + limits.max_records - self._records)
            # At most one slice's bytes, at least one record.
            fits = int(np.searchsorted(offsets, offsets[start] + limits.slice_bytes, side="right")) - 1
            end = max(start + 1, min(end, fits))
            writer.write(memoryview(data[offsets[start] : offsets[end]]), end - start)
            self._records += end - start
            start = end
            writer.end_segment()
            full_records = limits.max_records and self._records >= limits.max_records
            if full_records or (limits.max_bytes and writer.file.bytes >= limits.max_bytes):
                yield from filter(None, [self.close(full=True)])


class _RollingWriteFn(beam.DoFn):
    def __init__(self, tmp_dir: str, compression: str, level: int, limits: Limits) -> None:
        self._args = (tmp_dir, compression, level, limits)

    def start_bundle(self) -> None:
        self._roller = _Roller(*self._args)

    def process(self, element: tuple[Any, pa.Array]) -> Iterator[_Part]:
        yield from self._roller.add(*element)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        part = self._roller.close()
        if part is not None:
            yield WindowedValue(part, MIN_TIMESTAMP, [GlobalWindow()])


@dataclass(frozen=True)
class _Join:
    """Parts (or, joining by bytes, segments of parts) that become shards together."""

    index: int
    pieces: tuple[tuple[_Part, tuple[Segment, ...]], ...]

    @property
    def records(self) -> int:
        return sum(seg.records for _, segs in self.pieces for seg in segs)


def _order(part: _Part) -> tuple[Any, str]:
    return (part.first_key, part.tmp)


def _short(parts: Iterable[_Part], limits: Limits) -> list[_Part]:
    """The parts to join: those not full, when there are two or more (one may stay short)."""
    short = sorted((p for p in parts if not limits.full(p.records, p.bytes)), key=_order)
    return short if len(short) > 1 else []


def _plan(_: bytes, parts: list[_Part], limits: Limits) -> Iterator[_Join]:
    """Groups the short parts, in input order, into joins. By bytes: segments are taken in order
    and a join closes once it reaches the target, so every joined shard but the last is within a
    segment of the target. By records, all short parts are rewritten by one join, which cuts at
    exact record counts."""
    short = _short(parts, limits)
    if not short:
        return
    if limits.max_records:
        yield _Join(0, tuple((p, p.segments) for p in short))
        return
    pieces: list[tuple[_Part, tuple[Segment, ...]]] = []
    size, index = 0, 0
    for part in short:
        taken: list[Segment] = []
        for seg in part.segments:
            taken.append(seg)
            size += seg.bytes
            if size >= limits.max_bytes:
                yield _Join(index, (*pieces, (part, tuple(taken))))
                pieces, taken, size, index = [], [], 0, index + 1
        if taken:
            pieces.append((part, tuple(taken)))
    if pieces:
        yield _Join(index, tuple(pieces))


def _join(join: _Join, tmp_dir: str, compression: str, level: int, limits: Limits) -> list[_Part]:
    """The shard(s) of one join, as new parts. A join of one whole part is that part, untouched.
    Idempotent: a retried join writes its files again under new names; the publish step uses the
    ones of the attempt that succeeded and deletes the temporary folder."""
    first_key = join.pieces[0][0].first_key
    if len(join.pieces) == 1 and join.pieces[0][1] == join.pieces[0][0].segments:
        return [join.pieces[0][0]]
    if not limits.max_records:
        tmp = f"{tmp_dir}/joined-{join.index:05d}-{uuid.uuid4().hex[:8]}.part"
        pieces = ((part.tmp, seg) for part, segs in join.pieces for seg in segs)
        records, size, sha, segments = splice(tmp, compression, pieces)
        return [_Part(tmp, records, size, sha, first_key, segments)]
    roller = _Roller(tmp_dir, compression, level, limits)
    out: list[_Part] = []
    for part, _ in join.pieces:
        batch: list[bytes] = []
        for _, record in read_records(part.tmp, compression, check_crc=False):
            batch.append(record)
            if len(batch) == _REWRITE_BATCH:
                out.extend(roller.add(part.first_key, pa.array(batch, pa.large_binary())))
                batch = []
        if batch:
            out.extend(roller.add(part.first_key, pa.array(batch, pa.large_binary())))
    last = roller.close()
    return [*out, last] if last is not None else out


def _publish(
    _: bytes,
    parts: list[_Part],
    joined: list[list[_Part]],
    prefix: str,
    suffix: str,
    tmp_dir: str,
    limits: Limits,
) -> list[ShardInfo]:
    """Names the shards in input order and moves them into place; leftovers of retried bundles
    and joined parts go with the temporary folder. Idempotent: a shard already moved (a retried
    publish) is not moved again, and its description is the one recorded when it was written."""
    short = {p.tmp for p in _short(parts, limits)}
    shards = [p for p in parts if p.tmp not in short] + [p for group in joined for p in group]
    shards.sort(key=_order)
    n = len(shards)
    finals = [f"{prefix}-{i:05d}-of-{n:05d}{suffix}" for i in range(n)]
    pending = [(p.tmp, f) for p, f in zip(shards, finals, strict=True) if FileSystems.exists(p.tmp)]
    if pending:
        FileSystems.rename([t for t, _ in pending], [f for _, f in pending])
    missing = [f for f in finals if not FileSystems.exists(f)]
    if missing:
        raise RuntimeError(f"{len(missing)} shard(s) lost before publishing, first {missing[0]}")
    delete_tree(tmp_dir)
    _LOGGER.info("published %d shards as %s-*-of-%05d%s (%d joined)", n, prefix, n, suffix, len(joined))
    return [
        ShardInfo(path=f, records=p.records, bytes=p.bytes, sha256=p.sha256)
        for f, p in zip(finals, shards, strict=True)
    ]


class WriteShardsBySize(beam.PTransform):
    """In: `(key, records)` batches. Out: a `ShardInfo` per shard, from the bytes as written.

    Every shard but one holds `max_records` records exactly, when that is set, and otherwise
    between 75% of `max_bytes` and a few percent above it, however the runner cut its bundles.
    """

    def __init__(
        self, prefix: str, suffix: str, *, compression: str, level: int, max_bytes: int, max_records: int
    ) -> None:
        super().__init__()
        self._prefix = prefix
        self._suffix = suffix
        self._compression = compression
        self._level = level
        self._limits = Limits(max_bytes, max_records)
        # Under the output folder, not hidden: a crashed run's leftovers are visible and cleaned.
        self._tmp_dir = f"{prefix.rsplit('/', 1)[0]}/_tmp-{uuid.uuid4().hex[:12]}"

    def expand(self, batches: beam.PCollection[tuple[Any, pa.Array]]) -> beam.PCollection:
        tmp, limits = self._tmp_dir, self._limits
        parts = batches | "WriteParts" >> beam.ParDo(
            _RollingWriteFn(tmp, self._compression, self._level, limits)
        )
        # _Part: a temporary file with its records, size, sha256 and segments. Planning and
        # publishing each run once (Impulse's one element) with the parts as a side input; the
        # joins are spread over the workers.
        pipeline = batches.pipeline
        joined = (
            pipeline
            | "OnceToPlan" >> beam.Impulse()
            | "PlanJoins" >> beam.FlatMap(_plan, beam.pvalue.AsList(parts), limits)
            | "SpreadJoins" >> beam.Reshuffle()
            | "Join" >> beam.Map(_join, tmp, self._compression, self._level, limits)
        )
        return (
            pipeline
            | "Once" >> beam.Impulse()
            | "Publish"
            >> beam.FlatMap(
                _publish,
                beam.pvalue.AsList(parts),
                beam.pvalue.AsList(joined),
                self._prefix,
                self._suffix,
                tmp,
                limits,
            )
        )
