"""A split's parts (temporary files of whole records) and how they are joined into shards:
by bytes, by record count or into a fixed count (the rolling writer's planners)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import astuple, dataclass
from typing import Any

from recordforge.output.shard_files import TempShard
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.streams import Segment
from recordforge.records.tfrecord import BatchKey

__all__ = ["FULL_FRACTION", "Join", "Limits", "Part", "order", "plan", "short_parts"]

# A part at least this fraction of the target size is a shard as it is; smaller parts are joined.
FULL_FRACTION = 0.75
# Batches are written in slices of at most 1/16 of the target (uncompressed), each ending a
# segment: the flush makes the size on disk exact where a part is checked against the target, so
# a part overshoots it by less than one slice, compressed.
_SLICES_PER_SHARD = 16
_MIN_SLICE = 4 << 10


@dataclass(frozen=True)
class Limits:
    """When a shard is full: `max_bytes` compressed bytes or `max_records` records (0: no limit);
    or, with `num_shards`, exactly that many shards of about equal bytes (the parts uncut)."""

    max_bytes: int
    max_records: int
    num_shards: int = 0

    @classmethod
    def of(cls, spec: ShardSpec) -> Limits:
        return cls(spec.max_bytes, spec.max_records, spec.count if spec.sizing is Sizing.COUNT else 0)

    @property
    def sizing(self) -> Sizing:
        if self.num_shards:
            return Sizing.COUNT
        return Sizing.RECORDS if self.max_records else Sizing.BYTES

    @property
    def slice_bytes(self) -> int:
        return max(_MIN_SLICE, self.max_bytes // _SLICES_PER_SHARD) if self.max_bytes else 4 << 20

    def full(self, records: int, size: int) -> bool:
        """A finished shard needs no joining."""
        if self.num_shards:
            return False
        if self.max_records and records >= self.max_records:
            return True
        if self.max_bytes and size >= FULL_FRACTION * self.max_bytes:
            return True
        return not (self.max_bytes or self.max_records)


@dataclass(frozen=True)
class Part(TempShard):
    """A finished temporary shard, described by what was written to it and where its records
    come from."""

    first_key: BatchKey | None  # None: an empty shard of a fixed count
    segments: tuple[Segment, ...] = ()
    # Where in its first batch the part starts (records before it there): parts that start in
    # one batch (cut by a full part, or joins cut from one part) follow each other by it.
    first_record: int = 0

    def record(self) -> dict[str, Any]:
        """As JSON, for the run's record of finished pieces (pieces.py)."""
        return {
            "tmp": self.tmp,
            "records": self.records,
            "bytes": self.bytes,
            "sha256": self.sha256,
            "first_key": None if self.first_key is None else list(self.first_key),
            "segments": [list(astuple(g)) for g in self.segments],
            "first_record": self.first_record,
        }

    @classmethod
    def from_record(cls, r: dict[str, Any]) -> Part:
        key = r["first_key"]
        return cls(
            r["tmp"],
            r["records"],
            r["bytes"],
            r["sha256"],
            None if key is None else (key[0], key[1], key[2]),
            tuple(Segment(*g) for g in r["segments"]),
            r["first_record"],
        )


@dataclass(frozen=True)
class Join:
    """Parts (or, joining by bytes, segments of parts) that become shards together."""

    index: int
    pieces: tuple[tuple[Part, tuple[Segment, ...]], ...]

    @property
    def records(self) -> int:
        return sum(seg.records for _, segs in self.pieces for seg in segs)


def order(part: Part) -> tuple[bool, BatchKey | tuple[()], int, str]:
    """Input order: by first batch, then where in it the part starts (never by the temporary
    names, which are random); the empty shards of a fixed count (no first key) last."""
    first = () if part.first_key is None else part.first_key
    return (part.first_key is None, first, part.first_record, part.tmp)


def short_parts(parts: Iterable[Part], limits: Limits) -> list[Part]:
    """The parts to join: those not full, when there are two or more (one may stay short); for a
    fixed count of shards, every part."""
    short = sorted((p for p in parts if not limits.full(p.records, p.bytes)), key=order)
    return short if len(short) > 1 or limits.num_shards else []


def _plan_count(parts: list[Part], count: int) -> Iterator[Join]:
    """Exactly `count` joins: the parts' segments in input order, segment i of the join whose
    share of the bytes (k/count of them) it starts in, so joins differ by less than a segment.
    Joins no segment went to (fewer segments than shards) come last, empty."""
    segments = [(part, seg) for part in parts for seg in part.segments]
    total = max(1, sum(seg.bytes for _, seg in segments))
    cuts: dict[int, list[tuple[Part, list[Segment]]]] = {}
    at = 0
    for part, seg in segments:
        pieces = cuts.setdefault(min(count - 1, at * count // total), [])
        if pieces and pieces[-1][0] is part:
            pieces[-1][1].append(seg)
        else:
            pieces.append((part, [seg]))
        at += seg.bytes
    for index, (_, pieces) in enumerate(sorted(cuts.items())):
        yield Join(index, tuple((part, tuple(segs)) for part, segs in pieces))
    for index in range(len(cuts), count):
        yield Join(index, ())


def _plan_records(parts: list[Part], limits: Limits) -> Iterator[Join]:
    """All short parts rewritten by one join, which cuts at exact record counts: every shard but
    one holds `max_records`, however many workers wrote parts."""
    if parts:
        yield Join(0, tuple((p, p.segments) for p in parts))


def _plan_bytes(parts: list[Part], limits: Limits) -> Iterator[Join]:
    """Segments taken in input order, a join closed once it reaches `max_bytes`: every joined
    shard but the last is within a segment of the target."""
    pieces: list[tuple[Part, tuple[Segment, ...]]] = []
    size, index = 0, 0
    for part in parts:
        taken: list[Segment] = []
        for seg in part.segments:
            taken.append(seg)
            size += seg.bytes
            if size >= limits.max_bytes:
                yield Join(index, (*pieces, (part, tuple(taken))))
                pieces, taken, size, index = [], [], 0, index + 1
        if taken:
            pieces.append((part, tuple(taken)))
    if pieces:
        yield Join(index, tuple(pieces))


_PLANNERS: dict[Sizing, Callable[[list[Part], Limits], Iterator[Join]]] = {
    Sizing.BYTES: _plan_bytes,
    Sizing.RECORDS: _plan_records,
    Sizing.COUNT: lambda parts, limits: _plan_count(parts, limits.num_shards),
}


def plan(_: bytes, parts: list[Part], limits: Limits) -> Iterator[Join]:
    """Groups the short parts, in input order, into joins, by the sizing's planner."""
    return _PLANNERS[limits.sizing](short_parts(parts, limits), limits)
