"""Sinks: sharded TFRecord files from batches of serialized examples."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import coders
from apache_beam.io import filebasedsink
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.arrays import binary_parts
from recordforge.storage import delete_tree
from recordforge.streams import HashingFile, StreamWriter
from recordforge.tfrecord import Compression, ShardInfo, describe_shard, frame_records
from recordforge.transforms.rolling import DEFAULT_SHARD_SIZE, WriteShardsBySize
from recordforge.transforms.shuffle import (
    DEFAULT_SEED,
    ScatterRecords,
    SpillBatches,
    read_spilled,
    sorted_records,
)

__all__ = ["SINKS", "WriteTFRecords", "shard_prefix"]

SINKS = ("fast", "beam")
# ISA-L levels run 0-3; level 1 measured best for throughput at a few percent larger output.
DEFAULT_LEVEL = 1

_LOGGER = logging.getLogger(__name__)
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"


def shard_prefix(output: str, name: str = "data") -> str:
    return output.rstrip("/") + "/" + name


def _records(keyed: tuple[Any, pa.Array]) -> Iterator[bytes]:
    # WriteToTFRecord takes one element per record: this is where batches become records.
    return iter(keyed[1].to_pylist())


def _values(keyed: tuple[Any, pa.Array]) -> pa.Array:
    return keyed[1]


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


class _ShardWriter:
    """Writes one whole shard, batches in key order, to a temporary name, then renames it."""

    def __init__(self, prefix: str, suffix: str, num_shards: int, compression: str, level: int):
        self.num_shards = num_shards
        self._prefix = prefix
        self._suffix = suffix
        self._compression = compression
        self._level = level

    def name(self, shard: int) -> str:
        return f"{self._prefix}-{shard:05d}-of-{self.num_shards:05d}{self._suffix}"

    def write(self, shard: int, arrays: Iterable[pa.Array]) -> str:
        """Writes the arrays of records, in the order given, as shard `shard`."""
        final = self.name(shard)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        handle = FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED)
        writer = StreamWriter(HashingFile(handle), self._compression, self._level)
        for records in arrays:
            if not len(records):
                continue
            offsets, data = binary_parts(frame_records(records))
            writer.write(memoryview(data[offsets[0] : offsets[-1]]), len(records))
        writer.close()
        if FileSystems.exists(final):
            FileSystems.delete([final])
        FileSystems.rename([tmp], [final])
        return final


class _WriteShardFn(beam.DoFn):
    """A deterministic shard: its batches in key order (input order)."""

    def __init__(self, writer: _ShardWriter) -> None:
        self._writer = writer

    def process(self, element: tuple[int, Iterable[tuple[Any, pa.Array]]]) -> Iterator[str]:
        shard, batches = element
        ordered = sorted(batches, key=lambda kv: kv[0])  # records, or their spilled files
        yield self._writer.write(shard, (read_spilled(r) for _, r in ordered))


class _WriteShuffledShardFn(beam.DoFn):
    """A shuffled shard: its records in the order of their places (shuffle.py)."""

    def __init__(self, writer: _ShardWriter) -> None:
        self._writer = writer

    def process(self, element: tuple[int, Iterable[pa.Array]]) -> Iterator[str]:
        shard, pieces = element
        yield self._writer.write(shard, [sorted_records(pieces)])


class _WriteEmptyShardsFn(beam.DoFn):
    """Deterministic mode writes every shard, also those no batch was assigned to."""

    def __init__(self, writer: _ShardWriter) -> None:
        self._writer = writer

    def process(self, written: list[str]) -> Iterator[str]:
        for shard in range(self._writer.num_shards):
            if self._writer.name(shard) not in written:
                yield self._writer.write(shard, [])


def _with_empty_shards(written: beam.PCollection[str], writer: _ShardWriter) -> beam.PCollection[str]:
    """The shards written, and the shards no record went to, written empty."""
    empty = (
        written
        | "WrittenNames" >> beam.combiners.ToList()
        | "WriteEmptyShards" >> beam.ParDo(_WriteEmptyShardsFn(writer))
    )
    return (written, empty) | "AllShards" >> beam.Flatten()


def in_memory_runner(pipeline: beam.Pipeline) -> bool:
    """Beam's local runners (RecordForge's among them) hold a stage's input, and a GroupByKey's,
    in memory; Dataflow and Dask keep them on disk."""
    from apache_beam.runners.direct.direct_runner import DirectRunner
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    return isinstance(pipeline.runner, FnApiRunner | DirectRunner)


def _delete_then(_: bytes, shards: list[ShardInfo], folder: str) -> list[ShardInfo]:
    delete_tree(folder)
    return shards


class _TFRecordBatchSink(filebasedsink.FileBasedSink):
    """Beam's file-based sink machinery (temporary files, finalisation, shard names, retries),
    fed whole batches of serialized examples: framing is vectorised and deflate is ISA-L."""

    def __init__(self, prefix: str, suffix: str, num_shards: int, compression: str, level: int) -> None:
        super().__init__(
            prefix,
            coder=coders.BytesCoder(),  # unused: write_record takes whole batches
            file_name_suffix=suffix,
            num_shards=num_shards,
            shard_name_template=SHARD_TEMPLATE,
            mime_type="application/octet-stream",
            compression_type=CompressionTypes.UNCOMPRESSED,  # we deflate ourselves
        )
        self._compression = compression
        self._level = level

    def open(self, temp_path: str) -> StreamWriter:
        return StreamWriter(HashingFile(super().open(temp_path)), self._compression, self._level)

    def write_record(self, file_handle: StreamWriter, value: pa.Array) -> None:
        offsets, data = binary_parts(frame_records(value))
        file_handle.write(memoryview(data[offsets[0] : offsets[-1]]), len(value))


class _DescribeShardFn(beam.DoFn):
    def __init__(self, compression: str) -> None:
        self._compression = compression

    def process(self, path: str) -> Iterator[ShardInfo]:
        info = describe_shard(path, self._compression)
        _LOGGER.info("%s: %d records, %d bytes", path, info.records, info.bytes)
        yield info


class WriteTFRecords(beam.PTransform):
    """Writes batches of serialized examples as `{output}/data-SSSSS-of-NNNNN.tfrecord[.gz]`.

    In: `(key, records)`: large_binary arrays of serialized records keyed by (file, first_row).
    Out: a `ShardInfo` per written shard (records, bytes, sha256). With `num_shards=0` (default)
    and the fast sink, shards are cut at `shard_size` compressed bytes or `records_per_shard`
    records and described from the bytes as written; otherwise whole batches go through Beam's
    file-based sink into exactly `num_shards` shards, described by re-reading the files. The fast
    sink frames batches vectorised and deflates with ISA-L at `compression_level`; `sink="beam"`
    is `beam.io.WriteToTFRecord`,
    one element per record, zlib level 6. `deterministic=True` writes exactly `num_shards` shards,
    each holding a contiguous run of the input in key order, placed by `file_rows` ((file, end row
    of its last batch) pairs): the same input and config give the same bytes on any runner. Each
    shard is written by one worker, which holds that shard's batches in memory to sort them.
    `shuffle=True` writes exactly `num_shards` shards too, the records in a permutation drawn
    from `seed` (shuffle.py), with the same guarantee: deterministic output, shuffled.
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
        self._name = name
        self._shuffle = shuffle
        self._seed = seed
        if shuffle and (sink != "fast" or num_shards < 1):
            raise ValueError("shuffled output needs the fast sink and a fixed num_shards >= 1")
        self._file_rows = file_rows
        self._shard_size = shard_size
        self._records_per_shard = records_per_shard
        if deterministic and sink != "fast":
            raise ValueError("deterministic output needs the fast sink")
        if deterministic and num_shards < 1:
            raise ValueError("deterministic output needs a fixed num_shards >= 1")
        self._deterministic = deterministic
        if sink not in SINKS:
            raise ValueError(f"sink must be one of {SINKS}, not {sink!r}")
        if not 0 <= compression_level <= 3:
            raise ValueError(f"compression_level must be 0-3 (ISA-L levels), not {compression_level}")
        self._sink = sink
        self._level = compression_level
        if compression not in Compression.CHOICES:
            raise ValueError(f"compression must be one of {Compression.CHOICES}, not {compression!r}")
        if num_shards < 0:
            raise ValueError(f"num_shards must be >= 0, not {num_shards}")
        self._output = output
        self._compression = compression
        self._num_shards = num_shards

    def expand(self, batches: beam.PCollection[tuple[Any, pa.Array]]) -> beam.PCollection[ShardInfo]:
        prefix = shard_prefix(self._output, self._name)
        suffix = Compression.suffix(self._compression)
        spill = None
        if self._shuffle:
            writer = _ShardWriter(prefix, suffix, self._num_shards, self._compression, self._level)
            if in_memory_runner(batches.pipeline):
                # Under the output folder, like the rolling sink's parts: a crashed run's
                # leftovers go with its version folder.
                spill = f"{self._output.rstrip('/')}/_tmp-{uuid.uuid4().hex[:12]}"
            written = (
                batches
                # The split's name salts the permutation: splits are shuffled independently.
                | "Shuffle" >> ScatterRecords(self._num_shards, self._seed, salt=self._name, spill_dir=spill)
                # (shard, pieces of (place, record)) or their files: one group per shard, as below.
                | "GroupShards" >> beam.GroupByKey()
                | "WriteShards" >> beam.ParDo(_WriteShuffledShardFn(writer))
            )
            written = _with_empty_shards(written, writer)
        elif self._deterministic:
            writer = _ShardWriter(prefix, suffix, self._num_shards, self._compression, self._level)
            if self._file_rows is None:
                raise ValueError("deterministic output needs file_rows: the end row of every input file")
            if in_memory_runner(batches.pipeline):
                # As for --shuffle: the grouping then holds file names, not every record.
                spill = f"{self._output.rstrip('/')}/_tmp-{uuid.uuid4().hex[:12]}"
                batches = batches | "SpillBatches" >> SpillBatches(spill)
            written = (
                batches
                | "AssignShards"
                >> beam.ParDo(_AssignShardFn(self._num_shards), beam.pvalue.AsDict(self._file_rows))
                # (shard, ((split, file, first_row), records)): one group per shard, written by
                # whichever worker gets it, every shard in parallel.
                | "GroupShards" >> beam.GroupByKey()
                | "WriteShards" >> beam.ParDo(_WriteShardFn(writer))
            )
            written = _with_empty_shards(written, writer)
        elif self._sink == "beam":
            written = (
                batches
                | "Records" >> beam.FlatMap(_records)
                | "Write"
                >> beam.io.WriteToTFRecord(
                    prefix,
                    file_name_suffix=suffix,
                    num_shards=self._num_shards,
                    shard_name_template=SHARD_TEMPLATE,
                    compression_type=Compression.beam(self._compression),
                )
            )
        elif self._num_shards == 0:
            # The default: shards by size, described as they are written.
            return batches | "WriteBySize" >> WriteShardsBySize(
                prefix,
                suffix,
                compression=self._compression,
                level=self._level,
                max_bytes=self._shard_size,
                max_records=self._records_per_shard,
            )
        else:
            sink = _TFRecordBatchSink(prefix, suffix, self._num_shards, self._compression, self._level)
            written = batches | "Values" >> beam.Map(_values) | "Write" >> beam.io.Write(sink)
        # path of each final shard
        described = written | "Describe" >> beam.ParDo(_DescribeShardFn(self._compression))
        if spill is None:
            return described
        # The spilled files go once every shard is written, before the bundle can be published.
        return (
            batches.pipeline
            | "OnceSpilled" >> beam.Impulse()
            | "DeleteSpilled" >> beam.FlatMap(_delete_then, beam.pvalue.AsList(described), spill)
        )
