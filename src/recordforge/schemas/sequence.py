"""A sequence schema's plans (context and feature lists) and its exports: feature specs and TFMD."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from recordforge.schemas.kinds import DType, NullPolicy
from recordforge.schemas.model import Feature, Schema
from recordforge.schemas.plan import Plan, compile_schema
from recordforge.schemas.sequence_spec import CHUNK_FEATURE, TFMD_SEQUENCE_FEATURE, SequenceSpec

__all__ = [
    "SequencePlans",
    "sequence_feature_spec",
    "sequence_plans",
    "sequence_tfmd_text",
    "to_tf_sequence_spec",
    "with_sequence",
]


@dataclass(frozen=True)
class SequencePlans:
    """The schema cut in two: what a SequenceExample's context holds, and its feature lists."""

    context: Plan  # the key and context features (and the chunk number when chunked)
    steps: Plan  # the step features, each one feature list


def sequence_plans(schema: Schema) -> SequencePlans:
    """Compiles the context and step halves of a schema with a `sequence:` block."""
    spec = schema.sequence
    assert spec is not None
    by_name = {f.name: f for f in schema.features}
    context = [by_name[n] for n in spec.context_names()]
    if spec.chunked:
        context.append(Feature(CHUNK_FEATURE, DType.INT64, nulls=NullPolicy.REQUIRED))
    steps = tuple(f for f in schema.features if f.name not in spec.context_names())
    return SequencePlans(compile_schema(Schema(tuple(context))), compile_schema(Schema(steps)))


def sequence_feature_spec(schema: Schema) -> dict[str, dict[str, Any]]:
    """feature_spec.json of a sequence bundle: {"context": {...}, "sequence": {...}}, for
    `tf.io.parse_sequence_example(x, context_features, sequence_features)` (`to_tf_sequence_spec`).
    A step feature that is never absent and has a fixed shape parses as FixedLenSequenceFeature
    (dense [steps, *shape]); any other as RaggedFeature ([steps, (values)]), since a null step
    is written as an empty list of values."""
    plans = sequence_plans(schema)
    steps: dict[str, dict[str, Any]] = {}
    for f in plans.steps.features:
        entry = dict(plans.steps.feature_spec[f.name])
        if entry["kind"] == "FixedLenFeature":
            entry["kind"] = "FixedLenSequenceFeature"
        else:
            entry = {"kind": "RaggedFeature", "dtype": entry["dtype"], **_logical(entry)}
        steps[f.name] = entry
    return {"context": dict(plans.context.feature_spec), "sequence": steps}


def _logical(entry: dict[str, Any]) -> dict[str, Any]:
    return {"logical": entry["logical"]} if "logical" in entry else {}


def to_tf_sequence_spec(spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(context_features, sequence_features) for tf.io.parse_sequence_example, from the JSON."""
    import tensorflow as tf

    from recordforge.schemas.export import to_tf_feature_spec

    sequence: dict[str, Any] = {}
    for name, entry in spec["sequence"].items():
        dtype = tf.as_dtype(entry["dtype"])
        if entry["kind"] == "FixedLenSequenceFeature":
            sequence[name] = tf.io.FixedLenSequenceFeature(entry["shape"], dtype)
        elif entry["kind"] == "RaggedFeature":
            sequence[name] = tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
        else:
            raise ValueError(f"sequence feature {name!r}: unknown spec kind {entry['kind']!r}")
    return to_tf_feature_spec(spec["context"]), sequence


def sequence_tfmd_text(schema: Schema) -> str:
    """schema.pbtxt of a sequence bundle: the context features at the top level and the feature
    lists as the struct feature `##SEQUENCE##`, as tfx-bsl's SequenceExampleRecord TFXIO and TFDV
    read SequenceExamples."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    from recordforge.schemas.export import to_tfmd_schema

    plans = sequence_plans(schema)
    out = to_tfmd_schema(plans.context)
    steps = to_tfmd_schema(plans.steps)
    struct = out.feature.add(name=TFMD_SEQUENCE_FEATURE, type=schema_pb2.STRUCT)
    struct.presence.min_fraction = 1.0
    for step in steps.feature:
        # Per record a feature list has a value per step: its count is not the step's count.
        step.ClearField("shape")
        step.ClearField("value_count")
        struct.struct_domain.feature.append(step)
    return text_format.MessageToString(out)


def with_sequence(schema: Schema, key: list[str], order: str) -> Schema:
    """`schema` with a sequence block over `key` and `order` (feature or source column names),
    those features made `nulls: required` (a group needs its key, a step its order); every
    other feature is a step. Raises ValueError with every problem."""
    from dataclasses import replace

    by_column = {f.source_column: f.name for f in schema.features}
    names = {f.name for f in schema.features}

    def name(given: str) -> str:
        return given if given in names else by_column.get(given, given)

    spec = SequenceSpec(key=tuple(name(k) for k in key), order=name(order))
    needed = {*spec.key, spec.order}
    features = tuple(
        replace(f, nulls=NullPolicy.REQUIRED, default=None) if f.name in needed else f
        for f in schema.features
    )
    return replace(schema, features=features, sequence=spec)
