"""`WriteTFRecords`: sharded TFRecord files of serialized examples, by the writer its spec names."""

from __future__ import annotations

import apache_beam as beam
import pyarrow as pa

from recordforge.output.destination import Kept
from recordforge.output.shard_files import ShardFiles, shard_prefix
from recordforge.records.shard_format import shard_format
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.tfrecord import BatchKey, ShardInfo
from recordforge.records.webdataset import WEBDATASET, SampleCodec
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.placed import write_placed
from recordforge.transforms.rolling import WriteRollingShards

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
    grouping in memory). A rolling writer records its parts in the folder `pieces`; `kept`
    (output/destination.py) is what it keeps of a killed run: a rolling writer publishes the
    kept parts with its own, less the held records of batches converted again (pieces.py), a
    placed writer the shards the killed run finished (placed_pieces.py).
    """

    def __init__(
        self,
        output: str,
        spec: ShardSpec,
        *,
        spill: bool,
        pieces: str | None = None,
        kept: Kept | None = None,
        samples: SampleCodec | None = None,
    ) -> None:
        super().__init__()
        if (spec.format == WEBDATASET) != (samples is not None):
            raise ValueError("WebDataset shards, and only they, take a SampleCodec")
        self._samples = samples
        kept = kept or Kept()
        if kept.published:
            raise ValueError("a writer that published its shards is not written again (KeepPublished)")
        if (kept.parts or kept.held) and not spec.sizing.rolling:
            raise ValueError("only the rolling writer reuses parts")
        if kept.placed is not None and spec.sizing.rolling:
            raise ValueError("only the placed writer keeps placed shards")
        self._output = output
        self._spec = spec
        self._spill = spill
        self._pieces = pieces
        self._kept = kept

    def expand(self, batches: beam.PCollection[tuple[BatchKey, pa.Array]]) -> beam.PCollection[ShardInfo]:
        spec = self._spec
        files = ShardFiles.beside(shard_prefix(self._output, spec.name), shard_format(spec))
        if self._samples is not None:
            # (key, samples): each record as its sample's tar members, keyed by its place
            samples = batches | "ToSamples" >> beam.Map(_to_samples, self._samples)
            batches = declare_element_type(samples, batches.element_type)
        if not spec.sizing.rolling:
            return write_placed(
                batches, files, spec, spill=self._spill, pieces=self._pieces, keep=self._kept.placed
            )
        rolling = WriteRollingShards(
            files, spec, pieces=self._pieces, reused=self._kept.parts, held=self._kept.held
        )
        if spec.sizing is Sizing.COUNT:
            return batches | "WriteByCount" >> rolling
        return batches | "WriteBySize" >> rolling  # by bytes or by records


def _to_samples(element: tuple[BatchKey, pa.Array], codec: SampleCodec) -> tuple[BatchKey, pa.Array]:
    (split, file, first_row), records = element
    return (split, file, first_row), codec.encode_batch(file, first_row, records)
