"""`WriteTFRecords`: sharded TFRecord files of serialized examples, by the writer its spec names."""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

from recordforge.tfrecord import BatchKey, ShardInfo
from recordforge.transforms.placed import write_placed
from recordforge.transforms.rolling import WriteRollingShards
from recordforge.transforms.shard_files import ShardFiles, shard_prefix
from recordforge.transforms.shard_format import shard_format
from recordforge.transforms.shard_spec import ShardSpec, Sizing

__all__ = ["WriteTFRecords"]


class WriteTFRecords(beam.PTransform):
    """Writes batches of serialized examples as `{output}/{name}-SSSSS-of-NNNNN.tfrecord[.gz]`.

    In: `(key, records)`: large_binary arrays of serialized records keyed by (split, file,
    first_row). Out: a `ShardInfo` per shard (records, bytes, sha256 of the bytes as written).
    Shards are written in the spec's format (shard_format.py: TFRecord framed vectorised and
    deflated with ISA-L at `spec.level`, with a record index if asked; or ArrayRecord), and
    named, published and cleaned up by one protocol (shard_files.py). Rolling sizings (bytes,
    records, count) go to the rolling writer, placed sizing to the placed writer, which with
    `spill` keeps what waits for its grouping in temporary files (for runners that hold a
    grouping in memory).
    """

    def __init__(self, output: str, spec: ShardSpec, *, spill: bool) -> None:
        super().__init__()
        self._output = output
        self._spec = spec
        self._spill = spill

    def expand(self, batches: beam.PCollection[tuple[BatchKey, pa.Array]]) -> beam.PCollection[ShardInfo]:
        spec = self._spec
        files = ShardFiles.beside(shard_prefix(self._output, spec.name), shard_format(spec))
        if spec.sizing is Sizing.COUNT:
            return batches | "WriteByCount" >> WriteRollingShards(files, spec)
        if spec.sizing.rolling:  # by bytes or by records
            return batches | "WriteBySize" >> WriteRollingShards(files, spec)
        return write_placed(batches, files, spec, spill=self._spill)
