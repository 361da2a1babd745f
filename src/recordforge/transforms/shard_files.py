"""Shard files: the one scheme by which every TFRecord writer names, publishes and cleans up.

A writer (rolling.py, placed.py) owns one temporary folder beside its shards,
`{folder}/_tmp-<12 hex>/`, and writes nothing else until it publishes: every file it makes on the
way (parts, joined parts, whole shards, spilled batches) is `<kind>-<32 hex><ext>` in that folder,
a fresh name per attempt, so that a retried step never meets a file of the attempt it replaces.
A file being written when its step fails is deleted there and then; files of attempts the runner
discarded stay until the publish step, which moves the committed ones to their final names,
`{prefix}-SSSSS-of-NNNNN{suffix}`, checks that every final name exists and deletes the folder
(`publishing.publish_shards`). The folder lies in the run's version folder, so a run that dies
before publishing leaves nothing the publishing protocol does not delete with that folder.

Shards are described by the bytes as written (`HashingFile`): the `ShardInfo` a writer returns is
what `tfrecord.describe_shard` reads back from the file.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa

from recordforge import layout
from recordforge.publishing import publish_shards
from recordforge.storage import delete_files, delete_tree, exists, open_write
from recordforge.streams import HashingFile, Segment, StreamWriter
from recordforge.tfrecord import ShardInfo, framed

__all__ = [
    "ShardFiles",
    "TempShard",
    "abandon",
    "close_stream",
    "open_stream",
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


def abandon(path: str, writer: StreamWriter | None = None) -> None:
    """Deletes a temporary file whose writing failed (closing its handle first, when given);
    one already gone is not an error."""
    with contextlib.suppress(Exception):
        if writer is not None:
            writer.discard()
            writer.file.close()
    with contextlib.suppress(Exception):
        if exists(path):
            delete_files([path])


@dataclass(frozen=True)
class TempShard:
    """A finished temporary shard file, described by the bytes that were written to it."""

    tmp: str
    records: int
    bytes: int
    sha256: str


def open_stream(path: str, compression: str, level: int) -> StreamWriter:
    """A new temporary file at `path`, as a stream of `compression` that hashes what it writes."""
    handle = open_write(path)
    try:
        return StreamWriter(HashingFile(handle), compression, level)  # writes the header
    except BaseException:
        with contextlib.suppress(Exception):
            handle.close()
        abandon(path)
        raise


def close_stream(path: str, writer: StreamWriter, records: int) -> tuple[TempShard, tuple[Segment, ...]]:
    """Ends the stream at `path` and describes it; a failure to end it deletes the file."""
    try:
        segments = writer.close()
    except BaseException:
        abandon(path, writer)
        raise
    return TempShard(path, records, writer.file.bytes, writer.file.hexdigest()), segments


def write_shard(
    path: str, arrays: Iterable[pa.Array], compression: str, level: int
) -> tuple[TempShard, tuple[Segment, ...]]:
    """Writes the arrays of serialized records, in the order given, as one stream at `path`:
    one write per array, so the same arrays give the same bytes. Returns its description and
    segments; a failure deletes the file before it propagates."""
    writer = open_stream(path, compression, level)
    records = 0
    try:
        for array in arrays:
            if not len(array):
                continue
            offsets, data = framed(array)
            # numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
            chunk = memoryview(data[offsets[0] : offsets[-1]])  # type: ignore[arg-type]
            writer.write(chunk, len(array))
            records += len(array)
    except BaseException:
        abandon(path, writer)
        raise
    return close_stream(path, writer, records)


@dataclass(frozen=True)
class ShardFiles:
    """Where one writer's shards go (`{prefix}-SSSSS-of-NNNNN{suffix}`) and its temporary folder.

    Frozen and small: built once at pipeline construction and pickled into every step, so all
    attempts of all steps of one writer share the folder."""

    prefix: str
    suffix: str
    temp_dir: str

    @classmethod
    def beside(cls, prefix: str, suffix: str) -> ShardFiles:
        """Shards named `prefix...suffix`, with a fresh temporary folder in their folder."""
        folder = prefix.rsplit("/", 1)[0]
        return cls(prefix, suffix, layout.temp_dir(folder))

    def final(self, shard: int, count: int) -> str:
        return layout.shard_name(self.prefix, shard, count, self.suffix)

    def temp(self, kind: str, ext: str = layout.TEMP_PART) -> str:
        return temp_path(self.temp_dir, kind, ext)

    def write(self, kind: str, arrays: Iterable[pa.Array], compression: str, level: int) -> TempShard:
        """A whole shard, its arrays in the order given, to a fresh temporary file."""
        return write_shard(self.temp(kind), arrays, compression, level)[0]

    def publish(self, shards: Sequence[TempShard]) -> list[ShardInfo]:
        """Moves `shards` into place as shards 0..n-1, in the order given, and deletes the
        temporary folder with whatever else is in it (files of discarded attempts, spills).

        Idempotent: a shard already moved (a retried publish) is not moved again, and its
        description is the one recorded when it was written. A final name missing afterwards
        is an error: a shard list never disagrees with the files."""
        n = len(shards)
        finals = [self.final(i, n) for i in range(n)]
        publish_shards([(s.tmp, f) for s, f in zip(shards, finals, strict=True)], self.temp_dir)
        _LOGGER.info("published %d shards as %s-*-of-%05d%s", n, self.prefix, n, self.suffix)
        return [
            ShardInfo(path=f, records=s.records, bytes=s.bytes, sha256=s.sha256)
            for f, s in zip(finals, shards, strict=True)
        ]

    def publish_slots(
        self, count: int, written: Iterable[tuple[int, TempShard]], compression: str, level: int
    ) -> list[ShardInfo]:
        """Publishes exactly `count` shards from `(shard, temp)` pairs; a shard no record went
        to is written empty first (shard counts are part of the output's contract)."""
        slots: dict[int, TempShard] = {}
        for shard, temp in written:
            if shard in slots or not 0 <= shard < count:
                raise RuntimeError(f"shard {shard} of {count} written twice or out of range")
            slots[shard] = temp
        return self.publish(
            [slots.get(i) or self.write(f"empty-{i:05d}", [], compression, level) for i in range(count)]
        )

    def cleanup(self) -> int:
        """Deletes the temporary folder and everything in it; returns the files deleted."""
        return delete_tree(self.temp_dir)
