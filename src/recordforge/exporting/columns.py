"""A batch of decoded Examples (records/wire.py) as an Arrow record batch of the source's columns."""
# The type mapping is docs/export.md's table; each function below is one of its rows.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_array
from recordforge.records.wire import BYTES, FLOAT, INT64, NONE, Batch, kind_name
from recordforge.schemas.kinds import DType
from recordforge.schemas.model import Feature, Schema
from recordforge.schemas.plan import time_type

__all__ = [
    "BadRecord",
    "Decimals",
    "Tree",
    "arrow_schema",
    "column_tree",
    "column_type",
    "gap_key",
    "merge_decimals",
    "retyped",
    "to_record_batch",
    "value_type",
]

# A top-level column: a feature, or a struct whose fields are features or structs.
Tree = dict[str, Union[Feature, "Tree"]]
# (integer digits, digits after the point) of an `as: string` decimal feature's values, by feature;
# a fixed-shape feature absent from some record, by name, with (0, 0) (see `column_type`).
Decimals = dict[str, tuple[int, int]]


@dataclass
class BadRecord(Exception):
    """Record `record` of the batch is not what the bundle's schema says it wrote."""

    record: int
    what: str


def column_tree(schema: Schema) -> Tree:
    """The source's columns, in the order of their first feature: `column: a.b` a field of struct
    `a`; a feature whose column an earlier one already fills is its own column, under its name."""
    tree: Tree = {}
    for f in schema.features:
        path = f.source_column.split(".") if "." in f.source_column else [f.source_column]
        node: Tree | None = tree
        for part in path[:-1]:
            child = node.setdefault(part, {}) if node is not None else None
            node = child if isinstance(child, dict) else None
        if node is not None and path[-1] not in node:
            node[path[-1]] = f
            continue
        name = f.name
        while name in tree:
            name += "_"
        tree[name] = f
    return tree


def merge_decimals(a: Decimals, b: Decimals) -> Decimals:
    out = dict(a)
    for name, (digits, scale) in b.items():
        had = out.get(name, (1, 0))
        out[name] = (max(had[0], digits), max(had[1], scale))
    return out


def _decimal_type(digits: int, scale: int) -> pa.DataType:
    if digits + scale <= 38:
        return pa.decimal128(38, scale)
    return pa.decimal256(76, min(scale, 76))


def value_type(f: Feature, decimals: Decimals) -> pa.DataType:
    """The Arrow type of one value of the feature, as exported."""
    if f.hashed:
        return pa.int64()
    d = f.dtype
    if d is DType.BOOL:
        return pa.bool_()
    if d is DType.TIMESTAMP:
        return pa.timestamp(f.unit or "s")
    if d is DType.DATE:
        return pa.date32()
    if d is DType.TIME:
        return time_type(f.unit or "s")
    if d is DType.DECIMAL:
        if f.decimal_as == "scaled_int":
            return pa.decimal128(38, f.scale or 0)
        return _decimal_type(*decimals.get(f.name, (1, 0)))
    if d is DType.FLOAT64 and f.float64_bytes:
        return pa.float64()
    if d in (DType.FLOAT32, DType.FLOAT64):
        return pa.float32()
    if d is DType.STRING:
        return pa.string()
    if d in (DType.BYTES, DType.IMAGE):
        return pa.binary()
    return pa.int64()


def _tensor_ok(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def gap_key(f: Feature) -> str:
    return f"{f.name} absent"


def column_type(f: Feature, decimals: Decimals) -> pa.DataType:
    """The Arrow type of the feature's column: its value type in the feature's shape. A fixed
    shape absent from some record is a list (of lists): Parquet readers, pyarrow's among them,
    cannot read back a fixed-size list column that holds a null."""
    t = value_type(f, decimals)
    if f.is_scalar:
        return t
    if f.is_variable or (len(f.shape) == 1 and gap_key(f) in decimals):
        return pa.list_(t)
    if f.is_ragged or gap_key(f) in decimals:
        return pa.list_(pa.list_(t))
    if len(f.shape) == 1:
        return pa.list_(t, f.shape[0])
    if _tensor_ok(t):
        return pa.fixed_shape_tensor(t, list(f.shape))
    return pa.list_(pa.list_(t, f.shape[1]), f.shape[0])


def _numbers(values: np.ndarray, t: pa.DataType | None = None, valid: np.ndarray | None = None) -> pa.Array:
    """A numpy array of fixed-width values (bools included) as an Arrow array of type `t` (its
    own type by default) over the same memory, null where `valid` is False. Not `pa.array`:
    its first call in a process imports pandas (0.3-0.6 s), and it copies."""
    values = np.ascontiguousarray(values)
    if values.dtype == np.bool_:
        data = pa.py_buffer(np.packbits(values, bitorder="little"))
    else:
        data = pa.py_buffer(values)
    t = t or pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(t, len(values), [_validity(valid), data])


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    """Arrow's validity bitmap of `valid` (bool per element); None where every one is valid."""
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _mask(valid: np.ndarray) -> pa.Array | None:
    """The `mask=` argument of Arrow's from_arrays: True where not `valid`; None for no nulls."""
    return None if valid.all() else _numbers(~valid)


def _tree_type(node: Feature | Tree, decimals: Decimals) -> pa.DataType:
    if isinstance(node, Feature):
        return column_type(node, decimals)
    return pa.struct([pa.field(k, _tree_type(v, decimals)) for k, v in node.items()])


def arrow_schema(tree: Tree, decimals: Decimals) -> pa.Schema:
    """The exported table's schema (every column nullable)."""
    return pa.schema([pa.field(k, _tree_type(v, decimals)) for k, v in tree.items()])


def retyped(col: pa.Array, t: pa.DataType) -> pa.Array:
    """A staged batch's column as the export's common type: decimals at the largest scale, and
    fixed shapes as lists where some batch lacked one (tensors as lists of lists)."""
    if col.type == t:
        return col
    if pa.types.is_struct(t):
        children = [retyped(col.field(i), t.field(i).type) for i in range(t.num_fields)]
        mask = col.is_null() if col.null_count else None
        return pa.StructArray.from_arrays(children, fields=list(t), mask=mask)
    if isinstance(col.type, pa.FixedShapeTensorType):
        storage = col.storage
        inner = pa.FixedSizeListArray.from_arrays(storage.values, col.type.shape[1])
        mask = storage.is_null() if storage.null_count else None
        col = pa.FixedSizeListArray.from_arrays(inner, col.type.shape[0], mask=mask)
    return col.cast(t)


def to_record_batch(batch: Batch, tree: Tree) -> tuple[pa.RecordBatch, Decimals]:
    """The batch's records as rows of the source's columns, and its decimals' digits; raises
    BadRecord at the first record that does not hold what the schema says was written."""
    decimals: Decimals = {}
    arrays = [_node_array(batch, node, decimals) for node in tree.values()]
    return pa.RecordBatch.from_arrays(arrays, names=list(tree)), decimals


def _node_array(batch: Batch, node: Feature | Tree, decimals: Decimals) -> pa.Array:
    if isinstance(node, Feature):
        return _feature_array(batch, node, decimals)
    children = [_node_array(batch, child, decimals) for child in node.values()]
    # A struct whose every field is absent was a null struct, or one of nulls: the records cannot
    # tell the two apart, and null is what a reader of the features saw.
    valid = np.zeros(batch.size, bool)
    for child in children:
        valid |= pc.is_valid(child).to_numpy(zero_copy_only=False)
    return pa.StructArray.from_arrays(children, names=list(node), mask=_numbers(~valid))


@dataclass
class _Values:
    """One feature over a batch: which records have it, how many values each, the values."""

    valid: np.ndarray  # bool per record
    lengths: np.ndarray  # values per record (0 where absent)
    values: pa.Array  # every value, record after record

    def record_of(self, value: int) -> int:
        return int(np.searchsorted(np.cumsum(self.lengths), value, side="right"))


def _entries(batch: Batch, name: str, kind: int) -> _Values:
    """The feature's values per record, in record order, as the Examples hold them."""
    n = batch.size
    valid, lengths = np.zeros(n, bool), np.zeros(n, np.int64)
    col = batch.columns.get(name)
    if col is None:
        empty = {INT64: pa.int64(), FLOAT: pa.float32()}.get(kind, pa.large_binary())
        return _Values(valid, lengths, pa.nulls(0, empty))
    wrong = np.flatnonzero((col.kind != kind) & (col.kind != NONE))
    if len(wrong):
        got = kind_name(int(col.kind[wrong[0]]))
        raise BadRecord(int(col.rec[wrong[0]]), f"feature {name!r} holds {got} values, not {kind_name(kind)}")
    rec, count = col.rec, col.count
    raw: list[np.ndarray] = (
        [col.ints] if kind == INT64 else [col.floats] if kind == FLOAT else [col.starts, col.ends]
    )
    if len(rec) > 1 and bool(np.any(np.diff(rec) <= 0)):
        order = np.argsort(rec, kind="stable")
        twice = np.flatnonzero(np.diff(rec[order]) == 0)
        if len(twice):
            raise BadRecord(int(rec[order][twice[0]]), f"feature {name!r} appears twice")
        starts = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
        within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count[order]) - count[order], count[order])
        take = np.repeat(starts[order], count[order]) + within
        raw = [r[take] for r in raw]
        rec, count = rec[order], count[order]
    valid[rec] = True
    lengths[rec] = count
    if kind == BYTES:
        values = _gather(col.blob, raw[0], raw[1])
    else:
        values = _numbers(raw[0])
    return _Values(valid, lengths, values)


def _gather(blob: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    """The bytes values blob[starts[i]:ends[i]] as one large_binary array (offsets from 0, the
    values one after another in its data buffer)."""
    if len(starts) > 1 and bool(np.all(starts[1:] >= ends[:-1])):
        # Values in the order of the chunk's bytes (a record's are, and records follow each
        # other): over the blob, offsets s0, e0, s1, e1, ... make an array whose even elements
        # are the values and odd ones the bytes between them; Arrow's take copies the even ones.
        bounds = np.empty(2 * len(starts), np.int64)
        bounds[0::2], bounds[1::2] = starts, ends
        spans = pa.Array.from_buffers(
            pa.large_binary(), len(bounds) - 1, [None, pa.py_buffer(bounds), pa.py_buffer(blob)]
        )
        return spans.take(_numbers(np.arange(0, len(bounds) - 1, 2, dtype=np.int64)))
    sizes = (ends - starts).astype(np.int64)
    total = int(sizes.sum())
    offsets = np.cumsum(sizes) - sizes
    index = np.repeat(starts - offsets, sizes) + np.arange(total, dtype=np.int64)
    return binary_array(blob[index], sizes)


def _feature_array(batch: Batch, f: Feature, decimals: Decimals) -> pa.Array:
    v = _entries(batch, f.name, f.kind.value)
    if f.float64_bytes:
        v = _unpack_float64(v, f)
    values = _typed(v, f, decimals)
    v = _Values(v.valid, v.lengths, values)
    if f.is_ragged:
        return _ragged(batch, f, v)
    if not f.is_scalar and not v.valid.all():
        decimals[gap_key(f)] = (0, 0)
    return _shaped(v, f, column_type(f, decimals))


def _unpack_float64(v: _Values, f: Feature) -> _Values:
    """`encode: bytes`: one bytes value per record, 8 little-endian bytes per float64."""
    _one_each(v, f.name, "one bytes value")
    sizes = pc.binary_length(v.values).to_numpy(zero_copy_only=False).astype(np.int64)
    odd = np.flatnonzero(sizes % 8)
    if len(odd):
        raise BadRecord(v.record_of(int(odd[0])), f"feature {f.name!r}: {sizes[odd[0]]} bytes, not float64s")
    total = int(sizes.sum()) // 8
    # _gather's array: offsets from 0, its values one after another in its data buffer.
    floats = np.frombuffer(v.values.buffers()[2], "<f8", total) if total else np.zeros(0)
    lengths = v.lengths.copy()
    lengths[v.valid] = sizes // 8
    return _Values(v.valid, lengths, _numbers(floats.astype(np.float64)))


def _one_each(v: _Values, name: str, what: str) -> None:
    bad = np.flatnonzero(v.valid & (v.lengths != 1))
    if len(bad):
        raise BadRecord(int(bad[0]), f"feature {name!r} holds {v.lengths[bad[0]]} values, not {what}")


def _typed(v: _Values, f: Feature, decimals: Decimals) -> pa.Array:
    """The raw values (int64, float32, bytes) as the feature's value type."""
    raw = v.values
    t = value_type(f, decimals)
    if f.hashed or t == pa.int64() or pa.types.is_floating(t):
        return raw
    if pa.types.is_boolean(t):
        ints = raw.to_numpy(zero_copy_only=False)
        _refuse(v, np.flatnonzero((ints != 0) & (ints != 1)), f, "a bool that is not 0 or 1")
        return _numbers(ints.astype(bool))
    if pa.types.is_timestamp(t) or pa.types.is_time64(t):
        return raw.view(t)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        ints = raw.to_numpy(zero_copy_only=False)
        _refuse(v, np.flatnonzero((ints < -(2**31)) | (ints >= 2**31)), f, "a value beyond 32 bits")
        return _numbers(ints.astype(np.int32), t)
    if pa.types.is_decimal(t) and f.decimal_as == "scaled_int":
        ints = raw.to_numpy(zero_copy_only=False).astype(np.int64)
        words = np.stack([ints, ints >> 63], axis=1)  # 128-bit two's complement, low word first
        return pa.Array.from_buffers(t, len(ints), [None, pa.py_buffer(words.tobytes())])
    if pa.types.is_string(t):
        return _text(v, f).cast(pa.string())
    if pa.types.is_binary(t):
        return raw.cast(pa.binary())
    return _decimal(v, f, decimals)


def _refuse(v: _Values, bad: np.ndarray, f: Feature, what: str) -> None:
    if len(bad):
        raise BadRecord(v.record_of(int(bad[0])), f"feature {f.name!r}: {what}")


def _text(v: _Values, f: Feature) -> pa.Array:
    """Bytes values as text; the first value that is not UTF-8 names its record."""
    try:
        return v.values.cast(pa.large_string())
    except pa.ArrowInvalid:
        for i, value in enumerate(v.values.to_pylist()):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                _refuse(v, np.array([i]), f, "not UTF-8")
        raise


def _decimal(v: _Values, f: Feature, decimals: Decimals) -> pa.Array:
    """`as: string` decimals: the exact text, parsed at the largest scale of the batch."""
    text = _text(v, f)
    point = pc.find_substring(text, ".").to_numpy(zero_copy_only=False)
    size = pc.utf8_length(text).to_numpy(zero_copy_only=False)
    sign = pc.starts_with(text, "-").to_numpy(zero_copy_only=False).astype(np.int64)
    scale = np.where(point >= 0, size - point - 1, 0)
    digits = np.where(point >= 0, point, size) - sign
    found = (int(digits.max()) if len(digits) else 1, int(scale.max()) if len(scale) else 0)
    decimals[f.name] = found
    t = _decimal_type(*found)
    try:
        return text.cast(t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        for i in range(len(text)):
            try:
                text.slice(i, 1).cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                _refuse(v, np.array([i]), f, f"{text[i].as_py()!r} is not a decimal")
        raise


def _offsets(lengths: np.ndarray) -> pa.Array:
    """int32 list offsets of lists of `lengths` values."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return _numbers(offsets)


def _shaped(v: _Values, f: Feature, t: pa.DataType) -> pa.Array:
    """The values in the feature's shape, a null where a record does not have it."""
    mask = _mask(v.valid)
    k = math.prod(f.shape)
    bad = np.flatnonzero(v.valid & (v.lengths != k)) if f.num_values is not None else np.zeros(0, np.int64)
    if len(bad):
        raise BadRecord(int(bad[0]), f"feature {f.name!r} holds {v.lengths[bad[0]]} values, its shape {k}")
    if pa.types.is_list(t):
        lists = pa.ListArray.from_arrays(_offsets(v.lengths), v.values, mask=mask)
        if len(f.shape) == 1:
            return lists
        rows = pa.ListArray.from_arrays(_offsets(np.full(len(v.values) // f.shape[1], f.shape[1])), v.values)
        return pa.ListArray.from_arrays(_offsets(v.lengths // f.shape[1]), rows, mask=mask)
    full = v.values if mask is None or not k else _spread(v.values, np.repeat(v.valid, k))
    if f.is_scalar:
        return full
    if len(f.shape) == 1:
        return pa.FixedSizeListArray.from_arrays(full, k, mask=mask)
    if isinstance(t, pa.FixedShapeTensorType):
        return pa.ExtensionArray.from_storage(t, pa.FixedSizeListArray.from_arrays(full, k, mask=mask))
    inner = pa.FixedSizeListArray.from_arrays(full, f.shape[1])
    return pa.FixedSizeListArray.from_arrays(inner, f.shape[0], mask=mask)


def _spread(values: pa.Array, present: np.ndarray) -> pa.Array:
    """`values` (no nulls) in the slots where `present` is True, in order, and nulls in the
    others: an array of len(present), over the values' own data where they are variable-width."""
    t = values.type
    n = len(present)
    buffers = values.buffers()
    large = pa.types.is_large_binary(t) or pa.types.is_large_string(t)
    if large or pa.types.is_binary(t) or pa.types.is_string(t):
        # Slot s ends where the values of the present slots up to s end: the data stays as it is.
        width = np.int64 if large else np.int32
        offsets = np.frombuffer(buffers[1], width)[values.offset : values.offset + len(values) + 1]
        ends = np.zeros(n + 1, np.int64)
        np.cumsum(present, out=ends[1:])
        return pa.Array.from_buffers(t, n, [_validity(present), pa.py_buffer(offsets[ends]), buffers[2]])
    if t.bit_width % 8 or len(buffers) != 2:  # bools
        bools = np.zeros(n, bool)
        bools[present] = values.to_numpy(zero_copy_only=False)
        return _numbers(bools, t, present)
    # Fixed-width values (numbers, times, decimals) moved as bytes: the same code for each type.
    size = t.bit_width // 8
    word = np.dtype(f"<u{size}") if size in (1, 2, 4, 8) else np.dtype((np.void, size))
    raw = np.frombuffer(buffers[1], word, len(values), values.offset * size)
    out = np.zeros(n, word)
    out[present] = raw
    return pa.Array.from_buffers(t, n, [_validity(present), pa.py_buffer(out)])


def _ragged(batch: Batch, f: Feature, v: _Values) -> pa.Array:
    """Values plus `{name}.row_lengths`: a list of lists per record."""
    rows = _entries(batch, f.row_lengths_name, INT64)
    apart = np.flatnonzero(rows.valid != v.valid)
    if len(apart):
        raise BadRecord(
            int(apart[0]), f"feature {f.name!r} and {f.row_lengths_name!r}: one without the other"
        )
    inner = rows.values.to_numpy(zero_copy_only=False)
    sums = np.concatenate([[0], np.cumsum(inner)])
    ends = np.cumsum(rows.lengths)
    wrong = np.flatnonzero(sums[ends] - sums[ends - rows.lengths] != v.lengths)
    if len(wrong) or (inner < 0).any():
        at = int(wrong[0]) if len(wrong) else rows.record_of(int(np.flatnonzero(inner < 0)[0]))
        raise BadRecord(at, f"feature {f.name!r}: its row lengths do not add up to its values")
    lists = pa.ListArray.from_arrays(_offsets(inner), v.values)
    return pa.ListArray.from_arrays(_offsets(rows.lengths), lists, mask=_mask(v.valid))
