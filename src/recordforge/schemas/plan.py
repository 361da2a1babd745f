"""A schema compiled once into an immutable plan: Arrow types, feature spec and fingerprint."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from recordforge.schemas.kinds import DType, ExampleKind, NullPolicy
from recordforge.schemas.model import Feature, Schema

__all__ = [
    "TEXT_VALUE_TYPES",
    "Column",
    "Plan",
    "compile_schema",
    "feature_spec_entries",
    "time_type",
    "value_type",
]

# The Arrow type of each kind's values after conforming, i.e. what the encoder receives.
_KIND_TYPES: dict[ExampleKind, pa.DataType] = {
    ExampleKind.INT64: pa.int64(),
    ExampleKind.FLOAT: pa.float32(),
    ExampleKind.BYTES: pa.large_binary(),
}

# The Arrow type text (a CSV cell, a value in a JSON list cell) is parsed as, straight to the
# declared type so that parsing is exact (float64 is narrowed later, with an overflow check,
# rather than rounded by the parser).
TEXT_VALUE_TYPES: dict[DType, pa.DataType] = {
    DType.INT64: pa.int64(),
    DType.BOOL: pa.bool_(),
    DType.FLOAT32: pa.float32(),
    DType.FLOAT64: pa.float64(),
    DType.BYTES: pa.binary(),
    DType.STRING: pa.string(),
}
_CSV_TYPES: dict[DType, pa.DataType] = {
    **TEXT_VALUE_TYPES,
    DType.DATE: pa.date32(),
    DType.DECIMAL: pa.string(),  # parsed exactly from the text later
    DType.IMAGE: pa.string(),  # a path
}

_TF_DTYPES = {ExampleKind.INT64: "int64", ExampleKind.FLOAT: "float32", ExampleKind.BYTES: "string"}


def value_type(feature: Feature) -> pa.DataType:
    """Arrow type of a feature's values as the encoder sees them (before `encode: bytes`)."""
    return _KIND_TYPES[feature.value_kind]


@dataclass(frozen=True)
class Column:
    """A feature as written: one key of the Example's feature map."""

    name: str
    kind: ExampleKind
    scalar: bool  # one value per record (a primitive Arrow column) rather than a list


def _columns(f: Feature) -> list[Column]:
    if f.is_image:
        return [
            Column(f.name, ExampleKind.BYTES, True),
            Column(f.part_name("height"), ExampleKind.INT64, True),
            Column(f.part_name("width"), ExampleKind.INT64, True),
            Column(f.part_name("channels"), ExampleKind.INT64, True),
            Column(f.part_name("format"), ExampleKind.BYTES, True),
        ]
    if f.float64_bytes:
        return [Column(f.name, ExampleKind.BYTES, True)]
    if f.is_ragged:
        return [Column(f.name, f.kind, False), Column(f.row_lengths_name, ExampleKind.INT64, False)]
    return [Column(f.name, f.kind, f.is_scalar)]


def feature_spec_entries(f: Feature) -> dict[str, dict[str, Any]]:
    """The tf.io parsing spec of one feature, as JSON-able data (see `recordforge.read`).

    A fixed shape whose nulls are never absent parses as FixedLenFeature with that shape; anything
    that can be missing or has variable length parses as VarLenFeature, so a missing value stays
    distinguishable from a real one instead of being replaced by a default. Ragged lists parse as
    RaggedFeature with row lengths; `encode: bytes` floats carry a `decode` entry.
    """
    dtype = _TF_DTYPES[f.kind]
    entry: dict[str, Any]
    if f.is_image:
        return _image_spec(f)
    if f.is_ragged:
        entry = {
            "kind": "RaggedFeature",
            "dtype": dtype,
            "value_key": f.name,
            "partitions": [{"row_lengths": f.row_lengths_name}],
        }
    elif f.float64_bytes:
        entry = (
            {"kind": "VarLenFeature", "dtype": "string"}
            if f.nulls is NullPolicy.ABSENT
            else {"kind": "FixedLenFeature", "dtype": "string", "shape": []}
        )
        entry["decode"] = {
            "raw": "float64",
            "byte_order": "little",
            "shape": list(f.shape) if not f.is_variable else [-1],
        }
    elif f.is_variable or f.nulls is NullPolicy.ABSENT:
        entry = {"kind": "VarLenFeature", "dtype": dtype}
    else:
        entry = {"kind": "FixedLenFeature", "dtype": dtype, "shape": list(f.shape)}
    if f.dtype is DType.TIMESTAMP:
        entry["logical"] = f"timestamp[{f.unit}]"
    elif f.dtype is DType.DATE:
        entry["logical"] = "date (days since 1970-01-01)"
    elif f.dtype is DType.TIME:
        entry["logical"] = f"time[{f.unit}] (since midnight)"
    elif f.dtype is DType.DECIMAL:
        entry["logical"] = (
            "decimal as string" if f.decimal_as == "string" else f"decimal scaled by 10^{f.scale}"
        )
    return {f.name: entry}


def _image_spec(f: Feature) -> dict[str, dict[str, Any]]:
    """The image bytes plus its header values; all FixedLen unless an image may be absent."""

    def entry(dtype: str) -> dict[str, Any]:
        if f.nulls is NullPolicy.ABSENT:
            return {"kind": "VarLenFeature", "dtype": dtype}
        return {"kind": "FixedLenFeature", "dtype": dtype, "shape": []}

    image = entry("string")
    image["image"] = {
        "encoding": f.encode or "original",
        "decode": "tf.io.decode_image(x, expand_animations=False)",
    }
    if f.encode == "raw":
        image["image"]["decode"] = "tf.reshape(tf.io.decode_raw(x, tf.uint8), [height, width, channels])"
        if f.resize and f.channels and f.nulls is not NullPolicy.ABSENT:
            image["decode"] = {"raw": "uint8", "shape": [*f.resize, f.channels]}
    out = {f.name: image}
    for part in ("height", "width", "channels"):
        out[f.part_name(part)] = entry("int64")
    out[f.part_name("format")] = entry("string")
    return out


@dataclass(frozen=True)
class Plan:
    """Everything derived from a schema, computed once and shared by every step."""

    schema: Schema
    columns: tuple[Column, ...]
    arrow_schema: pa.Schema
    csv_column_types: dict[str, pa.DataType]
    feature_spec: dict[str, dict[str, Any]]
    fingerprint: str
    # The CSV file whose column types were inferred from its first rows only: a cell of it that
    # one cannot hold raises TypesChanged (convert then infers them from every row and runs
    # again) instead of being a bad row. A bad cell of any other file is a bad row.
    retype_file: str | None = None

    @property
    def features(self) -> tuple[Feature, ...]:
        return self.schema.features


def _csv_type(f: Feature) -> pa.DataType:
    if not f.is_scalar:
        return pa.string()  # JSON arrays / objects in a cell, parsed after reading as text
    if f.dtype is DType.TIMESTAMP:
        return pa.timestamp(f.unit)
    if f.dtype is DType.TIME:
        return time_type(f.unit or "s")
    return _CSV_TYPES[f.dtype]


def time_type(unit: str) -> pa.DataType:
    """Arrow's time-of-day type in `unit` (32 bits for seconds and milliseconds, as Arrow has it)."""
    return pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)


def compile_schema(schema: Schema) -> Plan:
    columns = tuple(c for f in schema.features for c in _columns(f))
    arrow_schema = pa.schema(
        [
            pa.field(c.name, _KIND_TYPES[c.kind] if c.scalar else pa.large_list(_KIND_TYPES[c.kind]))
            for c in columns
        ]
    )
    csv_types: dict[str, pa.DataType] = {}
    for f in schema.features:
        top = f.source_column
        t = _csv_type(f)
        previous = csv_types.setdefault(top, t)
        if previous != t:
            csv_types[top] = pa.string()  # two readings of one column: parse later
    spec: dict[str, dict[str, Any]] = {}
    for f in schema.features:
        spec.update(feature_spec_entries(f))
    canonical = json.dumps(schema.to_dict(), sort_keys=True, default=repr).encode()
    return Plan(
        schema=schema,
        columns=columns,
        arrow_schema=arrow_schema,
        csv_column_types=csv_types,
        feature_spec=spec,
        fingerprint=hashlib.sha256(canonical).hexdigest(),
    )
