"""Sinks: sharded TFRecord files from batches of serialized examples."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge.tfrecord import Compression, ShardInfo
from recordforge.transforms.beam_sink import write_with_beam
from recordforge.transforms.rolling import DEFAULT_SHARD_SIZE, WriteShardsBySize
from recordforge.transforms.shard_files import ShardFiles, TempShard, shard_prefix
from recordforge.transforms.sharing import holds_in_memory
from recordforge.transforms.shuffle import (
    DEFAULT_SEED,
    ScatterRecords,
    SpillBatches,
    read_spilled,
    sorted_records,
)

__all__ = ["DEFAULT_LEVEL", "SINKS", "WriteTFRecords"]

# "beam" is beam.io.WriteToTFRecord, kept only as the benchmark's comparison (beam_sink.py).
SINKS = ("fast", "beam")
# ISA-L levels run 0-3; level 1 measured best for throughput at a few percent larger output.
DEFAULT_LEVEL = 1

_LOGGER = logging.getLogger(__name__)


class _AssignShardFn(beam.DoFn):
    """Shard by the batch's position in the input: rows of the files before its file (in path
    order, the keys' order) plus its first row, over all rows. Shards are then contiguous runs of
    the input of about equal rows, a pure function of the input, without a global list of keys.

    `file_rows` (a side input) holds, per file, the end row of its last batch."""

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards
        self._seen: tuple[int, dict[str, int], int] | None = None

    def _offsets(self, file_rows: dict[str, int]) -> tuple[dict[str, int], int]:
        if self._seen is None or self._seen[0] != id(file_rows):
            offsets, total = {}, 0
            for name in sorted(file_rows):
                offsets[name] = total
                total += file_rows[name]
            self._seen = (id(file_rows), offsets, total)
        return self._seen[1], self._seen[2]

    def process(
        self, keyed: tuple[Any, pa.Array], file_rows: dict[str, int]
    ) -> Iterator[tuple[int, tuple[Any, pa.Array]]]:
        (_, file, first_row), _records = keyed
        offsets, total = self._offsets(file_rows)
        yield (
            min(self._num_shards - 1, (offsets[file] + first_row) * self._num_shards // max(total, 1)),
            keyed,
        )


class _WriteShardFn(beam.DoFn):
    """One whole shard to a temporary file of the writer's (shard_files.py): deterministic, its
    batches in key order (input order); shuffled, its records in the order of their places
    (shuffle.py)."""

    def __init__(self, files: ShardFiles, compression: str, level: int, *, shuffled: bool) -> None:
        self._files = files
        self._compression = compression
        self._level = level
        self._shuffled = shuffled

    def process(self, element: tuple[int, Iterable[Any]]) -> Iterator[tuple[int, TempShard]]:
        shard, group = element
        if self._shuffled:
            arrays: Iterable[pa.Array] = [sorted_records(group)]
        else:
            ordered = sorted(group, key=lambda kv: kv[0])  # records, or their spilled files
            arrays = (read_spilled(r) for _, r in ordered)
        yield shard, self._files.write(f"shard-{shard:05d}", arrays, self._compression, self._level)


def _publish_slots(
    _: bytes,
    written: list[tuple[int, TempShard]],
    files: ShardFiles,
    count: int,
    compression: str,
    level: int,
) -> list[ShardInfo]:
    return files.publish_slots(count, written, compression, level)


class WriteTFRecords(beam.PTransform):
    """Writes batches of serialized examples as `{output}/data-SSSSS-of-NNNNN.tfrecord[.gz]`.

    In: `(key, records)`: large_binary arrays of serialized records keyed by (file, first_row).
    Out: a `ShardInfo` per written shard (records, bytes, sha256 of the bytes as written).
    The fast sink frames batches vectorised and deflates with ISA-L at `compression_level`, and
    names, publishes and cleans up its files by one protocol (shard_files.py): temporary files
    in a folder beside the shards, moved into place once all are written, the folder deleted.
    With `num_shards=0` (default) shards are cut at `shard_size` compressed bytes or
    `records_per_shard` records; with `num_shards`, exactly that many of about equal size (both
    rolling.py). `deterministic=True` writes exactly `num_shards` shards, each holding a
    contiguous run of the input in key order, placed by `file_rows` ((file, end row of its last
    batch) pairs): the same input and config give the same bytes on any runner. Each shard is
    written by one worker, which holds that shard's batches in memory to sort them.
    `shuffle=True` writes exactly `num_shards` shards too, the records in a permutation drawn
    from `seed` (shuffle.py), with the same guarantee: deterministic output, shuffled.
    `sink="beam"` is `beam.io.WriteToTFRecord`, kept only as the benchmark's comparison
    (beam_sink.py). Invalid combinations raise `ValueError` here, when the pipeline is built.
    """

    def __init__(
        self,
        output: str,
        *,
        compression: str = "gzip",
        num_shards: int = 0,
        sink: str = "fast",
        compression_level: int = DEFAULT_LEVEL,
        deterministic: bool = False,
        shard_size: int = DEFAULT_SHARD_SIZE,
        records_per_shard: int = 0,
        name: str = "data",
        file_rows: beam.PCollection[tuple[str, int]] | None = None,
        shuffle: bool = False,
        seed: int = DEFAULT_SEED,
    ) -> None:
        super().__init__()
        if sink not in SINKS:
            raise ValueError(f"sink must be one of {SINKS}, not {sink!r}")
        if shuffle and (sink != "fast" or num_shards < 1):
            raise ValueError("shuffled output needs the fast sink and a fixed num_shards >= 1")
        if deterministic and sink != "fast":
            raise ValueError("deterministic output needs the fast sink")
        if deterministic and num_shards < 1:
            raise ValueError("deterministic output needs a fixed num_shards >= 1")
        if deterministic and not shuffle and file_rows is None:
            raise ValueError("deterministic output needs file_rows: the end row of every input file")
        if not 0 <= compression_level <= 3:
            raise ValueError(f"compression_level must be 0-3 (ISA-L levels), not {compression_level}")
        if compression not in Compression.CHOICES:
            raise ValueError(f"compression must be one of {Compression.CHOICES}, not {compression!r}")
        if num_shards < 0:
            raise ValueError(f"num_shards must be >= 0, not {num_shards}")
        if num_shards and records_per_shard:
            raise ValueError("records_per_shard does not combine with a fixed num_shards")
        self._output = output
        self._name = name
        self._compression = compression
        self._num_shards = num_shards
        self._sink = sink
        self._level = compression_level
        self._deterministic = deterministic
        self._shard_size = shard_size
        self._records_per_shard = records_per_shard
        self._file_rows = file_rows
        self._shuffle = shuffle
        self._seed = seed

    def expand(self, batches: beam.PCollection[tuple[Any, pa.Array]]) -> beam.PCollection[ShardInfo]:
        prefix = shard_prefix(self._output, self._name)
        suffix = Compression.suffix(self._compression)
        if self._sink == "beam":
            return write_with_beam(
                batches, prefix, suffix, num_shards=self._num_shards, compression=self._compression
            )
        files = ShardFiles.beside(prefix, suffix)
        if not (self._shuffle or self._deterministic):
            # Shards by size, or exactly num_shards of about equal size; described as written.
            counted = self._num_shards > 0
            return batches | ("WriteByCount" if counted else "WriteBySize") >> WriteShardsBySize(
                files,
                compression=self._compression,
                level=self._level,
                max_bytes=0 if counted else self._shard_size,
                max_records=self._records_per_shard,
                num_shards=self._num_shards,
            )
        # Beam's local runners hold a grouping's input in memory: there the batches (or pieces)
        # wait in files of the writer's temporary folder and the grouping holds their names.
        spill = files.temp_dir if holds_in_memory(batches.pipeline) else None
        if self._shuffle:
            grouped = (
                batches
                # The split's name salts the permutation: splits are shuffled independently.
                | "Shuffle" >> ScatterRecords(self._num_shards, self._seed, salt=self._name, spill_dir=spill)
                # (shard, pieces of (place, record)) or their files: one group per shard, as below.
                | "GroupShards" >> beam.GroupByKey()
            )
        else:
            if spill is not None:
                batches = batches | "SpillBatches" >> SpillBatches(spill)
            grouped = (
                batches
                | "AssignShards"
                >> beam.ParDo(_AssignShardFn(self._num_shards), beam.pvalue.AsDict(self._file_rows))
                # (shard, ((split, file, first_row), records)): one group per shard, written by
                # whichever worker gets it, every shard in parallel.
                | "GroupShards" >> beam.GroupByKey()
            )
        write = _WriteShardFn(files, self._compression, self._level, shuffled=self._shuffle)
        written = grouped | "WriteShards" >> beam.ParDo(write)
        # (shard, TempShard): published together, once every shard is written, with the shards
        # no record went to written empty; the temporary folder (spills too) goes then.
        return (
            batches.pipeline
            | "Once" >> beam.Impulse()
            | "Publish"
            >> beam.FlatMap(
                _publish_slots,
                beam.pvalue.AsList(written),
                files,
                self._num_shards,
                self._compression,
                self._level,
            )
        )
