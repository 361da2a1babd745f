"""tf.train.Examples read back into a plan's conformed Arrow columns: what ToExamples would encode."""
# A record is decoded by records/wire.py (one C pass per chunk) and laid out per written feature
# (Plan.columns) in the encoder's Arrow types: scalars as int64/float32/large_binary, lists as
# large_list, absent features as nulls. Encoding that batch again gives RecordForge's bytes
# (keys sorted, packed lists); a record whose every feature is in the schema and needed no
# default is also kept as it was read (`Decoded.records`), so its bytes pass through unchanged.
# A record that is not an Example, or whose features do not fit the schema (another list kind,
# another number of values, a required feature missing, a string that is not UTF-8), is a
# BadRecord naming the feature and why.

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.records import wire
from recordforge.records.wire_keys import KeyTable
from recordforge.schemas.kinds import DType, ExampleKind, NullPolicy
from recordforge.schemas.model import Feature
from recordforge.schemas.plan import Plan

__all__ = ["BadRecord", "Decoded", "ExampleDecoder", "written_columns"]

_CODES = {ExampleKind.BYTES: wire.BYTES, ExampleKind.FLOAT: wire.FLOAT, ExampleKind.INT64: wire.INT64}
_KIND_WORDS = {wire.BYTES: "bytes_list", wire.FLOAT: "float_list", wire.INT64: "int64_list"}


@dataclass(frozen=True)
class BadRecord:
    """A record that is not an Example of the schema: its index in the chunk, the feature at
    fault ("" for a record that is no Example at all) and why."""

    index: int
    column: str
    reason: str


@dataclass(frozen=True)
class Decoded:
    """The good records of a chunk: `batch` in the plan's Arrow schema, `records` their bytes as
    read (null where the record must be encoded again), `rows` their indices in the chunk."""

    batch: pa.RecordBatch
    records: pa.LargeBinaryArray
    rows: np.ndarray
    bad: list[BadRecord]


def written_columns(f: Feature) -> list[str]:
    """The Example keys one feature is written as, in Plan.columns' order."""
    if f.is_image:
        return [f.name, *(f.part_name(p) for p in ("height", "width", "channels", "format"))]
    if f.is_ragged and not f.float64_bytes:
        return [f.name, f.row_lengths_name]
    return [f.name]


class _Faults:
    """The first fault of each bad record."""

    def __init__(self) -> None:
        self.rows: dict[int, BadRecord] = {}

    def add(self, rows: np.ndarray, column: str, reason: str) -> None:
        for r in rows.tolist():
            self.rows.setdefault(r, BadRecord(r, column, reason))


@dataclass
class _Entries:
    """One key over a chunk: whether each record has it, its count, and its values in record order."""

    present: np.ndarray
    counts: np.ndarray
    values: pa.Array


class ExampleDecoder:
    """Decodes chunks of serialized Examples (framed as records/chunks.py gives them) to `plan`."""

    def __init__(self, plan: Plan) -> None:
        self._plan = plan
        self._keys = KeyTable(c.name for c in plan.columns)
        self._owners: list[tuple[Feature, list[str]]] = [(f, written_columns(f)) for f in plan.features]
        self._known = {c.name for c in plan.columns}

    def decode(
        self, data: bytes | memoryview, starts: np.ndarray, ends: np.ndarray, raw: pa.Array | None = None
    ) -> Decoded:
        """The records data[starts[i]:ends[i]]; `raw`: the same records as a large_binary array,
        where the caller has them so (else they are cut from `data`)."""
        n = len(starts)
        parsed = wire.decode_batch(data, starts, ends, self._keys)
        faults = _Faults()
        for r in parsed.not_examples:
            faults.add(np.array([r]), "", parsed.errors.get(r, "not a tf.train.Example"))
        reencode = np.zeros(n, bool)
        for name, col in parsed.columns.items():
            if name not in self._known:  # a feature the schema leaves out: the record changes
                reencode[np.unique(col.rec)] = True
        arrays: dict[str, pa.Array] = {}
        for f, names in self._owners:
            for name in names:
                kind = self._plan.arrow_schema.field(name).type
                arrays[name] = self._column(f, name, kind, parsed.columns.get(name), n, faults, reencode)
            if f.is_ragged and not f.float64_bytes:
                _check_ragged(f, arrays[f.name], arrays[f.row_lengths_name], faults)
        bad = sorted(faults.rows)
        keep = np.setdiff1d(np.arange(n), np.array(bad, np.int64))
        batch = pa.RecordBatch.from_arrays(
            [arrays[c.name] for c in self._plan.columns], schema=self._plan.arrow_schema
        )
        if raw is None:
            raw = _slices(np.frombuffer(data, np.uint8), np.asarray(starts), np.asarray(ends))
        records = pc.if_else(pa.array(reencode), pa.scalar(None, pa.large_binary()), raw)
        if bad:
            take = pa.array(keep)
            batch, records = batch.take(take), records.take(take)
        return Decoded(batch, records, keep, [faults.rows[r] for r in bad])

    def _column(
        self,
        f: Feature,
        name: str,
        kind: pa.DataType,
        col: wire.Column | None,
        n: int,
        faults: _Faults,
        reencode: np.ndarray,
    ) -> pa.Array:
        scalar = not pa.types.is_large_list(kind)
        value_type = kind if scalar else kind.value_type
        code = _value_code(value_type)
        entries = _entries(col, code, value_type, n, name, faults)
        values = entries.values
        primary = name == f.name
        if f.dtype is DType.STRING and primary and code == wire.BYTES and len(values):
            bad_text = _not_utf8(values)
            if bad_text.size:
                owners = np.repeat(np.arange(n), entries.counts)
                faults.add(np.unique(owners[bad_text]), name, "not UTF-8 text in a string feature")
        missing = np.flatnonzero(~entries.present)
        if missing.size and primary and f.nulls is NullPolicy.REQUIRED:
            faults.add(missing, name, "missing, in a feature with `nulls: required`")
        need = 1 if scalar else f.num_values if not (f.is_ragged or f.float64_bytes) else None
        if need is not None:
            wrong = np.flatnonzero(entries.present & (entries.counts != need))
            if wrong.size:
                faults.add(wrong, name, f"holds a number of values other than {need} (shape {list(f.shape)})")
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(entries.counts, out=offsets[1:])
        mask = pa.array(~entries.present)
        if scalar:
            # Rows of another count are bad (above): one value stands in for each row.
            one = np.where(entries.counts == 1, offsets[:-1], 0)
            if len(values):
                taken = values.take(pa.array(np.minimum(one, len(values) - 1)))
                nulls = pa.array(~entries.present | (entries.counts != 1))
                arr = pc.if_else(nulls, pa.scalar(None, value_type), taken)
            else:
                arr = pa.nulls(n, value_type)
        else:
            arr = pa.LargeListArray.from_arrays(pa.array(offsets), values, mask=mask)
        if missing.size and primary and f.nulls is NullPolicy.DEFAULT:
            reencode[missing] = True
            arr = pc.fill_null(arr, _default(f, arr.type))
        return arr


def _value_code(t: pa.DataType) -> int:
    if pa.types.is_int64(t):
        return wire.INT64
    if pa.types.is_float32(t):
        return wire.FLOAT
    return wire.BYTES


def _entries(
    col: wire.Column | None, code: int, value_type: pa.DataType, n: int, name: str, faults: _Faults
) -> _Entries:
    """The key's entries as one per record (a record holding it twice, or as another list
    kind, is bad), and the values of the records holding it, in record order."""
    present = np.zeros(n, bool)
    counts = np.zeros(n, np.int64)
    if col is None or not len(col.rec):
        return _Entries(present, counts, pa.array([], value_type))
    mine = col.kind == code
    usable = mine | (col.kind == wire.NONE)
    other = np.flatnonzero(~usable)
    if other.size:
        got = ", ".join(sorted({_KIND_WORDS[int(k)] for k in col.kind[other].tolist()}))
        faults.add(np.unique(col.rec[other]), name, f"holds a {got}, the schema says {_KIND_WORDS[code]}")
    # Where each usable entry's values start among its kind's values (entry order).
    first = np.zeros(len(col.rec), np.int64)
    counts_mine = np.where(mine, col.count, 0)
    first[mine] = np.cumsum(counts_mine[mine]) - counts_mine[mine]
    entry = np.flatnonzero(usable)
    recs = col.rec[entry]
    uniq, seen = np.unique(recs, return_counts=True)
    if (seen > 1).any():
        faults.add(uniq[seen > 1], name, "the feature appears twice in the record")
    order = entry[np.argsort(recs, kind="stable")]
    rows = col.rec[order]
    last = np.ones(len(order), bool)  # one entry per record: the last one protobuf keeps
    last[:-1] = rows[1:] != rows[:-1]
    order, rows = order[last], rows[last]
    present[rows] = True
    counts[rows] = counts_mine[order]
    total = int(counts[rows].sum())
    index = np.repeat(first[order] - np.concatenate([[0], np.cumsum(counts[rows])[:-1]]), counts[rows])
    index = index + np.arange(total, dtype=np.int64)
    if code == wire.INT64:
        values: pa.Array = pa.array(col.ints[index], pa.int64())
    elif code == wire.FLOAT:
        values = pa.array(col.floats[index], pa.float32())
    else:
        values = _slices(col.blob, col.starts, col.ends, index)
    return _Entries(present, counts, values)


def _slices(
    blob: np.ndarray, starts: np.ndarray, ends: np.ndarray, index: np.ndarray | None = None
) -> pa.Array:
    """blob[starts[i]:ends[i]] for each i of `index` (all by default), as one large_binary array:
    the spans (and the gaps between them) as elements over the blob, the spans taken in C."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    if index is None:
        index = np.arange(len(starts), dtype=np.int64)
    if not len(starts) or not len(index):
        return pa.array([], pa.large_binary())
    bounds = np.empty(2 * len(starts), np.int64)
    bounds[0::2], bounds[1::2] = starts, ends
    if (np.diff(bounds) < 0).any():  # spans out of order: one at a time
        raw = blob.tobytes()
        return pa.array([raw[int(starts[i]) : int(ends[i])] for i in index.tolist()], pa.large_binary())
    spans = pa.Array.from_buffers(
        pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(blob)]
    )
    return spans.take(pa.array(2 * index))


def _not_utf8(values: pa.Array) -> np.ndarray:
    """Indices of the values that are not UTF-8 (Arrow validates the whole array in C; only an
    array that fails is looked at value by value)."""
    try:
        values.view(pa.large_string()).validate(full=True)
        return np.zeros(0, np.int64)
    except pa.ArrowInvalid:
        pass
    bad = []
    for i, v in enumerate(values.to_pylist()):
        try:
            v.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return np.array(bad, np.int64)


def _check_ragged(f: Feature, values: pa.Array, lengths: pa.Array, faults: _Faults) -> None:
    """A ragged feature's values and row lengths must come together and agree."""
    have_values = pc.is_valid(values).to_numpy(zero_copy_only=False)
    have_lengths = pc.is_valid(lengths).to_numpy(zero_copy_only=False)
    apart = np.flatnonzero(have_values != have_lengths)
    if apart.size:
        faults.add(apart, f.row_lengths_name, "values and row lengths must both be present or both absent")
    count = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
    sums = np.zeros(len(lengths), np.int64)
    flat = pc.list_flatten(lengths).to_numpy(zero_copy_only=False)
    parents = pc.list_parent_indices(lengths).to_numpy(zero_copy_only=False)
    np.add.at(sums, parents, flat)
    if (flat < 0).any():
        faults.add(np.unique(parents[flat < 0]), f.row_lengths_name, "a negative row length")
    wrong = np.flatnonzero(have_values & have_lengths & (sums != count))
    if wrong.size:
        faults.add(wrong, f.row_lengths_name, "row lengths do not add up to the number of values")


def _default(f: Feature, arrow_type: pa.DataType) -> pa.Scalar:
    """The declared default as the encoder holds it (strings as bytes, booleans as integers)."""
    values = f.default if isinstance(f.default, list) else [f.default]
    value_type = arrow_type.value_type if pa.types.is_large_list(arrow_type) else arrow_type
    if pa.types.is_large_binary(value_type):
        values = [v.encode() if isinstance(v, str) else v for v in values]
    elif pa.types.is_int64(value_type):
        values = [int(v) for v in values]
    return pa.scalar(values if isinstance(f.default, list) else values[0], arrow_type)
