"""A schema compiled once into an immutable plan: Arrow types, feature spec and fingerprint."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from recordforge.schemas.model import DType, Feature, NullPolicy, Schema

__all__ = ["Plan", "compile_schema", "feature_spec_entry", "value_type"]

# The Arrow type each feature's values have after conforming, i.e. what the encoder receives.
_VALUE_TYPES: dict[DType, pa.DataType] = {
    DType.INT64: pa.int64(),
    DType.BOOL: pa.int64(),  # written as 0/1 in an int64_list
    DType.FLOAT32: pa.float32(),
    DType.FLOAT64: pa.float32(),  # only reachable with `narrow: true`
    DType.BYTES: pa.large_binary(),
    DType.STRING: pa.large_binary(),  # validated UTF-8 before it gets here
}

# The Arrow type a CSV column is parsed as, so that parsing is exact (float64 is narrowed later,
# with an overflow check, rather than rounded by the parser).
_CSV_TYPES: dict[DType, pa.DataType] = {
    DType.INT64: pa.int64(),
    DType.BOOL: pa.bool_(),
    DType.FLOAT32: pa.float32(),
    DType.FLOAT64: pa.float64(),
    DType.BYTES: pa.binary(),
    DType.STRING: pa.string(),
}

_TF_DTYPES = {DType.INT64: "int64", DType.BOOL: "int64", DType.FLOAT32: "float32",
              DType.FLOAT64: "float32", DType.BYTES: "string", DType.STRING: "string"}


def value_type(feature: Feature) -> pa.DataType:
    return _VALUE_TYPES[feature.dtype]


def _column_type(feature: Feature) -> pa.DataType:
    t = value_type(feature)
    return t if feature.is_scalar else pa.large_list(t)


def feature_spec_entry(feature: Feature) -> dict[str, Any]:
    """The tf.io parsing spec of one feature, as JSON-able data (see `recordforge.read`).

    A fixed shape whose nulls are never absent parses as FixedLenFeature with that shape; anything
    that can be missing or has variable length parses as VarLenFeature, so a missing value stays
    distinguishable from a real one instead of being replaced by a default.
    """
    dtype = _TF_DTYPES[feature.dtype]
    if feature.is_variable or feature.nulls is NullPolicy.ABSENT:
        return {"kind": "VarLenFeature", "dtype": dtype}
    return {"kind": "FixedLenFeature", "dtype": dtype, "shape": list(feature.shape)}


@dataclass(frozen=True)
class Plan:
    """Everything derived from a schema, computed once and shared by every step."""

    schema: Schema
    arrow_schema: pa.Schema
    csv_column_types: dict[str, pa.DataType]
    feature_spec: dict[str, dict[str, Any]]
    fingerprint: str

    @property
    def features(self) -> tuple[Feature, ...]:
        return self.schema.features


def compile_schema(schema: Schema) -> Plan:
    arrow_schema = pa.schema(
        [pa.field(f.name, _column_type(f), nullable=f.nulls is NullPolicy.ABSENT)
         for f in schema.features]
    )
    csv_types: dict[str, pa.DataType] = {}
    for f in schema.features:
        # List cells in CSV are JSON arrays, parsed after reading the cell as text.
        t = _CSV_TYPES[f.dtype] if f.is_scalar else pa.string()
        previous = csv_types.setdefault(f.source_column, t)
        if previous != t:
            csv_types[f.source_column] = pa.string()  # two readings of one column: parse later
    spec = {f.name: feature_spec_entry(f) for f in schema.features}
    canonical = json.dumps(schema.to_dict(), sort_keys=True, default=repr).encode()
    return Plan(
        schema=schema,
        arrow_schema=arrow_schema,
        csv_column_types=csv_types,
        feature_spec=spec,
        fingerprint=hashlib.sha256(canonical).hexdigest(),
    )
