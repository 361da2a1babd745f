"""A TFMD schema given with --schema: RecordForge's own schema.pbtxt reads back as the schema that
wrote it (ragged features through their tensor representation), and a shared string domain makes
a BYTES feature text, as TFDV means it."""

from __future__ import annotations

import pytest

from recordforge.errors import SchemaError
from recordforge.schemas import DType, compile_schema, schema_from_dict
from recordforge.schemas.export import tfmd_text
from recordforge.schemas.kinds import RAGGED
from recordforge.schemas.tfmd import schema_from_tfmd_text


def test_recordforge_schema_pbtxt_reads_back_as_its_schema() -> None:
    declared = schema_from_dict(
        {
            "features": [
                {"name": "id", "type": "int64", "nulls": "required"},
                {"name": "name", "type": "string"},
                {"name": "ok", "type": "bool", "nulls": "required"},
                {"name": "vec", "type": "float32", "shape": [3], "nulls": "required"},
                {"name": "tags", "type": "bytes", "shape": [-1]},
                {"name": "boxes", "type": "float32", "shape": [-1, -1]},
            ]
        }
    )
    text = tfmd_text(compile_schema(declared))
    back = schema_from_tfmd_text(text)
    assert [(f.name, f.dtype, f.shape) for f in back.features] == [
        ("id", DType.INT64, ()),
        ("name", DType.STRING, ()),
        ("ok", DType.BOOL, ()),
        ("vec", DType.FLOAT32, (3,)),
        ("tags", DType.BYTES, (-1,)),
        ("boxes", DType.FLOAT32, RAGGED),
    ]
    # Read back, the ragged feature writes the same spec: values and row lengths.
    assert compile_schema(back).feature_spec["boxes"] == compile_schema(declared).feature_spec["boxes"]


SHARED = """
feature { name: "zone" type: BYTES domain: "zones" }
feature { name: "blob" type: BYTES }
string_domain { name: "zones" value: "north" value: "south" }
"""


def test_a_shared_string_domain_makes_text() -> None:
    features = {f.name: f.dtype for f in schema_from_tfmd_text(SHARED).features}
    assert features == {"zone": DType.STRING, "blob": DType.BYTES}


@pytest.mark.parametrize(
    ("representation", "message"),
    [
        (
            'ragged_tensor { feature_path { step: "v" } partition { row_length: "lens" } }',
            "must be feature 'v.row_lengths'",
        ),
        (
            'ragged_tensor { feature_path { step: "v" } partition { uniform_row_length: 2 } }',
            "only one feature",
        ),
    ],
)
def test_a_ragged_representation_recordforge_cannot_write_is_an_error(
    representation: str, message: str
) -> None:
    text = (
        'feature { name: "v" type: FLOAT }\nfeature { name: "lens" type: INT }\n'
        'tensor_representation_group { key: "" value { tensor_representation { key: "v" value { '
        f"{representation} }} }} }} }}"
    )
    with pytest.raises(SchemaError, match=message):
        schema_from_tfmd_text(text)
