"""A writer whose shards a killed run published: they are handed on as they are, its records dropped."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge.records.tfrecord import BatchKey, ShardInfo

__all__ = ["KeepPublished"]


class KeepPublished(beam.PTransform):
    """In: the writer's `(key, records)` batches, those a rerun converts again (a batch the
    ledger did not record): the kept shards hold their records already, so they are dropped.
    Out: a `ShardInfo` per kept shard, as the killed run recorded it before publishing and the
    rerun checked it (output/pieces.py: size, sha256, record index)."""

    def __init__(self, shards: tuple[dict[str, Any], ...]) -> None:
        super().__init__()
        self._shards = [
            ShardInfo(
                path=s["file"], records=s["records"], bytes=s["bytes"], sha256=s["sha256"], index=s["index"]
            )
            for s in shards
        ]

    def expand(self, batches: beam.PCollection[tuple[BatchKey, pa.Array]]) -> beam.PCollection[ShardInfo]:
        dropped = batches | "DropHeld" >> beam.FlatMap(_nothing)
        kept = batches.pipeline | "KeptShards" >> beam.Create(self._shards, reshuffle=False)
        # ShardInfo: each kept shard, once
        return (dropped, kept) | "Shards" >> beam.Flatten()


def _nothing(_: object) -> list[ShardInfo]:
    return []
