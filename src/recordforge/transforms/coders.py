"""Coders for the pipeline's big elements: record batches and encoded-record arrays."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import pyarrow as pa

if TYPE_CHECKING:  # source_types.py imports this module
    from recordforge.transforms.source_types import SourceBatch

__all__ = ["ArrowCoder", "SourceBatchCoder", "declare_element_type"]


class _SizedPickleCoder(beam.coders.Coder):
    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Any:
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> Any:
        return Any


class ArrowCoder(_SizedPickleCoder):
    """A `pa.Array` (the records of a batch) or a `pa.RecordBatch` (conformed rows, for
    tensorflow-transform), as ToExamples emits them."""

    def estimate_size(self, value: pa.Array | pa.RecordBatch) -> int:
        return value.nbytes


class SourceBatchCoder(_SizedPickleCoder):
    """A `SourceBatch`: a record batch with its file and first row."""

    def estimate_size(self, value: SourceBatch) -> int:
        return value.batch.nbytes + sum(a.nbytes for a in value.read.values()) + len(value.file) + 16


def declare_element_type(pcoll: beam.PCollection, element_type: Any) -> beam.PCollection:
    """Sets a PCollection's element type, from which Beam picks its coder. Beam infers it from
    `with_output_types` only when construction-time type checking is on, which RecordForge
    turns off by default (0.2 s a run, checking nothing on Arrow batches)."""
    pcoll.element_type = element_type
    return pcoll
