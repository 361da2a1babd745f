"""An exact and deterministic encoder from conformed Arrow batches to tf.train.Example.

Every record is built from the protobuf wire format directly, by one C loop over the batch's
Arrow buffers (`_native.encode_examples`, in _examples.c):

    Example   = 0x0A len Features
    Features  = (0x0A len MapEntry)*            one per present feature, keys sorted
    MapEntry  = 0x0A len key  0x12 len Feature
    Feature   = tag len List                     tag 0x0A bytes, 0x12 float, 0x1A int64
    List      = (0x0A len packed-values)?        float and int64: one packed field, omitted if empty
              | (0x0A len value)*                bytes: one field per value

The output equals `example.SerializeToString(deterministic=True)` of the same Example built in
Python, byte for byte (the tests check it), so the same input always gives the same bytes.

The numpy helpers below (`_column`, `_Pieces`, `_varint_len`) lay out one column's List bodies
for all rows at once; the encoder no longer uses them, encoders of other messages built from
Features do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_array, binary_parts, drop_hidden_values, list_offsets
from recordforge.records import _native
from recordforge.schemas.kinds import ExampleKind
from recordforge.schemas.plan import Plan

__all__ = ["ExampleEncoder"]

_EMPTY = pa.scalar(b"", pa.large_binary())
_FEATURE_TAG = {ExampleKind.BYTES: 0x0A, ExampleKind.FLOAT: 0x12, ExampleKind.INT64: 0x1A}
_KIND_CODE = {ExampleKind.BYTES: 0, ExampleKind.FLOAT: 1, ExampleKind.INT64: 2}  # as _examples.c's
_VALUE_TYPE = {
    ExampleKind.BYTES: pa.large_binary(),
    ExampleKind.FLOAT: pa.float32(),
    ExampleKind.INT64: pa.int64(),
}


def _primitive(arr: pa.Array, dtype: type) -> np.ndarray:
    """The values buffer of a primitive array as numpy (null slots hold arbitrary values)."""
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dtype)[arr.offset : arr.offset + len(arr)]


def _varint_width(v: np.ndarray) -> int:
    """Bytes of the longest unsigned varint in `v` (from one max, not a pass per byte)."""
    top = int(v.max()) if len(v) else 0
    return max(1, (top.bit_length() + 6) // 7)


def _varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes of each unsigned varint (1 to 10); only as many passes as the largest value needs."""
    v = v.astype(np.uint64, copy=False)
    n = np.ones(v.shape, dtype=np.int64)
    for k in range(1, _varint_width(v)):
        n += v >= np.uint64(1 << (7 * k))
    return n


class _Pieces:
    """Bounded-width byte pieces per row, laid side by side and compacted in one masked copy."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.mats: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.lengths = np.zeros(n, dtype=np.int64)

    def const(self, raw: bytes, present: np.ndarray) -> None:
        mat = np.broadcast_to(np.frombuffer(raw, np.uint8), (self.n, len(raw)))
        self.mats.append(mat)
        self.masks.append(np.broadcast_to(present[:, None], mat.shape))
        self.lengths += present * len(raw)

    def varint(self, values: np.ndarray, present: np.ndarray) -> None:
        v = values.astype(np.uint64, copy=False)
        width = _varint_width(v)
        if width == 1:  # the common case: every value below 128 is its own single byte
            self.mats.append(v.astype(np.uint8).reshape(-1, 1))
            self.masks.append(present.reshape(-1, 1))
            self.lengths += present
            return
        lens = _varint_len(v)
        mat = np.empty((self.n, width), dtype=np.uint8)
        for k in range(width):
            byte = (v >> np.uint64(7 * k)) & np.uint64(0x7F)
            byte |= (k < lens - 1).astype(np.uint64) << np.uint64(7)
            mat[:, k] = byte
        self.mats.append(mat)
        self.masks.append((np.arange(width) < lens[:, None]) & present[:, None])
        self.lengths += lens * present

    def compact(self) -> tuple[np.ndarray, np.ndarray]:
        """Returns (data, per-row lengths)."""
        if not self.mats:
            return np.zeros(0, np.uint8), np.zeros(self.n, np.int64)
        wide = np.concatenate(self.mats, axis=1)
        mask = np.concatenate(self.masks, axis=1)
        return wide[mask], self.lengths


@dataclass(frozen=True)
class _Column:
    """One feature of one batch, reduced to what its wire encoding needs."""

    present: np.ndarray  # bool per row: is the feature written for this row
    counts: np.ndarray  # number of values per row (0 where absent)
    payload: np.ndarray  # uint8, the List body's values for all rows, contiguous in row order
    payload_lens: np.ndarray  # bytes of payload per row


def _list_layout(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """(present, offsets relative to values, values) for a scalar or large_list column."""
    n = len(arr)
    present = (
        np.ones(n, dtype=bool) if arr.null_count == 0 else pc.is_valid(arr).to_numpy(zero_copy_only=False)
    )
    if pa.types.is_large_list(arr.type):
        arr = drop_hidden_values(arr)
        offsets = list_offsets(arr)
        start = int(offsets[0])
        values = arr.values.slice(start, int(offsets[-1]) - start)
        return present, offsets - start, values
    # A scalar is a list of one value where present and none where absent.
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(present, out=offsets[1:])
    values = arr if arr.null_count == 0 else arr.filter(pc.is_valid(arr))
    return present, offsets, values


def _column(arr: pa.Array, kind: ExampleKind) -> _Column:
    present, offsets, values = _list_layout(arr)
    counts = np.diff(offsets)
    if kind is ExampleKind.FLOAT:
        payload = _primitive(values, np.float32).astype("<f4", copy=False).view(np.uint8)
        return _Column(present, counts, payload, counts * 4)
    if kind is ExampleKind.INT64:
        pieces = _Pieces(len(values))
        pieces.varint(_primitive(values, np.int64).view(np.uint64), np.ones(len(values), bool))
        payload, value_lens = pieces.compact()
        return _Column(present, counts, payload, _segment_sums(value_lens, offsets))
    # bytes_list: each value is its own field, 0x0A len bytes.
    voff, _ = binary_parts(values)
    lens = np.diff(voff)
    pieces = _Pieces(len(values))
    pieces.const(b"\x0a", np.ones(len(values), bool))
    pieces.varint(lens, np.ones(len(values), bool))
    prefix, prefix_lens = pieces.compact()
    joined = pc.binary_join_element_wise(
        binary_array(prefix, prefix_lens), values.cast(pa.large_binary()), _EMPTY
    )
    joff, jdata = binary_parts(joined)
    payload = jdata[joff[0] : joff[-1]]
    return _Column(present, counts, payload, _segment_sums(np.diff(joff), offsets))


def _segment_sums(lengths: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    csum = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=csum[1:])
    return csum[offsets[1:]] - csum[offsets[:-1]]


class ExampleEncoder:
    """Encodes conformed record batches (see `conform_batch`) into serialized tf.train.Examples.

    Picklable and stateless apart from the plan-derived key bytes, so one instance serves a DoFn.
    The records are written by `_native.encode_examples`, one C loop over the batch's buffers.
    """

    def __init__(self, plan: Plan) -> None:
        # Deterministic serialization orders map entries by key; so do we.
        self._columns = sorted(plan.columns, key=lambda c: c.name.encode("utf-8"))
        self._keys = [_key_prefix(c.name) for c in self._columns]

    def encode(self, batch: pa.RecordBatch) -> pa.LargeBinaryArray:
        """One serialized Example per row, as a large_binary array of the same length."""
        n = batch.num_rows
        specs = [
            spec
            for column, key in zip(self._columns, self._keys, strict=True)
            if (spec := _native_column(batch.column(column.name), column.kind, key)) is not None
        ]
        offsets, data = _native.encode_examples(n, specs)
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _native_column(arr: pa.Array, kind: ExampleKind, key: bytes) -> tuple[Any, ...] | None:
    """One column as `_native.encode_examples` reads it: (key, kind, validity bitmap, its first
    bit, large_list offsets, the first row's index in them, values (the int64 offsets of bytes
    values), the values' own offset, bytes data). None: absent from every row."""
    if arr.null_count == len(arr):
        return None
    typ = arr.type
    if pa.types.is_list(typ) or pa.types.is_fixed_size_list(typ):
        arr = arr.cast(pa.large_list(typ.value_type))
    valid = arr.buffers()[0] if arr.null_count else None
    rows, first_row, values = None, 0, arr
    if pa.types.is_large_list(arr.type):
        rows, first_row, values = arr.buffers()[1], arr.offset, arr.values
    if values.type != _VALUE_TYPE[kind]:
        values = values.cast(_VALUE_TYPE[kind])
    buffers = values.buffers()
    data = buffers[2] if kind is ExampleKind.BYTES else None
    return (key, _KIND_CODE[kind], valid, arr.offset, rows, first_row, buffers[1], values.offset, data)


def _varint_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key_prefix(name: str) -> bytes:
    raw = name.encode("utf-8")
    return b"\x0a" + _varint_bytes(len(raw)) + raw
