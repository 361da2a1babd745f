"""`--sink beam`: Beam's own `WriteToTFRecord`, kept only as a benchmark comparison.

Not a supported output path: it is what the benchmark (bench/run.py, `rf_beam_sink`) measures the
fast sink against, one element and one Python call per record, zlib level 6. Its temporary files,
shard naming and finalisation are Beam's file-based sink's (a `beam-temp-*` folder beside the
shards, renamed in its finalize step), not the protocol every other writer shares
(shard_files.py); its shards are described by reading them back, since Beam reports no sizes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge.layout import SHARD_TEMPLATE
from recordforge.tfrecord import Compression, ShardInfo, describe_shard

__all__ = ["write_with_beam"]

_LOGGER = logging.getLogger(__name__)


def _records(keyed: tuple[Any, pa.Array]) -> Iterator[bytes]:
    # WriteToTFRecord takes one element per record: this is where batches become records.
    return iter(keyed[1].to_pylist())


class _DescribeShardFn(beam.DoFn):
    def __init__(self, compression: str) -> None:
        self._compression = compression

    def process(self, path: str) -> Iterator[ShardInfo]:
        info = describe_shard(path, self._compression)
        _LOGGER.info("%s: %d records, %d bytes", path, info.records, info.bytes)
        yield info


def write_with_beam(
    batches: beam.PCollection[tuple[Any, pa.Array]],
    prefix: str,
    suffix: str,
    *,
    num_shards: int,
    compression: str,
) -> beam.PCollection[ShardInfo]:
    """In: `(key, records)` batches. Out: a `ShardInfo` per shard `{prefix}-SSSSS-of-NNNNN{suffix}`
    that `beam.io.WriteToTFRecord` wrote (`num_shards=0`: as many as Beam chooses)."""
    written = (
        batches
        | "Records" >> beam.FlatMap(_records)
        | "Write"
        >> beam.io.WriteToTFRecord(
            prefix,
            file_name_suffix=suffix,
            num_shards=num_shards,
            shard_name_template=SHARD_TEMPLATE,
            compression_type=Compression.beam(compression),
        )
    )
    # path of each final shard
    return written | "Describe" >> beam.ParDo(_DescribeShardFn(compression))
