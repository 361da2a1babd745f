"""Inferring a schema from a source's Arrow schema, and describing a sample of its values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recordforge.errors import SchemaError
from recordforge.schemas.kinds import RAGGED, VARIABLE, DType, NullPolicy, normalize_name
from recordforge.schemas.model import Feature, Schema
from recordforge.sources import table_files
from recordforge.sources.probe import never_null_columns, parquet_footers, read_arrow_schema

__all__ = ["infer_schema", "inferred_schema", "sample_notes"]

_UNITS = {"s", "ms", "us", "ns"}


@dataclass(frozen=True)
class _Typed:
    dtype: DType
    unit: str | None = None
    decimal_as: str | None = None


def _scalar(t: pa.DataType) -> _Typed | None:
    if pa.types.is_dictionary(t):
        return _scalar(t.value_type)
    if pa.types.is_boolean(t):
        return _Typed(DType.BOOL)
    if pa.types.is_integer(t):
        return _Typed(DType.INT64)  # uint64 values above 2**63-1 are rejected, never wrapped
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return _Typed(DType.FLOAT32)
    if pa.types.is_float64(t):
        return _Typed(DType.FLOAT64)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _Typed(DType.STRING)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _Typed(DType.BYTES)
    if pa.types.is_timestamp(t) and t.unit in _UNITS:
        return _Typed(DType.TIMESTAMP, unit=t.unit)
    if pa.types.is_date(t):
        return _Typed(DType.DATE)
    if pa.types.is_time(t):
        return _Typed(DType.TIME, unit=t.unit)
    if pa.types.is_decimal(t):
        return _Typed(DType.DECIMAL, decimal_as="string")  # exact text, any precision
    return None


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _shape(t: pa.DataType) -> tuple[tuple[int, ...], pa.DataType]:
    if isinstance(t, pa.FixedShapeTensorType):  # Arrow's canonical tensor: row-major, 1 or 2 dims
        if t.permutation not in (None, list(range(len(t.shape)))) or not 1 <= len(t.shape) <= 2:
            return (), t
        return tuple(t.shape), t.value_type
    if not _is_list(t):
        return (), t
    inner = t.value_type
    if _is_list(inner):
        if pa.types.is_fixed_size_list(t) and pa.types.is_fixed_size_list(inner):
            return (t.list_size, inner.list_size), inner.value_type
        return RAGGED, inner.value_type
    if pa.types.is_fixed_size_list(t):
        return (t.list_size,), inner
    return (VARIABLE,), inner


def _is_tensor(t: pa.DataType) -> bool:
    """A tensor column: Arrow's fixed_shape_tensor, or a fixed-size list of fixed-size lists."""
    return isinstance(t, pa.FixedShapeTensorType) or (
        pa.types.is_fixed_size_list(t) and pa.types.is_fixed_size_list(t.value_type)
    )


def _never_null(path: str, never_null: frozenset[str]) -> bool:
    """A column known to hold no null; a tensor's values are Parquet leaves below it (`emb.list.
    element`), whose null counts count the tensors that are null too."""
    return path in never_null or any(
        n.startswith(path + ".") and set(n[len(path) + 1 :].split(".")) <= {"list", "element", "item"}
        for n in never_null
    )


def _leaves(field: pa.Field, prefix: str = "") -> Iterable[tuple[str, pa.Field, bool]]:
    """(column path, field, nullable along the path) for every non-struct leaf."""
    path = prefix + field.name
    if pa.types.is_struct(field.type):
        for child in field.type:
            for leaf_path, leaf, nullable in _leaves(child, path + "."):
                yield leaf_path, leaf, nullable or field.nullable
    else:
        yield path, field, field.nullable


def infer_schema(
    arrow_schema: pa.Schema,
    *,
    origin: str = "inferred",
    lossless: bool = False,
    never_null: frozenset[str] = frozenset(),
) -> Schema:
    """One feature per column (per leaf field of a struct, as `struct.field`). Names are
    normalised, nullable columns get `nulls: absent`, except the scalar columns in `never_null`
    (known to hold no null in any input), which get `nulls: required`: dense features. float64 is
    narrowed to float32 (and says so) unless `lossless`, which keeps it bit-exact with
    `encode: bytes`. A column of a type with no faithful mapping is an error."""
    names = arrow_schema.names
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise SchemaError(
            f"{origin}: column {repeated[0]!r} appears {names.count(repeated[0])} times; rename all "
            "but one, or write a schema file (--schema) that leaves it out"
        )
    features = []
    notes = []
    unsupported = []
    dense_columns: list[str] = []
    for top in arrow_schema:
        for path, leaf, nullable in _leaves(top):
            shape, value_t = _shape(leaf.type)
            typed = _scalar(value_t)
            if typed is None:
                unsupported.append(f"{path!r} ({leaf.type})")
                continue
            name = normalize_name(path)
            if name != path:
                notes.append(f"column {path!r} is written as feature {name!r}")
            is_f64 = typed.dtype is DType.FLOAT64
            if is_f64 and not lossless:
                notes.append(f"column {path!r} is float64, written narrowed to float32")
            if typed.dtype is DType.TIME:
                notes.append(
                    f"column {path!r} is a time of day, written as int64 {typed.unit} since midnight"
                )
            dense = nullable and (not shape or _is_tensor(leaf.type)) and _never_null(path, never_null)
            if dense:
                dense_columns.append(path)
            features.append(
                Feature(
                    name=name,
                    dtype=typed.dtype,
                    shape=shape,
                    column=path if name != path else None,
                    nulls=NullPolicy.ABSENT if nullable and not dense else NullPolicy.REQUIRED,
                    narrow=is_f64 and not lossless,
                    encode="bytes" if is_f64 and lossless else None,
                    unit=typed.unit,
                    decimal_as=typed.decimal_as,
                )
            )
    if dense_columns:
        notes.append(
            f"{len(dense_columns)} column(s) hold no null in any input (Parquet statistics), so they "
            f"are dense features (nulls: required): {', '.join(dense_columns)}; a null in a later "
            "input would be a bad row: pin the schema with --schema if later inputs may hold them"
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


@dataclass
class _Stats:
    rows: int = 0
    nulls: int = 0
    minimum: object = None
    maximum: object = None
    min_len: int | None = None
    max_len: int | None = None
    notes: list[str] = field(default_factory=list)


def sample_notes(schema: Schema, table: pa.Table) -> dict[str, str]:
    """One comment per feature from a sample of the source: nulls seen, min/max, list lengths."""
    out = {}
    for f in schema.features:
        col = _column(table, f.source_column)
        if col is None:
            continue
        st = _Stats(rows=len(col), nulls=col.null_count)
        values = col
        while _is_list(values.type):
            lengths = pc.list_value_length(values)
            if st.min_len is None:
                st.min_len = pc.min(lengths).as_py()
                st.max_len = pc.max(lengths).as_py()
            values = pc.list_flatten(values)
        if pa.types.is_dictionary(values.type):
            values = values.dictionary_decode()
        if len(values) and (
            pa.types.is_integer(values.type)
            or pa.types.is_floating(values.type)
            or pa.types.is_temporal(values.type)
        ):
            try:
                mm = pc.min_max(values)
                st.minimum, st.maximum = mm["min"].as_py(), mm["max"].as_py()
            except pa.ArrowNotImplementedError:  # float16, for one
                pass
        text = f"sample of {st.rows} rows: {st.nulls} null"
        if st.minimum is not None:
            text += f", min {st.minimum}, max {st.maximum}"
        if st.min_len is not None:
            text += f", list lengths {st.min_len}..{st.max_len}"
        if f.float64_bytes:
            text += (
                "\nfloat64 kept exact as 8 bytes per value; `narrow: true` (without `encode`)"
                " writes a float32 feature instead"
            )
        out[f.name] = text
    return out


def _column(table: pa.Table, path: str) -> pa.Array | None:
    if path in table.column_names:
        return table.column(path).combine_chunks()
    head, *rest = path.split(".")
    if head not in table.column_names:
        return None
    col = table.column(head).combine_chunks()
    for part in rest:
        col = pc.struct_field(col, part)
    return col


def inferred_schema(
    first_file: str,
    fmt: str,
    files: list[str],
    *,
    lossless: bool = False,
    first_rows: bool = False,
    footers: Mapping[str, pq.FileMetaData] | None = None,
) -> tuple[Schema, bool]:
    """The schema inferred for a conversion of `files` (what `convert` without --schema and
    `infer-schema` both print): types from the first file, every row of a CSV file (or, with
    `first_rows`, its first block where no column there is all empty: then True, the types to be
    checked as the run converts); Parquet columns without a null in any of `files` are dense.
    `footers`: the Parquet files' footers where the caller has read them (else read here)."""
    retype = False
    if fmt == "csv" and first_rows:
        arrow_schema = read_arrow_schema(first_file, fmt, every_row=False)
        retype = not any(pa.types.is_null(t) for t in arrow_schema.types)
    never_null: frozenset[str] = frozenset()
    if fmt == "parquet":
        footers = footers if footers is not None else parquet_footers(files)
        never_null = never_null_columns(footers)
    elif fmt in table_files.FORMATS:  # ORC statistics, Arrow null counts (none for JSON Lines)
        never_null = table_files.never_null_columns(files, fmt)
    if footers is not None and first_file in footers:
        arrow_schema = footers[first_file].schema.to_arrow_schema()
    elif not retype:
        arrow_schema = read_arrow_schema(first_file, fmt)
    schema = infer_schema(arrow_schema, origin=first_file, lossless=lossless, never_null=never_null)
    return schema, retype
