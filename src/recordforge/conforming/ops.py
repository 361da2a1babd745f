"""Derivation ops and value checks on already-cast values, each one vectorised pass."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.conforming.casts import Failure, _valid
from recordforge.schemas.kinds import DType, ExampleKind, Op
from recordforge.schemas.model import Feature

__all__ = ["apply_ops", "check_values"]


def apply_ops(values: pa.Array, f: Feature) -> pa.Array:
    """The feature's derivation ops, in order, on already-cast values."""
    for op, arg in f.ops:
        if op in (Op.LOWER, Op.UPPER, Op.STRIP):
            text = pc.cast(values, pa.large_string())
            fn = {Op.LOWER: pc.utf8_lower, Op.UPPER: pc.utf8_upper, Op.STRIP: pc.utf8_trim_whitespace}
            values = pc.cast(fn[op](text), pa.large_binary())
        elif op is Op.CLIP:
            lo, hi = (pa.scalar(v, values.type) if v is not None else None for v in arg)
            if lo is not None:
                values = pc.max_element_wise(values, lo)
            if hi is not None:
                values = pc.min_element_wise(values, hi)
        elif op is Op.ABS:
            values = pc.abs(values)
        elif op is Op.HASH_BUCKET:
            values = _hash_bucket(values, int(arg))
    return values


def _hash_bucket(values: pa.Array, buckets: int) -> pa.Array:
    """tf.strings.to_hash_bucket_fast (FarmHash Fingerprint64 mod n) of each distinct value, so
    that serving code computes the same bucket. TensorFlow is imported only when this op is used."""
    import tensorflow as tf

    encoded = pc.dictionary_encode(values)
    uniques = encoded.dictionary.to_pylist()
    if not uniques:
        return pa.nulls(len(values), pa.int64())
    ids = tf.strings.to_hash_bucket_fast(tf.constant(uniques, dtype=tf.string), buckets).numpy()
    return pc.take(pa.array(ids, pa.int64()), encoded.indices)


def check_values(values: pa.Array, f: Feature) -> list[Failure]:
    """min/max, allowed values, regex and string length, each as one vectorised mask."""
    out: list[Failure] = []

    def add(mask: np.ndarray, rule: str, reason: str) -> None:
        idx = np.flatnonzero(mask)
        if idx.size:
            idx = idx[_valid(values)[idx]]  # a null breaks no rule; looked at only where one broke
        if idx.size:
            out.append(Failure(idx, rule, reason))

    numeric = (
        f.value_kind in (ExampleKind.INT64, ExampleKind.FLOAT)
        and not pa.types.is_binary(values.type)
        and not pa.types.is_large_binary(values.type)
    )
    if numeric and f.min is not None:
        add(
            pc.fill_null(pc.less(values, f.min), False).to_numpy(zero_copy_only=False),
            "min",
            f"below min {f.min}",
        )
    if numeric and f.max is not None:
        add(
            pc.fill_null(pc.greater(values, f.max), False).to_numpy(zero_copy_only=False),
            "max",
            f"above max {f.max}",
        )
    if f.allowed is not None:
        allowed = [a.encode() if isinstance(a, str) else a for a in f.allowed]
        value_set = pa.array(allowed, values.type) if allowed else pa.array([], values.type)
        add(
            ~pc.is_in(values, value_set=value_set).to_numpy(zero_copy_only=False),
            "allowed",
            f"not one of the allowed values {list(f.allowed)}",
        )
    if f.regex is not None:
        text = pc.cast(values, pa.large_string())
        matched = pc.fill_null(pc.match_substring_regex(text, f.regex), True)
        add(~matched.to_numpy(zero_copy_only=False), "regex", f"does not match /{f.regex}/")
    if f.max_length is not None and f.is_scalar and pa.types.is_large_binary(values.type):
        lengths = (
            pc.utf8_length(pc.cast(values, pa.large_string()))
            if f.dtype is DType.STRING
            else pc.binary_length(values)
        )
        add(
            pc.fill_null(pc.greater(lengths, f.max_length), False).to_numpy(zero_copy_only=False),
            "max_length",
            f"longer than max_length {f.max_length}",
        )
    return out
