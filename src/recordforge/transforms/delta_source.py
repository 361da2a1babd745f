"""ReadDelta: one Delta Lake snapshot, its Parquet files read by ReadParquet, partition values as columns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge.runners.traits import RunnerTraits
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.parquet_source import ReadParquet
from recordforge.transforms.source_types import FileInfo, SourceBatch

__all__ = ["ReadDelta"]


def _with_partitions(
    element: SourceBatch, values: Mapping[str, Mapping[str, Any]], types: Mapping[str, pa.DataType]
) -> SourceBatch:
    """The batch with its file's partition values as constant columns (a partitioned table's
    files do not hold them)."""
    here = values.get(element.file)
    if not here:
        return element
    batch = element.batch
    for name, value in here.items():
        column = pa.array([value] * batch.num_rows, types[name])
        batch = batch.append_column(pa.field(name, types[name]), column)
    return SourceBatch(element.file, element.first_row, batch, element.text_lists, element.read)


class ReadDelta(beam.PTransform):
    """Reads the data files of one Delta snapshot (listed at construction, sources/delta.py).

    In: a PBegin. Out: ReadParquet's outputs, each batch with the partition columns of its
    file appended (typed by the table's schema). `partition_values`: by file URI, the values of
    the partition columns; `partition_types`: their Arrow types; `columns`: those to read, the
    partition columns among them being added rather than read.
    """

    def __init__(
        self,
        files: list[FileInfo],
        *,
        partition_values: Mapping[str, Mapping[str, Any]],
        partition_types: Mapping[str, pa.DataType],
        columns: list[str] | None = None,
        batch_size: int = 16384,
        skip_unreadable: bool = False,
        finished: Mapping[tuple[str, int], int] | None = None,
        traits: RunnerTraits,
    ) -> None:
        super().__init__()
        self._values = {path: dict(v) for path, v in partition_values.items()}
        self._types = dict(partition_types)
        read = None if columns is None else [c for c in columns if c.split(".", 1)[0] not in self._types]
        self._parquet = ReadParquet(
            [f.path for f in files],
            columns=read,
            batch_size=batch_size,
            expanded=files,
            skip_unreadable=skip_unreadable,
            finished=finished,
            traits=traits,
        )

    def expand(self, pbegin: beam.pvalue.PBegin) -> dict[str, beam.PCollection]:
        read = pbegin | "Parquet" >> self._parquet
        if not self._types:
            return dict(read)
        # SourceBatch with the partition columns appended
        batches = read["batches"] | "PartitionValues" >> beam.Map(_with_partitions, self._values, self._types)
        return {**read, "batches": declare_element_type(batches, SourceBatch)}
