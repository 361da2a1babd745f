"""The schema's `sequence:` block: loading, every problem at once, dumping, and its exports."""

from __future__ import annotations

import pytest
import yaml

from recordforge.errors import SchemaError
from recordforge.schemas import dump_schema, schema_from_dict
from recordforge.schemas.loader import _LineLoader
from recordforge.schemas.sequence import sequence_feature_spec, sequence_plans, sequence_tfmd_text
from recordforge.schemas.sequence_spec import CHUNK_FEATURE, Longer, SequenceSpec

FEATURES = [
    {"name": "user", "type": "string", "nulls": "required"},
    {"name": "country", "type": "string"},
    {"name": "ts", "type": "timestamp", "unit": "ms", "nulls": "required"},
    {"name": "page", "type": "string"},
    {"name": "items", "type": "int64", "shape": [-1]},
    {"name": "xy", "type": "float32", "shape": [2], "nulls": "required"},
]
BLOCK = {
    "key": "user",
    "order": "ts",
    "context": ["country"],
    "max_length": 50,
    "longer": "split",
    "min_length": 2,
}


def _schema(block: dict | None = None, features: list | None = None) -> object:
    return schema_from_dict({"features": features or FEATURES, "sequence": block or BLOCK})


def test_block_loads_into_a_frozen_spec() -> None:
    schema = _schema()
    assert schema.sequence == SequenceSpec(
        key=("user",), order="ts", context=("country",), max_length=50, longer=Longer.SPLIT, min_length=2
    )
    assert schema.sequence.context_names() == ("user", "country")


def test_dump_and_load_round_trip_keeps_the_block() -> None:
    schema = _schema()
    text = dump_schema(schema)
    again = schema_from_dict(yaml.load(text, Loader=_LineLoader))
    assert again == schema
    assert again.to_dict()["sequence"] == {**BLOCK, "key": ["user"]}


def test_the_block_changes_the_fingerprint() -> None:
    from recordforge.schemas import compile_schema

    plain = schema_from_dict({"features": FEATURES})
    assert compile_schema(plain).fingerprint != compile_schema(_schema()).fingerprint


@pytest.mark.parametrize(
    ("block", "features", "message"),
    [
        ({**BLOCK, "key": "nobody"}, None, "'nobody' is not a feature"),
        ({**BLOCK, "key": "country"}, None, "key 'country' must be a scalar that is never absent"),
        ({**BLOCK, "order": "page"}, None, "order 'page' must be a scalar"),
        ({**BLOCK, "context": ["ts"]}, None, "order 'ts' is a step feature"),
        ({**BLOCK, "longer": "truncate"}, None, "is not one of split, keep_last, reject"),
        ({**BLOCK, "max_length": 0}, None, "`max_length` must be an integer of 1 or more"),
        ({**BLOCK, "min_length": 60}, None, "`min_length` 60 is above `max_length` 50"),
        ({"key": "user", "order": "ts", "longer": "reject"}, None, "`sequence.longer` needs `max_length`"),
        ({**BLOCK, "sort": "ts"}, None, "unknown key `sort`"),
        (BLOCK, [*FEATURES, {"name": CHUNK_FEATURE, "type": "int64"}], "chunk number"),
        (BLOCK, [*FEATURES, {"name": "img", "type": "image"}], "image features are not supported"),
        (BLOCK, [*FEATURES, {"name": "r", "type": "int64", "shape": [-1, -1]}], "ragged"),
    ],
)
def test_problems_are_refused_with_a_reason(block: dict, features: list | None, message: str) -> None:
    with pytest.raises(SchemaError, match="sequence") as info:
        _schema(block, features)
    assert message in str(info.value)


def test_every_problem_at_once_with_the_line() -> None:
    text = yaml.safe_dump({"features": FEATURES}) + "sequence:\n  key: nobody\n  order: page\n"
    with pytest.raises(SchemaError) as info:
        schema_from_dict(yaml.load(text, Loader=_LineLoader), origin="s.yaml")
    assert "'nobody' is not a feature" in str(info.value)
    assert "order 'page' must be" in str(info.value)


def test_plans_split_context_and_steps() -> None:
    plans = sequence_plans(_schema())
    assert [c.name for c in plans.context.columns] == ["user", "country", CHUNK_FEATURE]
    assert [c.name for c in plans.steps.columns] == ["ts", "page", "items", "xy"]
    unchunked = sequence_plans(_schema({**BLOCK, "longer": "keep_last"}))
    assert [c.name for c in unchunked.context.columns] == ["user", "country"]


def test_feature_spec_for_parse_sequence_example() -> None:
    spec = sequence_feature_spec(_schema())
    assert spec == {
        "context": {
            "user": {"kind": "FixedLenFeature", "dtype": "string", "shape": []},
            "country": {"kind": "VarLenFeature", "dtype": "string"},
            CHUNK_FEATURE: {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
        },
        "sequence": {
            "ts": {
                "kind": "FixedLenSequenceFeature",
                "dtype": "int64",
                "shape": [],
                "logical": "timestamp[ms]",
            },
            "page": {"kind": "RaggedFeature", "dtype": "string"},
            "items": {"kind": "RaggedFeature", "dtype": "int64"},
            "xy": {"kind": "FixedLenSequenceFeature", "dtype": "float32", "shape": [2]},
        },
    }


def test_tfmd_schema_puts_the_steps_in_the_sequence_struct() -> None:
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    schema = text_format.Parse(sequence_tfmd_text(_schema()), schema_pb2.Schema())
    top = {f.name: f for f in schema.feature}
    assert set(top) == {"user", "country", CHUNK_FEATURE, "##SEQUENCE##"}
    struct = top["##SEQUENCE##"]
    assert struct.type == schema_pb2.STRUCT
    steps = {f.name: f for f in struct.struct_domain.feature}
    assert set(steps) == {"ts", "page", "items", "xy"}
    assert steps["ts"].type == schema_pb2.INT and steps["xy"].type == schema_pb2.FLOAT


def test_with_sequence_adds_the_block_and_requires_key_and_order() -> None:
    from recordforge.schemas.kinds import NullPolicy
    from recordforge.schemas.sequence import with_sequence

    plain = schema_from_dict(
        {
            "features": [
                {"name": "user", "type": "string", "column": "User"},
                {"name": "ts", "type": "int64"},
                {"name": "page", "type": "string"},
            ]
        }
    )
    schema = with_sequence(plain, ["User"], "ts")
    assert schema.sequence == SequenceSpec(key=("user",), order="ts")
    nulls = {f.name: f.nulls for f in schema.features}
    assert nulls == {"user": NullPolicy.REQUIRED, "ts": NullPolicy.REQUIRED, "page": NullPolicy.ABSENT}
    with pytest.raises(ValueError, match="'nobody' is not a feature"):
        with_sequence(plain, ["nobody"], "ts")
