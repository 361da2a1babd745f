"""Conforming source record batches to a plan: casts, shape checks and null policy, per batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.errors import DataError, SourceError
from recordforge.schemas.model import DType, Feature, NullPolicy
from recordforge.schemas.plan import Plan, value_type

__all__ = ["conform_batch"]


@dataclass(frozen=True)
class _Where:
    """Where a batch came from, to name the row of a bad value."""

    file: str
    first_row: int  # 0-based index of the batch's first row within the file

    def error(self, row_in_batch: int, column: str, reason: str, value: object = None) -> DataError:
        return DataError(
            file=self.file, row=self.first_row + int(row_in_batch) + 1, column=column,
            reason=reason, value=value,
        )


def conform_batch(batch: pa.RecordBatch, plan: Plan, *, file: str, first_row: int) -> pa.RecordBatch:
    """Returns a batch with the plan's Arrow schema: one column per feature, values cast to the
    encoder's types, nulls handled per policy. Raises DataError at the first bad value and
    SourceError when a column is missing or has a type that cannot hold the feature."""
    where = _Where(file, first_row)
    arrays = [_conform_feature(batch, f, where) for f in plan.features]
    return pa.RecordBatch.from_arrays(arrays, schema=plan.arrow_schema)


def _conform_feature(batch: pa.RecordBatch, f: Feature, where: _Where) -> pa.Array:
    col_name = f.source_column
    idx = batch.schema.get_field_index(col_name)
    if idx < 0:
        raise SourceError(
            f"{where.file}: no column {col_name!r} (needed by feature {f.name!r}); "
            f"columns are {', '.join(batch.schema.names)}"
        )
    col = batch.column(idx)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if f.is_scalar:
        if _is_list(col.type):
            raise SourceError(
                f"{where.file}: column {col_name!r} holds lists ({col.type}) but feature {f.name!r} "
                "is declared scalar (shape: [])"
            )
        values = _cast_values(col, f, where, rows=None)
        return _apply_nulls(values, f, where)
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = _parse_json_lists(col, f, where)
    if not _is_list(col.type):
        raise SourceError(
            f"{where.file}: column {col_name!r} is {col.type}, but feature {f.name!r} has shape "
            f"{list(f.shape)} and needs a list column"
        )
    lists = _flatten_inner(col, f, where)
    offsets = np.asarray(lists.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    start = int(offsets[0])
    flat = lists.values.slice(start, int(offsets[-1]) - start)
    rows = offsets - start
    values = _cast_values(flat, f, where, rows=rows)
    if values.null_count:
        i = int(np.flatnonzero(~_valid(values))[0])
        raise where.error(_row_of(i, rows), col_name, "a list holds a null value, which a "
                          "tf.train.Example cannot represent")
    out = pa.LargeListArray.from_arrays(
        pa.array(rows, pa.int64()), values, mask=pc.is_null(lists)
    )
    out = _apply_nulls(out, f, where)
    if f.num_values is not None:
        _check_lengths(out, f.num_values, col_name, where, what=f"shape {list(f.shape)} needs")
    return out


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _flatten_inner(col: pa.Array, f: Feature, where: _Where) -> pa.LargeListArray:
    """Returns a large_list of scalar values; a nested [N, M] column is checked and flattened."""
    if pa.types.is_fixed_size_list(col.type):
        col = col.cast(pa.large_list(col.type.value_type))
    elif pa.types.is_list(col.type):
        col = col.cast(pa.large_list(col.type.value_type))
    if not _is_list(col.type.value_type):
        return col
    if len(f.shape) != 2:
        raise SourceError(
            f"{where.file}: column {f.source_column!r} holds nested lists ({col.type}) but "
            f"feature {f.name!r} has shape {list(f.shape)}; nested lists need a shape [N, M]"
        )
    outer = np.asarray(col.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    outer = outer - outer[0]
    start = int(col.offsets[0].as_py())
    inner = col.values.slice(start, int(outer[-1])).cast(
        pa.large_list(col.type.value_type.value_type)
    )
    lengths = pc.list_value_length(inner).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(pc.is_null(inner).to_numpy(zero_copy_only=False) | (lengths != f.shape[1]))
    if bad.size:
        raise where.error(_row_of(int(bad[0]), outer), f.source_column,
                          f"shape {list(f.shape)} needs inner lists of length {f.shape[1]}",
                          inner[int(bad[0])].as_py())
    _check_lengths(col, f.shape[0], f.source_column, where, what="shape needs outer length")
    inner_off = np.asarray(inner.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    flat_offsets = inner_off[outer]
    return pa.LargeListArray.from_arrays(
        pa.array(flat_offsets - flat_offsets[0], pa.int64()),
        inner.values.slice(int(flat_offsets[0]), int(flat_offsets[-1] - flat_offsets[0])),
        mask=pc.is_null(col),
    )


_JSON_VALUE_TYPES = {
    DType.INT64: pa.int64(), DType.BOOL: pa.bool_(), DType.FLOAT32: pa.float32(),
    DType.FLOAT64: pa.float64(), DType.BYTES: pa.binary(), DType.STRING: pa.string(),
}


def _parse_json_lists(col: pa.Array, f: Feature, where: _Where) -> pa.Array:
    """CSV cells of list features hold JSON arrays (`[1, 2]`); an empty cell is a null. Values are
    converted straight to the declared type, as a typed CSV column would be."""
    column = f.source_column
    value_t = _JSON_VALUE_TYPES[f.dtype]
    list_t = pa.list_(pa.list_(value_t) if len(f.shape) == 2 else value_t)
    parsed = []
    for i, cell in enumerate(col.to_pylist()):
        if cell is None or cell == "":
            parsed.append(None)
            continue
        try:
            value = json.loads(cell)
        except ValueError as exn:
            raise where.error(i, column, f"not a JSON array: {exn}", cell) from exn
        if not isinstance(value, list):
            raise where.error(i, column, "not a JSON array", cell)
        if f.dtype is DType.BYTES:
            value = [v.encode() if isinstance(v, str) else v for v in value]
        parsed.append(value)
    try:
        return pa.array(parsed, list_t)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        for i, value in enumerate(parsed):
            try:
                pa.array([value], list_t)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exn:
                raise where.error(i, column, f"list values are not {f.dtype.value}: {exn}",
                                  col[i].as_py()) from exn
        raise


def _valid(arr: pa.Array) -> np.ndarray:
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


def _row_of(value_index: int, rows: np.ndarray | None) -> int:
    if rows is None:
        return value_index
    return int(np.searchsorted(rows, value_index, side="right") - 1)


def _cast_values(
    arr: pa.Array, f: Feature, where: _Where, *, rows: np.ndarray | None
) -> pa.Array:
    """Casts values to the encoder's type; a value that does not fit fails naming its row."""
    src = arr.type
    column = f.source_column

    def fail(index: int, reason: str) -> DataError:
        return where.error(_row_of(index, rows), column, reason, arr[index].as_py())

    def checked(fn: Callable[[pa.Array], pa.Array], what: str) -> pa.Array:
        try:
            return fn(arr)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exn:
            if isinstance(exn, pa.ArrowNotImplementedError) or len(arr) == 0:
                raise SourceError(
                    f"{where.file}: column {column!r} of type {src} cannot hold feature "
                    f"{f.name!r} ({f.dtype.value}): {exn}"
                ) from exn
            i, reason = _first_failure(arr, fn)
            raise fail(i, f"{what}: {reason}") from exn

    target = value_type(f)
    if f.dtype is DType.FLOAT32 and pa.types.is_float64(src):
        raise SourceError(
            f"{where.file}: column {column!r} is float64 but feature {f.name!r} is float32; "
            "declare `type: float64` with `narrow: true` to accept the precision loss"
        )
    if f.dtype is DType.FLOAT64:
        wide = checked(lambda a: pc.cast(a, pa.float64()), "not a float64")
        narrow = pc.cast(wide, pa.float32(), safe=False)
        w = wide.to_numpy(zero_copy_only=False)
        n = narrow.to_numpy(zero_copy_only=False)
        overflow = np.isfinite(w) & ~np.isfinite(n)
        if overflow.any():
            raise fail(int(np.flatnonzero(overflow)[0]), "float64 value is outside float32 range")
        return narrow
    if f.dtype is DType.BOOL:
        if pa.types.is_integer(src):
            ok = pc.is_in(arr, pa.array([0, 1], src)).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(~ok & _valid(arr))
            if bad.size:
                raise fail(int(bad[0]), "a bool must be 0 or 1")
        elif not pa.types.is_boolean(src):
            arr = checked(lambda a: pc.cast(a, pa.bool_()), "not a bool")
        return pc.cast(arr, pa.int64())
    if f.dtype is DType.STRING and not (pa.types.is_string(src) or pa.types.is_large_string(src)):
        checked(lambda a: pc.cast(a, pa.large_string()), "not valid UTF-8")
    if f.dtype in (DType.STRING, DType.BYTES) and pa.types.is_fixed_size_binary(src):
        arr = pc.cast(arr, pa.binary())
    if f.dtype in (DType.INT64,) and pa.types.is_floating(src):
        # Safe casts refuse fractions; also refuse NaN/inf rather than invent an integer.
        arr = checked(lambda a: pc.cast(a, target), "not an integer")
        return arr
    return checked(lambda a: pc.cast(a, target), f"not a {f.dtype.value}")


def _first_failure(arr: pa.Array, fn: Callable[[pa.Array], pa.Array]) -> tuple[int, str]:
    """Bisects to the first element `fn` fails on: log2(n) calls of a vectorised cast."""
    lo, hi = 0, len(arr)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            fn(arr.slice(lo, mid - lo))
        except pa.ArrowInvalid:
            hi = mid
        else:
            lo = mid
    try:
        fn(arr.slice(lo, 1))
    except pa.ArrowInvalid as exn:
        return lo, str(exn)
    return lo, "conversion failed"


def _apply_nulls(arr: pa.Array, f: Feature, where: _Where) -> pa.Array:
    if not arr.null_count or f.nulls is NullPolicy.ABSENT:
        return arr
    if f.nulls is NullPolicy.REQUIRED:
        i = int(np.flatnonzero(~_valid(arr))[0])
        raise where.error(i, f.source_column, "null in a feature with `nulls: required`")
    default = f.default
    values = default if isinstance(default, list) else [default]
    if f.dtype in (DType.BYTES, DType.STRING):
        values = [v.encode() if isinstance(v, str) else v for v in values]
    elif f.dtype is DType.BOOL:
        values = [int(v) for v in values]
    fill = pa.scalar(values if isinstance(default, list) else values[0], arr.type)
    return pc.fill_null(arr, fill)


def _check_lengths(arr: pa.Array, n: int, column: str, where: _Where, *, what: str) -> None:
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    valid = _valid(arr)
    bad = np.flatnonzero(valid & (lengths != n))
    if bad.size:
        i = int(bad[0])
        raise where.error(i, column, f"{what} {n} values, found {int(lengths[i])}")
