"""A vectorised, exact and deterministic encoder from conformed Arrow rows, cut into sequences, to
tf.train.SequenceExample.

Every record is built from the protobuf wire format directly, column by column, with numpy:

    SequenceExample = 0x0A len Features          context: the sequence's context row, as
                                                 ExampleEncoder writes an Example's features
                      0x12 len FeatureLists      always present: a sequence has one step or more
    FeatureLists    = (0x0A len MapEntry)*       one per step column, keys sorted by their bytes
    MapEntry        = 0x0A len key  0x12 len FeatureList
    FeatureList     = (0x0A len Feature)*        one per step, in step order
    Feature         = tag len List               as in encoding.py; a null step is an empty list of
                                                 its kind (tag 0x00), so that every list has a
                                                 Feature per step

A step column's Features come from `ExampleEncoder` (its public output, nothing of its insides):
an Example of that one feature ends with `0x12 len Feature`, the map entry's value, so the
framed `0x0A len Feature` a FeatureList holds is that suffix with its first byte changed. The
rows of one sequence are adjacent, so its FeatureList body is one contiguous slice of them. The
output equals `sequence_example.SerializeToString(deterministic=True)` of the same message built
in Python, byte for byte (the tests check it).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_array, binary_parts
from recordforge.records.encoding import ExampleEncoder
from recordforge.schemas.kinds import ExampleKind
from recordforge.schemas.model import Schema
from recordforge.schemas.plan import compile_schema
from recordforge.schemas.sequence import SequencePlans

__all__ = ["SequenceEncoder"]

_EMPTY = pa.scalar(b"", pa.large_binary())
# tf.train.Feature's oneof: bytes_list = 1, float_list = 2, int64_list = 3 (wire type 2).
_FEATURE_TAG = {ExampleKind.BYTES: 0x0A, ExampleKind.FLOAT: 0x12, ExampleKind.INT64: 0x1A}
_MAX_VARINT = 10


def _varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint (values below 2^63)."""
    v = np.asarray(v, dtype=np.uint64)
    out = np.ones(len(v), dtype=np.int64)
    for k in range(1, _MAX_VARINT):
        out += v >= np.uint64(1 << (7 * k))
    return out


def _varints(v: np.ndarray) -> pa.LargeBinaryArray:
    """Each value as its varint bytes."""
    v = np.asarray(v, dtype=np.uint64)
    widths = _varint_len(v)
    cols = int(widths.max()) if len(v) else 1
    shifts = np.arange(cols, dtype=np.uint64) * np.uint64(7)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    more = np.arange(cols)[None, :] < (widths[:, None] - 1)
    groups |= more.astype(np.uint8) << 7
    return binary_array(groups[np.arange(cols)[None, :] < widths[:, None]], widths)


def _unwrap(total: np.ndarray) -> np.ndarray:
    """x with x + varint_len(x) == total: a length from the length of `varint(x) x`."""
    out = np.zeros(len(total), dtype=np.int64)
    for w in range(1, _MAX_VARINT):
        x = total - w
        hit = (x >= 0) & (_varint_len(np.maximum(x, 0)) == w)
        out = np.where(hit, x, out)
    return out


class _StepColumn:
    """One step feature: its Example encoder, its map key and the empty Feature of its kind."""

    def __init__(self, plan_column_name: str, kind: ExampleKind, encoder: ExampleEncoder) -> None:
        raw = plan_column_name.encode("utf-8")
        self.name = plan_column_name
        self.key = b"\x0a" + bytes(_varints(np.array([len(raw)])).to_pylist()[0]) + raw
        self.encoder = encoder
        self.empty = np.frombuffer(bytes([0x0A, 0x02, _FEATURE_TAG[kind], 0x00]), np.uint8)

    def framed(self, column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(data, per-row lengths): `0x0A len Feature` of every row, contiguous in row order."""
        examples = self.encoder.encode(pa.RecordBatch.from_arrays([column], names=[self.name]))
        offsets, data = binary_parts(examples)
        total = np.diff(offsets)
        absent = total == 2  # `0x0A 0x00`: an Example without the feature
        # Example = 0x0A len(A) A;  A = 0x0A len(B) B;  B = key 0x12 len(F) F
        entry = _unwrap(total - 1)
        value = _unwrap(entry - 1) - len(self.key)  # `0x12 len(F) F`, counted from its tag
        lens = np.where(absent, len(self.empty), value)
        ends = np.zeros(len(lens) + 1, dtype=np.int64)
        np.cumsum(lens, out=ends[1:])
        out = np.empty(int(ends[-1]), dtype=np.uint8)
        present = np.flatnonzero(~absent)
        if present.size:
            lengths = value[present]
            within = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
            source = np.repeat(offsets[1:][present] - lengths, lengths) + within  # the Example's tail
            out[np.repeat(ends[present], lengths) + within] = data[source]
        missing = np.flatnonzero(absent)
        if missing.size:
            out[(ends[missing][:, None] + np.arange(len(self.empty))).reshape(-1)] = np.tile(
                self.empty, missing.size
            )
        out[ends[:-1][lens > 0]] = 0x0A  # FeatureList.feature, where the entry had its value's tag
        return out, lens


class SequenceEncoder:
    """Encodes conformed rows cut into sequences into serialized tf.train.SequenceExamples.

    Picklable and stateless apart from the plan-derived encoders, so one instance serves a DoFn.
    """

    def __init__(self, plans: SequencePlans) -> None:
        self._context = ExampleEncoder(plans.context)
        by_name = {f.name: f for f in plans.steps.features}
        # Deterministic serialization orders map entries by key; so do we.
        self._columns = [
            _StepColumn(c.name, c.kind, ExampleEncoder(compile_schema(Schema((by_name[c.name],)))))
            for c in sorted(plans.steps.columns, key=lambda c: c.name.encode("utf-8"))
        ]

    def encode(
        self, context: pa.RecordBatch, steps: pa.RecordBatch, offsets: np.ndarray
    ) -> pa.LargeBinaryArray:
        """One serialized SequenceExample per row of `context` (in the context plan's Arrow
        schema); sequence i has the rows offsets[i]:offsets[i + 1] of `steps` (in the step plan's
        schema, in step order), `offsets` rising by one or more from 0 to steps.num_rows."""
        offsets = np.asarray(offsets, dtype=np.int64)
        n = context.num_rows
        if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != steps.num_rows:
            raise ValueError(f"offsets must run from 0 to {steps.num_rows} in {n + 1} entries")
        if (np.diff(offsets) < 1).any():
            raise ValueError("every sequence needs one step or more")
        parts: list[pa.Array] = []
        total = np.zeros(n, dtype=np.int64)
        for column in self._columns:
            data, row_lens = column.framed(steps.column(column.name))
            ends = np.zeros(len(row_lens) + 1, dtype=np.int64)
            np.cumsum(row_lens, out=ends[1:])
            body = ends[offsets[1:]] - ends[offsets[:-1]]
            entry_len = len(column.key) + 1 + _varint_len(body) + body
            # FeatureLists.feature_list (a map entry): its key, then its value
            parts.append(
                pc.binary_join_element_wise(
                    pa.scalar(b"\x0a", pa.large_binary()),
                    _varints(entry_len),
                    pa.scalar(column.key + b"\x12", pa.large_binary()),
                    _varints(body),
                    _EMPTY,
                )
            )
            parts.append(binary_array(data, body))
            total += 1 + _varint_len(entry_len) + entry_len
        head = pc.binary_join_element_wise(
            pa.scalar(b"\x12", pa.large_binary()), _varints(total), _EMPTY
        )  # SequenceExample.feature_lists
        return pc.binary_join_element_wise(self._context.encode(context), head, *parts, _EMPTY)
