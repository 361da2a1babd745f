"""A JSON feature spec (a bundle's feature_spec.json, or one inferred from records) as a schema."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from recordforge.errors import SchemaError
from recordforge.schemas.kinds import RAGGED, VARIABLE, DType, NullPolicy
from recordforge.schemas.model import Feature, Schema

__all__ = ["schema_from_feature_spec"]

_DTYPES = {"int64": DType.INT64, "float32": DType.FLOAT32, "float": DType.FLOAT32, "string": DType.BYTES}
_LOGICAL = re.compile(r"(timestamp|time)\[(s|ms|us|ns)\]")


def schema_from_feature_spec(spec: Mapping[str, Mapping[str, Any]], *, origin: str) -> Schema:
    """FixedLenFeature: its shape, required; VarLenFeature: a variable-length list that may be
    absent; RaggedFeature with row lengths: a ragged list; a `logical` timestamp, date or time
    (as RecordForge writes it) keeps its type, `decode: float64` its exact bytes. Strings are
    `bytes` features (nothing says they are UTF-8). A ragged feature's row lengths are part of it."""
    problems: list[str] = []
    lengths = {
        p["row_lengths"]
        for entry in spec.values()
        if entry.get("kind") == "RaggedFeature"
        for p in entry.get("partitions", [])
        if "row_lengths" in p
    }
    features = []
    for name, entry in spec.items():
        if name in lengths:
            continue
        try:
            features.append(_feature(name, entry))
        except (KeyError, TypeError, ValueError) as exn:
            problems.append(f"feature {name!r}: {exn}")
    if problems or not features:
        raise SchemaError(f"{origin}: cannot read the feature spec: {'; '.join(problems) or 'no features'}")
    return Schema(tuple(features), origin=origin)


def _feature(name: str, entry: Mapping[str, Any]) -> Feature:
    kind = entry["kind"]
    dtype = _DTYPES[entry["dtype"]]
    unit = None
    logical = str(entry.get("logical", ""))
    found = _LOGICAL.match(logical)
    if found and dtype is DType.INT64:
        dtype, unit = (DType.TIMESTAMP if found.group(1) == "timestamp" else DType.TIME), found.group(2)
    elif logical.startswith("date") and dtype is DType.INT64:
        dtype = DType.DATE
    encode = None
    decode = entry.get("decode")
    if isinstance(decode, Mapping) and decode.get("raw") == "float64":
        dtype, encode = DType.FLOAT64, "bytes"
    if kind == "FixedLenFeature":
        shape = tuple(int(d) for d in entry.get("shape", []))
        if encode is not None:
            shape = tuple(int(d) for d in decode["shape"])  # type: ignore[index]
        return Feature(name, dtype, shape, nulls=NullPolicy.REQUIRED, encode=encode, unit=unit)
    if kind == "VarLenFeature":
        if encode is not None:
            shape = tuple(int(d) for d in decode["shape"])  # type: ignore[index]
            return Feature(name, dtype, shape, encode=encode, unit=unit)
        return Feature(name, dtype, (VARIABLE,), unit=unit)
    if kind == "RaggedFeature":
        return Feature(name, dtype, RAGGED, unit=unit)
    raise ValueError(f"kind {kind!r} is not FixedLenFeature, VarLenFeature or RaggedFeature")
