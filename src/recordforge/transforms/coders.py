"""Coders for the pipeline's big elements: record batches and encoded-record arrays (a source's
batches have theirs beside their type, in source_types.py)."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import pickle
from typing import Any

import apache_beam as beam
import pyarrow as pa

__all__ = ["ArrowCoder", "PickleCoder", "declare_element_type"]


class PickleCoder(beam.coders.Coder):
    """A big element pickled whole; each subclass says how to estimate its size."""

    def encode(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)

    def decode(self, encoded: bytes) -> Any:
        return pickle.loads(encoded)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self) -> Any:
        return Any


class ArrowCoder(PickleCoder):
    """A `pa.Array` (the records of a batch) or a `pa.RecordBatch` (conformed rows, for
    tensorflow-transform), as ToExamples emits them."""

    def estimate_size(self, value: pa.Array | pa.RecordBatch) -> int:
        return value.nbytes


def declare_element_type(pcoll: beam.PCollection, element_type: Any) -> beam.PCollection:
    """Sets a PCollection's element type, from which Beam picks its coder. Beam infers it from
    `with_output_types` only when construction-time type checking is on, which RecordForge
    turns off by default (0.2 s a run, checking nothing on Arrow batches)."""
    pcoll.element_type = element_type
    return pcoll
