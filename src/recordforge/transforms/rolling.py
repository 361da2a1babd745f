"""The rolling writer: shards cut by size, by record count or into a fixed count, whatever the bundles."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue

from recordforge import interrupts
from recordforge.files import layout
from recordforge.output.pieces import part_record, write_part_record
from recordforge.output.shard_files import ShardFiles, temp_path, write_shard
from recordforge.output.shard_plans import Join, Limits, Part, order, plan, short_parts
from recordforge.records.shard_format import ShardFormat, ShardWriter
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.tfrecord import BatchKey, ShardInfo
from recordforge.tracing.spans import flush as flush_spans
from recordforge.tracing.spans import span

__all__ = ["Limits", "WriteRollingShards"]

_LOGGER = logging.getLogger(__name__)

_REWRITE_BATCH = 8192
# Recording pieces for a rerun, a part that has been open _PIECE_S without filling a shard is
# closed (and recorded) all the same, so that a killed run loses at most that much of each
# worker's work. Such short parts are joined as any (their bytes copied once more), so the time is
# long enough that a worker which fills shards at the usual pace never cuts one: a run that is not
# killed writes the parts, and pays the copies, that it would without recording.
_PIECE_S = 30.0


class _Roller:
    """Streams batches of records into parts of `tmp_dir`, a new part whenever one is full."""

    def __init__(
        self, tmp_dir: str, fmt: ShardFormat, limits: Limits, pieces: tuple[str, str] | None = None
    ) -> None:
        self._tmp_dir = tmp_dir
        self._format = fmt
        self._limits = limits
        self._pieces = pieces  # (folder, writer name): each closed part is recorded there
        self._writer: ShardWriter | None = None

    def _open(self, key: BatchKey | None, first_record: int) -> ShardWriter:
        self._tmp = temp_path(self._tmp_dir, "part")
        self._writer = self._format.open(self._tmp)
        self._records = 0
        self._first_key, self._first_record = key, first_record
        self._keys: list[list[Any]] = []  # [key, start, end]: each batch's records in the part
        self._opened = time.monotonic()
        return self._writer

    def close(self, *, full: bool = False) -> Part | None:
        """The part being written, finished. A full part is never joined: its segments, the
        bulk of what the planning step would otherwise receive, are not kept."""
        if self._writer is None:
            return None
        writer, self._writer = self._writer, None
        temp, segments = writer.close()
        kept = () if full else segments
        part = Part(
            temp.tmp, temp.records, temp.bytes, temp.sha256, self._first_key, kept, self._first_record
        )
        if self._pieces is not None:  # after the part is closed: the record follows the bytes
            folder, name = self._pieces
            # A record index beside the part is published with it: kept only where it is there.
            index = layout.temp_index(part.tmp) if self._format.index else None
            write_part_record(folder, part_record(name, {**part.record(), "index": index}, self._keys))
        return part

    def abandon(self) -> None:
        """Deletes the part being written (its step failed)."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.abandon()

    def add(self, key: BatchKey | None, records: pa.Array, first_record: int = 0) -> Iterator[Part]:
        """Writes `records`, the batch `key`'s from its `first_record` on."""
        try:
            yield from self._add(key, records, first_record)
        except Exception:  # not GeneratorExit: a caller that stops reading leaves the part be
            self.abandon()
            raise

    def _add(self, key: BatchKey | None, records: pa.Array, first_record: int) -> Iterator[Part]:
        limits = self._limits
        with span("frame"):
            framed = self._format.frame(records)
        offsets = framed.offsets
        start, n = 0, len(records)
        while start < n:
            writer = self._writer or self._open(key, first_record + start)
            end = n if not limits.max_records else min(n, start + limits.max_records - self._records)
            # At most one slice's bytes, at least one record.
            fits = int(np.searchsorted(offsets, offsets[start] + limits.slice_bytes, side="right")) - 1
            end = max(start + 1, min(end, fits))
            writer.write(framed, start, end)
            self._records += end - start
            if self._keys and self._keys[-1][0] == key and self._keys[-1][2] == first_record + start:
                self._keys[-1][2] = first_record + end
            else:
                self._keys.append([key, first_record + start, first_record + end])
            start = end
            writer.end_segment()
            full_records = limits.max_records and self._records >= limits.max_records
            if full_records or (limits.max_bytes and writer.holds(limits.max_bytes)):
                yield from filter(None, [self.close(full=True)])
            elif self._pieces is not None and time.monotonic() - self._opened >= _PIECE_S:
                yield from filter(None, [self.close()])


class _RollingWriteFn(beam.DoFn):
    def __init__(
        self, tmp_dir: str, fmt: ShardFormat, limits: Limits, pieces: tuple[str, str] | None = None
    ) -> None:
        self._args = (tmp_dir, fmt, limits, pieces)

    def start_bundle(self) -> None:
        self._roller = _Roller(*self._args)

    def process(self, element: tuple[BatchKey, pa.Array] | tuple[BatchKey, pa.Array, int]) -> Iterator[Part]:
        interrupts.check()  # a safe point per batch, before its records are written
        yield from self._roller.add(*element)

    def finish_bundle(self) -> Iterator[WindowedValue]:
        part = self._roller.close()
        flush_spans()  # the stream's spans, now that it is closed
        if part is not None:
            yield GlobalWindows.windowed_value(part)


def _join(join: Join, tmp_dir: str, fmt: ShardFormat, limits: Limits) -> list[Part]:
    """The shard(s) of one join, as new parts. A join of one whole part is that part, untouched;
    an empty join (a fixed count of shards with fewer segments) is an empty shard. Idempotent: a
    retried join writes its files again under new names; the publish step uses the ones of the
    attempt that succeeded and deletes the temporary folder."""
    tmp = temp_path(tmp_dir, f"joined-{join.index:05d}")
    if not join.pieces:
        empty, segments = write_shard(tmp, [], fmt)
        return [Part(empty.tmp, 0, empty.bytes, empty.sha256, None, segments)]
    first_part, first_segments = join.pieces[0]
    first_key = first_part.first_key
    skipped = first_part.segments[: first_part.segments.index(first_segments[0])] if first_segments else ()
    first_record = first_part.first_record + sum(seg.records for seg in skipped)
    if len(join.pieces) == 1 and join.pieces[0][1] == join.pieces[0][0].segments:
        return [join.pieces[0][0]]
    if not limits.max_records:
        pieces = ((part.tmp, seg) for part, segs in join.pieces for seg in segs)
        with span("join"):
            spliced, segments = fmt.splice(tmp, pieces)
        s = spliced
        return [Part(s.tmp, s.records, s.bytes, s.sha256, first_key, segments, first_record)]
    roller = _Roller(tmp_dir, fmt, limits)
    out: list[Part] = []
    for part, _ in join.pieces:
        batch: list[bytes] = []
        at = part.first_record
        for record in fmt.records(part.tmp):
            batch.append(record)
            if len(batch) == _REWRITE_BATCH:
                out.extend(roller.add(part.first_key, pa.array(batch, pa.large_binary()), at))
                at, batch = at + len(batch), []
        if batch:
            out.extend(roller.add(part.first_key, pa.array(batch, pa.large_binary()), at))
    last = roller.close()
    return [*out, last] if last is not None else out


def _publish(
    _: bytes,
    parts: list[Part],
    joined: list[list[Part]],
    prefix: str,
    fmt: ShardFormat,
    tmp_dir: str,
    limits: Limits,
    pieces: tuple[str, str] | None = None,
) -> list[ShardInfo]:
    """Names the shards in input order (by records, the short one last) and publishes them
    (shard_files.py): leftovers of retried bundles and joined parts go with the temporary folder,
    and a retried publish is harmless. With `pieces`, the shards are recorded there first: the
    parts joined into them go with the temporary folder, and a rerun keeps the shards instead."""
    short = {p.tmp for p in short_parts(parts, limits)}
    shards = [p for p in parts if p.tmp not in short] + [p for group in joined for p in group]
    if limits.sizing is Sizing.RECORDS:
        # The one shard short of `max_records` is named last, whichever worker's part it began in.
        shards.sort(key=lambda p: (p.records < limits.max_records, order(p)))
    else:
        shards.sort(key=order)
    _LOGGER.debug("%s: %d parts, %d joins", prefix, len(parts), len(joined))
    return ShardFiles(prefix, fmt, tmp_dir).publish(shards, pieces=pieces)


def _unheld(
    element: tuple[BatchKey, pa.Array], held: dict[BatchKey, tuple[tuple[int, int], ...]]
) -> Iterator[tuple[BatchKey, pa.Array, int]]:
    """The runs of a batch's records that no kept part holds, each with its first record."""
    key, records = element
    at = 0
    for start, end in (*held.get(tuple(key), ()), (len(records), len(records))):  # type: ignore[arg-type]
        if start > at:
            yield key, records.slice(at, start - at), at
        at = max(at, end)


class WriteRollingShards(beam.PTransform):
    """In: `(key, records)` batches. Out: a `ShardInfo` per shard, from the bytes as written.

    Each worker streams its batches into parts, a new one when a part is full; the short parts
    are then joined by the spec's planner. Sized by records, every shard but one holds
    `max_records` records exactly; by bytes, every shard but one between 75% of `max_bytes` and a
    few percent above it; by count, exactly `count` shards whose compressed sizes differ by less
    than a segment (a batch, or 4 MiB of records). With `pieces` (a folder), each closed part
    is recorded there with the batch ranges it holds (pieces.py); `reused`: such records of a
    killed run's parts, kept by this one and published with its own; `held`: the ranges of
    records of batches converted again that those parts already hold, not written twice.
    """

    def __init__(
        self,
        files: ShardFiles,
        spec: ShardSpec,
        *,
        pieces: str | None = None,
        reused: tuple[dict[str, Any], ...] = (),
        held: dict[BatchKey, tuple[tuple[int, int], ...]] | None = None,
    ) -> None:
        super().__init__()
        if not spec.sizing.rolling:
            raise ValueError(f"the rolling writer takes a rolling sizing, not {spec.sizing.value}")
        self._files = files
        self._limits = Limits.of(spec)
        self._pieces = (pieces, spec.name) if pieces is not None else None
        self._reused = tuple(Part.from_record(r) for r in reused)
        self._held = dict(held or {})

    def expand(self, batches: beam.PCollection[tuple[BatchKey, pa.Array]]) -> beam.PCollection[ShardInfo]:
        tmp, limits, fmt = self._files.temp_dir, self._limits, self._files.format
        if self._held:
            # (key, records, first_record): the records of a batch kept parts do not hold yet
            batches = batches | "SkipHeld" >> beam.FlatMap(_unheld, self._held)
        parts = batches | "WriteParts" >> beam.ParDo(_RollingWriteFn(tmp, fmt, limits, self._pieces))
        if self._reused:
            # Parts a killed run finished (pieces.py), planned and published with this run's.
            kept = batches.pipeline | "ReusedParts" >> beam.Create(list(self._reused), reshuffle=False)
            parts = (parts, kept) | "AllParts" >> beam.Flatten()
        # Part: a temporary file with its records, size, sha256 and segments. Planning and
        # publishing each run once (Impulse's one element) with the parts as a side input; the
        # joins are spread over the workers.
        pipeline = batches.pipeline
        joined = (
            pipeline
            | "OnceToPlan" >> beam.Impulse()
            | "PlanJoins" >> beam.FlatMap(plan, beam.pvalue.AsList(parts), limits)
            | "SpreadJoins" >> beam.Reshuffle()
            | "Join" >> beam.Map(_join, tmp, fmt, limits)
        )
        return (
            pipeline
            | "Once" >> beam.Impulse()
            | "Publish"
            >> beam.FlatMap(
                _publish,
                beam.pvalue.AsList(parts),
                beam.pvalue.AsList(joined),
                self._files.prefix,
                fmt,
                tmp,
                limits,
                self._pieces,
            )
        )
