"""Inferring a schema from a source's Arrow schema."""

from __future__ import annotations

import pyarrow as pa

from recordforge.errors import SchemaError
from recordforge.schemas.model import VARIABLE, DType, Feature, NullPolicy, Schema, normalize_name

__all__ = ["infer_schema"]


def _dtype(t: pa.DataType) -> DType | None:
    if pa.types.is_dictionary(t):
        return _dtype(t.value_type)
    if pa.types.is_boolean(t):
        return DType.BOOL
    if pa.types.is_integer(t):
        return DType.INT64  # uint64 values above 2**63-1 are rejected at run time, not wrapped
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return DType.FLOAT32
    if pa.types.is_float64(t):
        return DType.FLOAT64
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return DType.STRING
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return DType.BYTES
    return None


def _shape(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType] | None:
    if pa.types.is_fixed_size_list(t):
        return (t.list_size,), t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return (VARIABLE,), t.value_type
    return (), t


def infer_schema(arrow_schema: pa.Schema, *, origin: str = "inferred") -> Schema:
    """One feature per column. Names are normalised, float64 is narrowed (and says so), nullable
    columns get `nulls: absent`; a column of a type with no faithful mapping is an error."""
    features = []
    notes = []
    unsupported = []
    for field in arrow_schema:
        shape, value_t = _shape(field.type)
        dtype = _dtype(value_t)
        if dtype is None:
            unsupported.append(f"{field.name!r} ({field.type})")
            continue
        name = normalize_name(field.name)
        if name != field.name:
            notes.append(f"column {field.name!r} is written as feature {name!r}")
        narrow = dtype is DType.FLOAT64
        if narrow:
            notes.append(f"column {field.name!r} is float64, written narrowed to float32")
        features.append(
            Feature(
                name=name,
                dtype=dtype,
                shape=shape,
                column=field.name if name != field.name else None,
                nulls=NullPolicy.ABSENT if field.nullable else NullPolicy.REQUIRED,
                narrow=narrow,
            )
        )
    if unsupported:
        raise SchemaError(
            f"{origin}: cannot infer a feature for column(s) {', '.join(unsupported)}; "
            "write a schema file (--schema) that leaves them out or maps them explicitly"
        )
    names = [f.name for f in features]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise SchemaError(
            f"{origin}: columns normalise to the same feature name(s) {', '.join(clashes)}; "
            "write a schema file (--schema) that names them apart"
        )
    return Schema(tuple(features), origin="inferred", notes=tuple(notes))
