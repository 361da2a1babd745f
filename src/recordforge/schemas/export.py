"""Exports of a plan for readers: the TFMD Schema proto and the tf.data feature spec."""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from recordforge.schemas.kinds import DType, ExampleKind, NullPolicy
from recordforge.schemas.plan import Plan

__all__ = ["decode_images", "decode_parsed", "to_tfmd_schema", "tfmd_text", "to_tf_feature_spec"]

_TFMD_TYPES = {
    ExampleKind.INT64: schema_pb2.INT,
    ExampleKind.FLOAT: schema_pb2.FLOAT,
    ExampleKind.BYTES: schema_pb2.BYTES,
}


def _one_value_per_record(feat: schema_pb2.Feature, absent: bool) -> None:
    """A feature of one value per record where present: a scalar FixedShape (dense, as the feature
    spec's FixedLenFeature []) unless it may be absent (a value count of one: VarLen)."""
    if absent:
        feat.value_count.min = feat.value_count.max = 1
    else:
        feat.shape.SetInParent()  # an empty FixedShape is a scalar


def to_tfmd_schema(plan: Plan) -> schema_pb2.Schema:
    """The TFMD Schema that TFDV, TFT and TFX read. Shapes, presence and tensor representations
    mirror the feature spec, so that TFXIO and TFT make the same tensors as `feature_spec.json`
    does with tf.data: dense where it says FixedLenFeature, sparse where VarLenFeature, and one
    RaggedTensor (TFT's representation) where RaggedFeature."""
    out = schema_pb2.Schema()
    for f in plan.features:
        feat = out.feature.add(name=f.name, type=_TFMD_TYPES[f.kind])
        absent = f.nulls is NullPolicy.ABSENT
        feat.presence.min_fraction = 0.0 if absent else 1.0
        if f.float64_bytes or f.is_image:
            # One bytes value per record, whatever the declared shape.
            _one_value_per_record(feat, absent)
        elif f.num_values is not None and not absent:
            feat.shape.SetInParent()
            for d in f.shape:
                feat.shape.dim.add(size=d)
        elif f.num_values is not None:
            feat.value_count.min = feat.value_count.max = f.num_values
        if f.float64_bytes:
            feat.annotation.comment.append(
                f"float64 values, little-endian, shape {list(f.shape)}: tf.io.decode_raw(x, tf.float64)"
            )
        if f.is_image:
            feat.image_domain.SetInParent()
            for part, kind in (
                ("height", schema_pb2.INT),
                ("width", schema_pb2.INT),
                ("channels", schema_pb2.INT),
                ("format", schema_pb2.BYTES),
            ):
                extra = out.feature.add(name=f.part_name(part), type=kind)
                extra.presence.min_fraction = feat.presence.min_fraction
                _one_value_per_record(extra, absent)
        if f.is_ragged:
            feat.annotation.comment.append(f"ragged: row lengths in {f.row_lengths_name}")
            lengths = out.feature.add(name=f.row_lengths_name, type=schema_pb2.INT)
            lengths.presence.min_fraction = feat.presence.min_fraction
            # The group TFT writes ragged features into (its schema_utils); TFXIO then reads the
            # pair as one RaggedTensor named after the feature, the lengths being its partition.
            ragged = out.tensor_representation_group[""].tensor_representation[f.name].ragged_tensor
            ragged.feature_path.step.append(f.name)
            ragged.partition.add(row_length=f.row_lengths_name)
        if f.dtype is DType.BOOL:
            feat.bool_domain.SetInParent()
        elif f.dtype is DType.STRING and not f.hashed:
            feat.annotation.tag.append("utf8")
        if f.dtype is DType.FLOAT64 and f.narrow:
            feat.annotation.comment.append("source float64 narrowed to float32 (narrow: true)")
        if f.dtype is DType.TIMESTAMP:
            feat.annotation.comment.append(f"timestamp: int64 since the epoch in {f.unit}")
        if f.dtype is DType.DATE:
            feat.annotation.comment.append("date: int64 days since 1970-01-01")
        if f.dtype is DType.TIME:
            feat.annotation.comment.append(f"time of day: int64 since midnight in {f.unit}")
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
        elif entry["kind"] == "RaggedFeature":
            out[name] = tf.io.RaggedFeature(
                dtype,
                value_key=entry["value_key"],
                partitions=[tf.io.RaggedFeature.RowLengths(p["row_lengths"]) for p in entry["partitions"]],
            )
        else:
            raise ValueError(f"feature {name!r}: unknown spec kind {entry['kind']!r}")
    return out


def decode_parsed(parsed: dict[str, Any], spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Restores `encode: bytes` float64 features (and raw images of a declared size) of a
    parse_example batch to tensors of their declared shape. Features that may be absent or have
    variable length are left as bytes, one value per record: decode each with
    tf.io.decode_raw(x, tf.float64)."""
    import tensorflow as tf

    out = dict(parsed)
    for name, entry in spec.items():
        decode = entry.get("decode")
        if decode and entry["kind"] == "FixedLenFeature" and -1 not in decode["shape"]:
            dtype = tf.float64 if decode["raw"] == "float64" else tf.uint8
            values = tf.io.decode_raw(parsed[name], dtype, little_endian=True)
            out[name] = tf.reshape(values, [-1, *decode["shape"]])
    return out


def decode_images(record: dict[str, Any], spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One parsed record's encoded images as uint8 tensors [height, width, channels]."""
    import tensorflow as tf

    out = dict(record)
    for name, entry in spec.items():
        image = entry.get("image")
        if not image or entry["kind"] != "FixedLenFeature" or "decode" in entry:
            continue
        if image["encoding"] == "raw":
            shape = tf.stack(
                [tf.cast(record[f"{name}/{p}"], tf.int32) for p in ("height", "width", "channels")]
            )
            out[name] = tf.reshape(tf.io.decode_raw(record[name], tf.uint8), shape)
        else:
            out[name] = tf.io.decode_image(record[name], expand_animations=False)
    return out
