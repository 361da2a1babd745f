"""The schema model, loader, inference and exports."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from recordforge.errors import SchemaError
from recordforge.schemas import (
    DType,
    NullPolicy,
    compile_schema,
    dump_schema,
    infer_schema,
    load_schema,
    normalize_name,
    schema_from_dict,
)
from recordforge.schemas.export import tfmd_text, to_tf_feature_spec


@pytest.mark.parametrize(
    ("column", "name"),
    [
        ("Trip Distance", "trip_distance"),
        ("fare (USD)", "fare_usd"),
        ("2nd", "_2nd"),
        ("already_ok", "already_ok"),
        ("  ", "feature"),
        ("Ünïcode", "n_code"),
    ],
)
def test_normalize_name(column: str, name: str) -> None:
    assert normalize_name(column) == name


def test_all_problems_reported_at_once_with_line_numbers(tmp_path: Any) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "features:\n"
        "  - name: ok\n"
        "    type: int64\n"
        "  - name: price\n"
        "    type: float64\n"
        "  - name: bad type\n"
        "    type: complex\n"
        "  - name: d\n"
        "    type: int64\n"
        "    nulls: default\n"
        "  - name: shape\n"
        "    type: int64\n"
        "    shape: [2, -1]\n"
        "    colour: red\n"
    )
    with pytest.raises(SchemaError) as err:
        load_schema(str(path))
    text = str(err.value)
    assert f"{path}:4: feature #2 'price'" in text and "narrow: true" in text
    assert f"{path}:6: feature #3 'bad type'" in text and "`type: complex`" in text
    assert f"{path}:8: feature #4 'd'" in text and "needs a `default:`" in text
    assert f"{path}:11: feature #5 'shape'" in text and "variable lengths are" in text
    assert "unknown key `colour` (did you mean `column`?)" in text


def test_schema_yaml_round_trips() -> None:
    schema = schema_from_dict(
        {
            "features": [
                {"name": "a", "type": "int64", "nulls": "required"},
                {"name": "b", "type": "float64", "narrow": True, "shape": [2, 3], "column": "B col"},
                {"name": "c", "type": "string", "default": "x"},
                {"name": "d", "type": "bytes", "shape": [-1]},
            ]
        }
    )
    import yaml

    assert schema_from_dict(yaml.safe_load(dump_schema(schema))).features == schema.features
    assert schema.features[2].nulls is NullPolicy.DEFAULT


def test_infer_schema_maps_types_names_and_nulls() -> None:
    arrow = pa.schema(
        [
            pa.field("Trip Id", pa.int64(), nullable=False),
            pa.field("u", pa.uint64()),
            pa.field("f16", pa.float16()),
            pa.field("f32", pa.float32()),
            pa.field("f64", pa.float64()),
            pa.field("s", pa.large_string()),
            pa.field("b", pa.binary()),
            pa.field("fb", pa.binary(4)),
            pa.field("flag", pa.bool_()),
            pa.field("cat", pa.dictionary(pa.int32(), pa.string())),
            pa.field("li", pa.list_(pa.int32())),
            pa.field("fl", pa.list_(pa.float32(), 8)),
        ]
    )
    schema = infer_schema(arrow)
    got = {f.name: (f.dtype, f.shape, f.nulls, f.narrow, f.column) for f in schema.features}
    absent = NullPolicy.ABSENT
    assert got == {
        "trip_id": (DType.INT64, (), NullPolicy.REQUIRED, False, "Trip Id"),
        "u": (DType.INT64, (), absent, False, None),
        "f16": (DType.FLOAT32, (), absent, False, None),
        "f32": (DType.FLOAT32, (), absent, False, None),
        "f64": (DType.FLOAT64, (), absent, True, None),
        "s": (DType.STRING, (), absent, False, None),
        "b": (DType.BYTES, (), absent, False, None),
        "fb": (DType.BYTES, (), absent, False, None),
        "flag": (DType.BOOL, (), absent, False, None),
        "cat": (DType.STRING, (), absent, False, None),
        "li": (DType.INT64, (-1,), absent, False, None),
        "fl": (DType.FLOAT32, (8,), absent, False, None),
    }
    assert any("float64" in n and "f64" in n for n in schema.notes)
    assert any("'Trip Id'" in n for n in schema.notes)


def test_infer_refuses_unmappable_and_clashing_columns() -> None:
    with pytest.raises(SchemaError, match="'ts'"):
        infer_schema(pa.schema([("ts", pa.duration("us")), ("a", pa.int64())]))
    with pytest.raises(SchemaError, match="same feature name"):
        infer_schema(pa.schema([("A b", pa.int64()), ("a_b", pa.int64())]))


def test_exports_agree() -> None:
    plan = compile_schema(
        schema_from_dict(
            {
                "features": [
                    {"name": "id", "type": "int64", "nulls": "required"},
                    {"name": "img", "type": "float32", "shape": [2, 2], "nulls": "required"},
                    {"name": "maybe", "type": "float32", "shape": [3]},
                    {"name": "tags", "type": "string", "shape": [-1]},
                    {"name": "flag", "type": "bool", "default": True},
                ]
            }
        )
    )
    assert plan.feature_spec == {
        "id": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
        "img": {"kind": "FixedLenFeature", "dtype": "float32", "shape": [2, 2]},
        "maybe": {"kind": "VarLenFeature", "dtype": "float32"},
        "tags": {"kind": "VarLenFeature", "dtype": "string"},
        "flag": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []},
    }
    proto = text_format.Parse(tfmd_text(plan), schema_pb2.Schema())
    by_name = {f.name: f for f in proto.feature}
    assert by_name["img"].type == schema_pb2.FLOAT
    assert [d.size for d in by_name["img"].shape.dim] == [2, 2]
    assert by_name["id"].HasField("shape") and not by_name["id"].shape.dim
    assert by_name["maybe"].value_count.min == by_name["maybe"].value_count.max == 3
    assert by_name["maybe"].presence.min_fraction == 0.0
    assert by_name["flag"].HasField("bool_domain")
    import tensorflow as tf

    spec = to_tf_feature_spec(plan.feature_spec)
    assert spec["img"] == tf.io.FixedLenFeature([2, 2], tf.float32)
    assert spec["tags"] == tf.io.VarLenFeature(tf.string)


def test_fingerprint_changes_with_schema() -> None:
    a = compile_schema(schema_from_dict({"features": [{"name": "a", "type": "int64"}]}))
    b = compile_schema(schema_from_dict({"features": [{"name": "a", "type": "bool"}]}))
    assert a.fingerprint != b.fingerprint
    assert a.fingerprint == compile_schema(a.schema).fingerprint
