"""Sinks: sharded TFRecord files from batches of serialized examples."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import apache_beam as beam
import pyarrow as pa

from recordforge.tfrecord import Compression, ShardInfo, describe_shard

__all__ = ["WriteTFRecords", "shard_prefix"]

_LOGGER = logging.getLogger(__name__)
SHARD_TEMPLATE = "-SSSSS-of-NNNNN"


def shard_prefix(output: str, name: str = "data") -> str:
    return output.rstrip("/") + "/" + name


def _records(batch: pa.Array) -> Iterator[bytes]:
    # WriteToTFRecord takes one element per record: this is where batches become records.
    return iter(batch.to_pylist())


class _DescribeShardFn(beam.DoFn):
    def __init__(self, compression: str) -> None:
        self._compression = compression

    def process(self, path: str) -> Iterator[ShardInfo]:
        info = describe_shard(path, self._compression)
        _LOGGER.info("%s: %d records, %d bytes", path, info.records, info.bytes)
        yield info


class WriteTFRecords(beam.PTransform):
    """Writes batches of serialized examples as `{output}/data-SSSSS-of-NNNNN.tfrecord[.gz]`.

    In: large_binary arrays of serialized records. Out: a `ShardInfo` per written shard, measured
    from the file on disk (records, bytes, sha256). `num_shards=0` lets the runner choose.
    """

    def __init__(self, output: str, *, compression: str = "gzip", num_shards: int = 0) -> None:
        super().__init__()
        if compression not in Compression.CHOICES:
            raise ValueError(f"compression must be one of {Compression.CHOICES}, not {compression!r}")
        if num_shards < 0:
            raise ValueError(f"num_shards must be >= 0, not {num_shards}")
        self._output = output
        self._compression = compression
        self._num_shards = num_shards

    def expand(self, batches: beam.PCollection[pa.Array]) -> beam.PCollection[ShardInfo]:
        return (
            batches
            | "Records" >> beam.FlatMap(_records)
            | "Write" >> beam.io.WriteToTFRecord(
                shard_prefix(self._output),
                file_name_suffix=Compression.suffix(self._compression),
                num_shards=self._num_shards,
                shard_name_template=SHARD_TEMPLATE,
                compression_type=Compression.beam(self._compression),
            )
            # path of each final shard
            | "Describe" >> beam.ParDo(_DescribeShardFn(self._compression))
        )
