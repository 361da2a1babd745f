"""Conforming source record batches to a plan: casts, shapes, null policy and checks, per batch."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_array, drop_hidden_values
from recordforge.conforming.casts import Failure, cast_values
from recordforge.conforming.json_lists import parse_json_lists
from recordforge.conforming.ops import apply_ops, check_values
from recordforge.errors import DataError, SourceError
from recordforge.images.columns import ImageOptions, load_image_column
from recordforge.images.files import manifest_dir
from recordforge.schemas.kinds import DType, NullPolicy
from recordforge.schemas.model import Feature
from recordforge.schemas.plan import Plan

__all__ = ["BadRow", "Conformed", "conform_batch"]


@dataclass(frozen=True)
class BadRow:
    """A row that broke a rule: where it is, which column, which rule, the offending value."""

    file: str
    row: int  # 1-based data row within the file
    column: str
    rule: str
    reason: str
    value: Any

    def error(self) -> DataError:
        return DataError(
            file=self.file,
            row=self.row,
            column=self.column,
            reason=f"{self.reason} [rule: {self.rule}]",
            value=self.value,
        )


@dataclass(frozen=True)
class Conformed:
    batch: pa.RecordBatch  # the good rows, in the plan's Arrow schema
    rejected: list[BadRow]
    rejected_rows: np.ndarray  # indices of the rejected rows in the source batch


class _Failures:
    """The first failure of each bad row of one batch."""

    def __init__(self, file: str, first_row: int) -> None:
        self.file = file
        self.first_row = first_row
        self.rows: dict[int, BadRow] = {}

    def add(
        self, rows: np.ndarray, column: str, rule: str, reason: str, values: pa.Array, value_index: np.ndarray
    ) -> None:
        for r, i in zip(rows.tolist(), value_index.tolist(), strict=True):
            if r not in self.rows:
                self.rows[r] = BadRow(
                    self.file, self.first_row + r + 1, column, rule, reason, values[i].as_py()
                )

    def add_failures(
        self, failures: list[Failure], column: str, values: pa.Array, offsets: np.ndarray | None
    ) -> None:
        for f in failures:
            self.add(_rows_of(f.indices, offsets), column, f.rule, f.reason, values, f.indices)


def _rows_of(value_indices: np.ndarray, offsets: np.ndarray | None) -> np.ndarray:
    if offsets is None:
        return value_indices
    return np.searchsorted(offsets, value_indices, side="right") - 1


def conform_batch(
    batch: pa.RecordBatch,
    plan: Plan,
    *,
    file: str,
    first_row: int,
    text_lists: bool = False,
    read: dict[str, pa.Array] | None = None,
) -> Conformed:
    """Returns the batch's good rows with the plan's Arrow schema (one column per written feature,
    values cast to the encoder's types, nulls handled per policy) and its bad rows. Raises
    SourceError when a column is missing or has a type that can never hold its feature.
    `text_lists`: list features arrive as JSON text (CSV); otherwise a scalar column feeding a
    list feature is read as lists of one value. `read`: image bytes the source has read, by the
    column of their paths (SourceBatch.read)."""
    fails = _Failures(file, first_row)
    arrays = [a for f in plan.features for a in _conform_feature(batch, f, fails, text_lists, read or {})]
    if not fails.rows:
        return Conformed(
            pa.RecordBatch.from_arrays(arrays, schema=plan.arrow_schema), [], np.zeros(0, np.int64)
        )
    bad = np.array(sorted(fails.rows), dtype=np.int64)
    keep = np.ones(batch.num_rows, dtype=bool)
    keep[bad] = False
    mask = pa.array(keep)
    good = pa.RecordBatch.from_arrays([a.filter(mask) for a in arrays], schema=plan.arrow_schema)
    return Conformed(good, [fails.rows[r] for r in bad.tolist()], bad)


def _source_column(batch: pa.RecordBatch, f: Feature, file: str) -> pa.Array:
    """The feature's column; `a.b` names field b of struct column a when no column is `a.b`."""
    name = f.source_column
    idx = batch.schema.get_field_index(name)
    if idx >= 0:
        col = batch.column(idx)
    else:
        head, *path = name.split(".")
        top = batch.schema.get_field_index(head)
        if not path or top < 0:
            raise SourceError(
                f"{file}: no column {name!r} (needed by feature {f.name!r}); columns are "
                f"{', '.join(batch.schema.names)}"
            )
        col = batch.column(top)
        for part in path:
            if not pa.types.is_struct(col.type) or col.type.get_field_index(part) < 0:
                raise SourceError(f"{file}: column {name!r}: no struct field {part!r} in {col.type}")
            col = pc.struct_field(col, part)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if isinstance(col.type, pa.FixedShapeTensorType):
        col = _tensor_lists(col)
    return col


def _tensor_lists(col: pa.Array) -> pa.Array:
    """A fixed_shape_tensor column as the fixed-size lists (of fixed-size lists) its shape reads
    as: its storage is the values row-major, one fixed-size list per tensor."""
    storage = col.storage
    shape = col.type.shape
    mask = storage.is_null() if storage.null_count else None
    if len(shape) != 2:
        return storage
    values = storage.values.slice(storage.offset * shape[0] * shape[1], len(storage) * shape[0] * shape[1])
    return pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(values, shape[1]), shape[0], mask=mask
    )


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _as_large_list(col: pa.Array) -> pa.Array:
    """Any list column as large_list, its null rows spanning no values (the values under a null
    row are no one's: never checked, never written)."""
    if not pa.types.is_large_list(col.type):
        col = col.cast(pa.large_list(col.type.value_type))
    return drop_hidden_values(col)


def _offsets(lists: pa.Array) -> np.ndarray:
    off = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    return off - off[0]


def _flat_values(lists: pa.Array) -> pa.Array:
    start = int(lists.offsets[0].as_py())
    return lists.values.slice(start, int(lists.offsets[-1].as_py()) - start)


def _conform_feature(
    batch: pa.RecordBatch, f: Feature, fails: _Failures, text_lists: bool, read: dict[str, pa.Array]
) -> list[pa.Array]:
    col = _source_column(batch, f, fails.file)
    column = f.source_column
    if f.is_image:
        return _conform_image(col, f, fails, read.get(column))
    if f.is_scalar:
        if _is_list(col.type):
            raise SourceError(
                f"{fails.file}: column {column!r} holds lists ({col.type}) but feature {f.name!r} "
                "is declared scalar (shape: [])"
            )
        values, failures = cast_values(col, f, fails.file)
        fails.add_failures(failures, column, col, None)
        values = apply_ops(values, f)
        fails.add_failures(check_values(values, f), column, col, None)
        values = _apply_nulls(values, f, fails, col)
        return [_pack_scalar(values, f)]

    if text_lists and (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        rows = np.flatnonzero(pc.is_valid(col).to_numpy(zero_copy_only=False))  # non-UTF-8 cells
        fails.add(rows, column, "utf8", "not UTF-8 text, so not a JSON array", col, rows)
        col = pa.nulls(len(col), pa.string())
    if text_lists and (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        if len(f.shape) == 1 and not pc.any(pc.starts_with(pc.utf8_ltrim_whitespace(col), "[")).as_py():
            # One value per cell (TFDV's shape [1]): lists of one, cast as scalar cells are.
            blank = pc.equal(pc.utf8_trim_whitespace(col), "")
            col = _one_value_lists(pc.if_else(blank, pa.scalar(None, col.type), col))
        else:
            lists, unparsed = parse_json_lists(col, f)
            for i, rule, reason in unparsed:  # the cell's text is the value a rejected row shows
                fails.add(np.array([i]), f.source_column, rule, reason, col, np.array([i]))
            col = lists
    elif not _is_list(col.type) and len(f.shape) == 1:
        col = _one_value_lists(col)
    if not _is_list(col.type):
        raise SourceError(
            f"{fails.file}: column {column!r} is {col.type}, but feature {f.name!r} has shape "
            f"{list(f.shape)} and needs a list column"
        )
    lists = _as_large_list(col)
    row_lengths = None
    if len(f.shape) == 2:
        if not _is_list(lists.type.value_type):
            raise SourceError(
                f"{fails.file}: column {column!r} is {col.type}, but feature {f.name!r} has shape "
                f"{list(f.shape)} and needs a list of lists"
            )
        lists, row_lengths = _flatten_nested(lists, f, fails, col)
    elif _is_list(lists.type.value_type):
        raise SourceError(
            f"{fails.file}: column {column!r} holds nested lists ({col.type}) but feature "
            f"{f.name!r} has shape {list(f.shape)}; use [N, M] or [-1, -1] (ragged)"
        )
    offsets = _offsets(lists)
    flat = _flat_values(lists)
    source_nulls = np.flatnonzero(~pc.is_valid(flat).to_numpy(zero_copy_only=False))
    values, failures = cast_values(flat, f, fails.file)
    fails.add_failures(failures, column, flat, offsets)
    if source_nulls.size:
        fails.add(
            _rows_of(source_nulls, offsets),
            column,
            "list_null",
            "a list holds a null value, which a tf.train.Example cannot represent",
            col,
            _rows_of(source_nulls, offsets),
        )
    values = apply_ops(values, f)
    fails.add_failures(check_values(values, f), column, flat, offsets)
    valid = pc.is_valid(lists)
    out = pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), values, mask=pc.invert(valid))
    out = _apply_nulls(out, f, fails, col)
    lengths = pc.list_value_length(out).to_numpy(zero_copy_only=False)
    present = pc.is_valid(out).to_numpy(zero_copy_only=False)
    if f.num_values is not None:
        bad = np.flatnonzero(present & (lengths != f.num_values))
        fails.add(bad, column, "shape", f"shape {list(f.shape)} needs {f.num_values} values", col, bad)
    if f.max_length is not None:
        bad = np.flatnonzero(present & (lengths > f.max_length))
        fails.add(bad, column, "max_length", f"more than max_length {f.max_length} values", col, bad)
    if f.float64_bytes:
        return [_float64_bytes(out)]
    if f.is_ragged:
        assert row_lengths is not None
        return [out, row_lengths]
    return [out]


def _conform_image(col: pa.Array, f: Feature, fails: _Failures, read: pa.Array | None) -> list[pa.Array]:
    """Paths (relative to the manifest; a blank one is a null) or encoded bytes, to the image bytes
    and header values; an unreadable image rejects its row (rule `image`). `read`: paths' bytes."""
    kinds = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    if not any(is_kind(col.type) for is_kind in kinds):
        raise SourceError(
            f"{fails.file}: column {f.source_column!r} is {col.type}; an image "
            "column holds paths (strings) or encoded bytes"
        )
    opts = ImageOptions(
        resize=f.resize, method=f.method, encode=f.encode, quality=f.quality, channels=f.channels
    )
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.if_else(pc.equal(pc.utf8_trim_whitespace(col), ""), pa.scalar(None, col.type), col)
    images = load_image_column(col, manifest_dir(fails.file), opts, read=read)
    for i, reason in sorted(images.errors.items()):
        fails.add(np.array([i]), f.source_column, "image", reason, col, np.array([i]))
    if f.nulls is NullPolicy.REQUIRED:
        missing = np.flatnonzero(~pc.is_valid(col).to_numpy(zero_copy_only=False))
        fails.add(missing, f.source_column, "null", "null in a feature with `nulls: required`", col, missing)
    absent = ~images.present
    return [
        images.data,
        pa.array(images.height, mask=absent),
        pa.array(images.width, mask=absent),
        pa.array(images.channels, mask=absent),
        images.format,
    ]


def _one_value_lists(col: pa.Array) -> pa.Array:
    """A scalar column as lists of one value; a null is a null list holding no value (so it is
    absent, not a list with a null in it)."""
    if not col.null_count:
        return pa.LargeListArray.from_arrays(pa.array(np.arange(len(col) + 1, dtype=np.int64)), col)
    valid = pc.is_valid(col)
    offsets = np.zeros(len(col) + 1, dtype=np.int64)
    np.cumsum(valid.to_numpy(zero_copy_only=False), out=offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(offsets), col.filter(valid), mask=pc.invert(valid))


def _flatten_nested(
    lists: pa.Array, f: Feature, fails: _Failures, col: pa.Array
) -> tuple[pa.Array, pa.Array]:
    """A list of lists flattened per row; for [N, M] every inner list must have M values, for
    ragged [-1, -1] the inner lengths are kept as the row_lengths feature."""
    outer = _offsets(lists)
    inner = _as_large_list(_flat_values(lists))
    inner_off = _offsets(inner)
    lengths = pc.list_value_length(inner).to_numpy(zero_copy_only=False)
    null_inner = np.flatnonzero(~pc.is_valid(inner).to_numpy(zero_copy_only=False))
    if null_inner.size:
        rows = _rows_of(null_inner, outer)
        fails.add(rows, f.source_column, "list_null", "a nested list is null", col, rows)
    if not f.is_ragged:
        bad = np.flatnonzero((lengths != f.shape[1]) & pc.is_valid(inner).to_numpy(zero_copy_only=False))
        rows = _rows_of(bad, outer)
        fails.add(
            rows,
            f.source_column,
            "shape",
            f"shape {list(f.shape)} needs inner lists of length {f.shape[1]}",
            col,
            rows,
        )
        outer_len = np.diff(outer)
        valid = pc.is_valid(lists).to_numpy(zero_copy_only=False)
        bad_rows = np.flatnonzero(valid & (outer_len != f.shape[0]))
        fails.add(
            bad_rows,
            f.source_column,
            "shape",
            f"shape {list(f.shape)} needs {f.shape[0]} inner lists",
            col,
            bad_rows,
        )
    flat_offsets = inner_off[outer]
    mask = pc.invert(pc.is_valid(lists))
    flat = pa.LargeListArray.from_arrays(pa.array(flat_offsets, pa.int64()), _flat_values(inner), mask=mask)
    row_lengths = pa.LargeListArray.from_arrays(
        pa.array(outer, pa.int64()), pa.array(np.nan_to_num(lengths).astype(np.int64)), mask=mask
    )
    return flat, row_lengths


def _apply_nulls(arr: pa.Array, f: Feature, fails: _Failures, col: pa.Array) -> pa.Array:
    if not arr.null_count or f.nulls is NullPolicy.ABSENT:
        return arr
    if f.nulls is NullPolicy.REQUIRED:
        rows = np.flatnonzero(~pc.is_valid(arr).to_numpy(zero_copy_only=False))
        fails.add(rows, f.source_column, "null", "null in a feature with `nulls: required`", col, rows)
        return arr
    return pc.fill_null(arr, _default_scalar(f, arr.type))


def _default_scalar(f: Feature, arrow_type: pa.DataType) -> pa.Scalar:
    default = f.default
    values = default if isinstance(default, list) else [default]
    if pa.types.is_large_binary(arrow_type) or (
        pa.types.is_large_list(arrow_type) and pa.types.is_large_binary(arrow_type.value_type)
    ):
        values = [v.encode() if isinstance(v, str) else v for v in values]
    elif f.dtype is DType.BOOL:
        values = [int(v) for v in values]
    return pa.scalar(values if isinstance(default, list) else values[0], arrow_type)


def _pack_scalar(values: pa.Array, f: Feature) -> pa.Array:
    if f.encode != "bytes":
        return values
    lists = pa.LargeListArray.from_arrays(
        pa.array(np.arange(len(values) + 1), pa.int64()),
        values.fill_null(0.0),
        mask=pc.is_null(values),
    )
    return _float64_bytes(lists)


def _float64_bytes(lists: pa.Array) -> pa.Array:
    """Each row's float64 values as one little-endian bytes value: exact, all 64 bits."""
    offsets = _offsets(lists)
    flat = _flat_values(lists)
    data = flat.fill_null(0.0).to_numpy(zero_copy_only=False).astype("<f8").view(np.uint8)
    valid = pc.is_valid(lists).to_numpy(zero_copy_only=False)
    return binary_array(data, np.diff(offsets) * 8, valid=valid)
