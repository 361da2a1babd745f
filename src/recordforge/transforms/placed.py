"""The placed writer: every record given a global place, shard s of S holding [sN/S, (s+1)N/S)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge import interrupts
from recordforge.files import layout
from recordforge.output.placed_pieces import PlacedKeep, write_shard_record
from recordforge.output.shard_files import ShardFiles, TempShard
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.tfrecord import BatchKey, ShardInfo
from recordforge.transforms.shuffle import ScatterRecords, ordered_pieces, sorted_records

__all__ = ["write_placed"]


class _WriteShardFn(beam.DoFn):
    """One whole shard, from its pieces, to a temporary file of the writer's: placed by
    position, each piece (a run of a batch) written apart, in order, so that a shard of whole
    batches is written as those batches; shuffled, the records in the order of their places."""

    def __init__(
        self, files: ShardFiles, *, shuffled: bool, pieces: tuple[str, str, int] | None = None
    ) -> None:
        self._files = files
        self._shuffled = shuffled
        self._pieces = pieces  # (folder, writer, shard count): each shard written is recorded there

    def process(self, element: tuple[int, Iterable[pa.Array | str]]) -> Iterator[tuple[int, TempShard]]:
        shard, pieces = element
        interrupts.check()  # a safe point per shard, before it is written
        arrays: list[pa.Array] = [sorted_records(pieces)] if self._shuffled else ordered_pieces(pieces)
        temp = self._files.write(f"shard-{shard:05d}", arrays)
        if self._pieces is not None:  # after the shard is written: the record follows the bytes
            folder, writer, count = self._pieces
            index = layout.temp_index(temp.tmp) if self._files.format.index else None
            described = {"tmp": temp.tmp, "records": temp.records, "bytes": temp.bytes, "sha256": temp.sha256}
            write_shard_record(folder, writer, shard, count, {**described, "index": index})
        yield shard, temp


def _publish_slots(
    _: bytes,
    written: list[tuple[int, TempShard]],
    files: ShardFiles,
    count: int,
    kept: tuple[tuple[int, dict[str, Any]], ...],
    pieces: tuple[str, str] | None = None,
) -> list[ShardInfo]:
    finished = [(s, TempShard(r["tmp"], r["records"], r["bytes"], r["sha256"])) for s, r in kept]
    return files.publish_slots(count, [*written, *finished], pieces=pieces)


def write_placed(
    batches: beam.PCollection[tuple[BatchKey, pa.Array]],
    files: ShardFiles,
    spec: ShardSpec,
    *,
    spill: bool,
    pieces: str | None = None,
    keep: PlacedKeep | None = None,
) -> beam.PCollection[ShardInfo]:
    """The placed writer's steps, applied within the caller's transform (WriteTFRecords), so
    that its grouping is `<writer>/GroupShards`, one per split.

    In: `((split, file, first_row), records)` batches of one split. Out: a `ShardInfo` per
    shard, exactly `spec.count` of them (those no record went to written empty). A record's
    place is its position among the split's records (files in path order, then its rank in its
    file), or with `spec.seed` that position permuted (shuffle.py): the shards' bytes are a
    function of the input and the spec, on any runner and worker count. `spill` (the runner
    holds a grouping's input in memory): batches and pieces wait in files of the writer's
    temporary folder and the grouping holds their names. With `pieces` (a folder), the layout
    and each shard written are recorded there for a rerun; `keep`: what this run keeps of a
    killed one, whose shards are published with this run's, not written again (placed_pieces.py).
    """
    if spec.sizing is not Sizing.PLACED:
        raise ValueError(f"the placed writer takes placed sizing, not {spec.sizing.value}")
    spill_dir = files.temp_dir if spill else None
    shuffled = spec.seed is not None
    # The writer's name salts the permutation: splits are shuffled independently.
    recorded = (pieces, spec.name) if pieces is not None else None
    scatter = ScatterRecords(
        spec.count, spec.seed, salt=spec.name, spill_dir=spill_dir, pieces=recorded, keep=keep
    )
    shard_records = (pieces, spec.name, spec.count) if pieces is not None else None
    writer = _WriteShardFn(files, shuffled=shuffled, pieces=shard_records)
    written = (
        batches
        | ("Shuffle" if shuffled else "Place") >> scatter
        # (shard, piece of (place, record) pairs, or its file): one group per shard, written by
        # whichever worker gets it, every shard in parallel; a kept shard gets none.
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(writer)
    )
    # (shard, TempShard): published together once every shard is written; the temporary folder
    # (spills too) goes then.
    return (
        batches.pipeline
        | "Once" >> beam.Impulse()
        | "Publish"
        >> beam.FlatMap(
            _publish_slots,
            beam.pvalue.AsList(written),
            files,
            spec.count,
            keep.shards if keep else (),
            recorded,  # the shards are recorded there before they are moved into place
        )
    )
