"""Shard files: the one scheme by which every shard writer names, publishes and cleans up.

A writer (rolling.py, placed.py) owns one temporary folder beside its shards,
`{folder}/_tmp-<12 hex>/`, and writes nothing else until it publishes: every file it makes on the
way (parts, joined parts, whole shards, spilled batches) is `<kind>-<32 hex><ext>` in that folder,
a fresh name per attempt, so that a retried step never meets a file of the attempt it replaces.
A file being written when its step fails is deleted there and then; files of attempts the runner
discarded stay until the publish step, which moves the committed ones to their final names,
`{prefix}-SSSSS-of-NNNNN{suffix}`, checks that every final name exists and deletes the folder
(`publishing.publish_shards`). The folder lies in the run's version folder, so a run that dies
before publishing leaves nothing the publishing protocol does not delete with that folder.

Shards are described by the bytes as written: the `ShardInfo` a writer returns is what
`tfrecord.describe_shard` reads back from the file. What a shard file holds and how it is written
is its format's (shard_format.py); an index beside a shard is named, moved and published with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from recordforge.files import layout
from recordforge.files.storage import delete_tree
from recordforge.output.pieces import write_published_record
from recordforge.output.publishing import publish_shards
from recordforge.records.shard_format import ShardFormat, TempShard, abandon
from recordforge.records.streams import Segment
from recordforge.records.tfrecord import ShardInfo

__all__ = [
    "ShardFiles",
    "TempShard",
    "abandon",
    "shard_prefix",
    "temp_path",
    "write_shard",
]

_LOGGER = logging.getLogger(__name__)


def shard_prefix(folder: str, name: str = "data") -> str:
    """The common start of a writer's shard names (`layout.shard_prefix`)."""
    return layout.shard_prefix(folder, name)


def temp_path(temp_dir: str, kind: str, ext: str = layout.TEMP_PART) -> str:
    """A fresh temporary name in `temp_dir` (`layout.temp_file`)."""
    return layout.temp_file(temp_dir, kind, ext)


def write_shard(
    path: str, arrays: Iterable[pa.Array], fmt: ShardFormat
) -> tuple[TempShard, tuple[Segment, ...]]:
    """Writes the arrays of serialized records, in the order given, as one shard at `path`:
    one write per array, so the same arrays give the same bytes. Returns its description and
    segments; a failure deletes the file before it propagates."""
    writer = fmt.open(path)
    try:
        for array in arrays:
            if len(array):
                writer.write(fmt.frame(array), 0, len(array))
    except BaseException:
        writer.abandon()
        raise
    return writer.close()


@dataclass(frozen=True)
class ShardFiles:
    """Where one writer's shards go (`{prefix}-SSSSS-of-NNNNN{suffix}`), in which format, and its
    temporary folder.

    Frozen and small: built once at pipeline construction and pickled into every step, so all
    attempts of all steps of one writer share the folder."""

    prefix: str
    format: ShardFormat
    temp_dir: str

    @classmethod
    def beside(cls, prefix: str, fmt: ShardFormat) -> ShardFiles:
        """Shards named `prefix...suffix`, with a fresh temporary folder in their folder."""
        folder = prefix.rsplit("/", 1)[0]
        return cls(prefix, fmt, layout.temp_dir(folder))

    @property
    def suffix(self) -> str:
        return self.format.suffix

    def final(self, shard: int, count: int) -> str:
        return layout.shard_name(self.prefix, shard, count, self.suffix)

    def temp(self, kind: str, ext: str = layout.TEMP_PART) -> str:
        return temp_path(self.temp_dir, kind, ext)

    def write(self, kind: str, arrays: Iterable[pa.Array]) -> TempShard:
        """A whole shard, its arrays in the order given, to a fresh temporary file."""
        return write_shard(self.temp(kind), arrays, self.format)[0]

    def publish(
        self, shards: Sequence[TempShard], *, pieces: tuple[str, str] | None = None
    ) -> list[ShardInfo]:
        """Moves `shards` into place as shards 0..n-1, in the order given (with their indexes),
        and deletes the temporary folder with whatever else is in it (files of discarded
        attempts, spills). With `pieces` (the run's record of pieces, the writer's name), what
        each final name will hold is recorded there first, for a rerun (pieces.py).

        Idempotent: a shard already moved (a retried publish) is not moved again, and its
        description is the one recorded when it was written. A final name missing afterwards
        is an error: a shard list never disagrees with the files."""
        n = len(shards)
        finals = [self.final(i, n) for i in range(n)]
        moves = list(zip([s.tmp for s in shards], finals, strict=True))
        indexes: list[str | None] = [None] * n
        if self.format.index:
            indexes = [layout.shard_name(self.prefix, i, n, layout.INDEX_SUFFIX) for i in range(n)]
            moves += [(layout.temp_index(s.tmp), i) for s, i in zip(shards, indexes, strict=True) if i]
        infos = [
            ShardInfo(path=f, records=s.records, bytes=s.bytes, sha256=s.sha256, index=i)
            for f, s, i in zip(finals, shards, indexes, strict=True)
        ]
        if pieces is not None:
            folder, writer = pieces
            write_published_record(folder, writer, [_described(info) for info in infos])
        publish_shards(moves, self.temp_dir)
        _LOGGER.info("published %d shards as %s-*-of-%05d%s", n, self.prefix, n, self.suffix)
        return infos

    def publish_slots(
        self, count: int, written: Iterable[tuple[int, TempShard]], *, pieces: tuple[str, str] | None = None
    ) -> list[ShardInfo]:
        """Publishes exactly `count` shards from `(shard, temp)` pairs; a shard no record went
        to is written empty first (shard counts are part of the output's contract)."""
        slots: dict[int, TempShard] = {}
        for shard, temp in written:
            if shard in slots or not 0 <= shard < count:
                raise RuntimeError(f"shard {shard} of {count} written twice or out of range")
            slots[shard] = temp
        filled = [slots.get(i) or self.write(f"empty-{i:05d}", []) for i in range(count)]
        return self.publish(filled, pieces=pieces)

    def cleanup(self) -> int:
        """Deletes the temporary folder and everything in it; returns the files deleted."""
        return delete_tree(self.temp_dir)


def _described(info: ShardInfo) -> dict[str, Any]:
    """A shard as its writer's record of publishing lists it (pieces.write_published_record)."""
    return {
        "file": info.path,
        "records": info.records,
        "bytes": info.bytes,
        "sha256": info.sha256,
        "index": info.index,
    }
