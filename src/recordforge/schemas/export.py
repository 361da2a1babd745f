"""Exports of a plan for readers: the TFMD Schema proto and the tf.data feature spec."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from recordforge.schemas.model import DType, ExampleKind, NullPolicy
from recordforge.schemas.plan import Plan

__all__ = ["to_tfmd_schema", "tfmd_text", "to_tf_feature_spec"]

_TFMD_TYPES = {
    ExampleKind.INT64: schema_pb2.INT,
    ExampleKind.FLOAT: schema_pb2.FLOAT,
    ExampleKind.BYTES: schema_pb2.BYTES,
}


def to_tfmd_schema(plan: Plan) -> schema_pb2.Schema:
    """The TFMD Schema that TFDV, TFT and TFX read; shapes and presence mirror the feature spec."""
    out = schema_pb2.Schema()
    for f in plan.features:
        feat = out.feature.add(name=f.name, type=_TFMD_TYPES[f.kind])
        if f.nulls is NullPolicy.ABSENT:
            feat.presence.min_fraction = 0.0
        else:
            feat.presence.min_fraction = 1.0
        if f.is_variable or f.nulls is NullPolicy.ABSENT:
            if not f.is_variable:
                feat.value_count.min = feat.value_count.max = f.num_values or 1
        else:
            feat.shape.SetInParent()  # an empty FixedShape is a scalar
            for d in f.shape:
                feat.shape.dim.add(size=d)
        if f.dtype is DType.BOOL:
            feat.bool_domain.SetInParent()
        elif f.dtype is DType.STRING:
            feat.annotation.tag.append("utf8")
        if f.dtype is DType.FLOAT64:
            feat.annotation.comment.append("source float64 narrowed to float32 (narrow: true)")
        if f.description:
            feat.annotation.comment.append(f.description)
    return out


def tfmd_text(plan: Plan) -> str:
    return text_format.MessageToString(to_tfmd_schema(plan))


def to_tf_feature_spec(spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Turns the JSON feature spec of a bundle into `tf.io` parsing features (imports TensorFlow)."""
    import tensorflow as tf

    out: dict[str, Any] = {}
    for name, entry in spec.items():
        dtype = tf.as_dtype(entry["dtype"])
        if entry["kind"] == "FixedLenFeature":
            out[name] = tf.io.FixedLenFeature(entry["shape"], dtype)
        elif entry["kind"] == "VarLenFeature":
            out[name] = tf.io.VarLenFeature(dtype)
        else:
            raise ValueError(f"feature {name!r}: unknown spec kind {entry['kind']!r}")
    return out
