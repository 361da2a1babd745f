"""verify on records tf.io refuses, or parses into malformed RaggedTensors, and on damaged
record indexes: each named by shard, record and feature, never an exception."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crafted import example, tfrecord_bundle

from recordforge.tools.verify import verify

RAGGED = {
    "r": {
        "kind": "RaggedFeature",
        "dtype": "int64",
        "value_key": "r",
        "partitions": [{"row_lengths": "r.row_lengths"}],
    }
}
FIXED = {"f": {"kind": "FixedLenFeature", "dtype": "int64", "shape": [2]}}
DEFAULTED = {"f": {"kind": "FixedLenFeature", "dtype": "int64", "shape": [2], "default_value": [0, 0]}}
VAR = {"f": {"kind": "VarLenFeature", "dtype": "int64"}}

# (spec, record, what verify must say of it: None for OK). What tf.io.parse_example (TF 2.x)
# answers with the same spec, tried one by one: it refuses every case named here but the
# negative and mismatched row lengths, which it turns into RaggedTensors it never validated.
CASES: list[tuple[dict, bytes, str | None]] = [
    (RAGGED, example(r=("int64", [1, 2, 3]), r__row_lengths=("int64", [2, 1])), None),
    (RAGGED, example(r=("none", []), r__row_lengths=("int64", [0])), None),
    (RAGGED, example(r__row_lengths=("int64", [0, 0])), None),
    (RAGGED, example(r__row_lengths=("none", [])), None),
    (
        RAGGED,
        example(r=("float", [1.0, 2.0]), r__row_lengths=("int64", [3, -1])),
        "'r' (values of ragged 'r') is float",
    ),
    (RAGGED, example(r=("int64", [1, 2]), r__row_lengths=("bytes", [b"2"])), "is bytes, the spec says int64"),
    (RAGGED, example(r=("int64", [1, 2]), r__row_lengths=("int64", [3, -1])), "a negative row length"),
    (RAGGED, example(r=("int64", [1, 2]), r__row_lengths=("int64", [3])), "sum to 3, 2 values"),
    (RAGGED, example(r=("int64", [1, 2])), "sum to 0, 2 values"),
    (RAGGED, example(r=("float", []), r__row_lengths=("int64", [0])), "is float, the spec says int64"),
    (RAGGED, example(r__row_lengths=("float", [])), "is float, the spec says int64"),
    (RAGGED, example(r=("int64", [1]), r__row_lengths=("int64", [2**62, 2**62, 2**62, 2**62, 1])), "sum to"),
    (FIXED, example(f=("int64", [1, 2])), None),
    (FIXED, example(f=("float", [1.0, 2.0])), "is float, the spec says int64"),
    (FIXED, example(f=("none", [])), "is missing"),
    (FIXED, example(f=("int64", [])), "has 0 values"),
    (FIXED, example(f=("float", [])), "is float"),
    (FIXED, example(f=("int64", [1, 2, 3])), "has 3 values"),
    (FIXED, example(), "is missing"),
    (DEFAULTED, example(), None),
    (DEFAULTED, example(f=("none", [])), None),
    (DEFAULTED, example(f=("int64", [])), "has 0 values"),
    (DEFAULTED, example(f=("int64", [1])), "has 1 values"),
    (VAR, example(f=("none", [])), None),
    (VAR, example(f=("int64", [])), None),
    (VAR, example(f=("float", [])), "is float"),
    (VAR, example(f=("float", [1.0])), "is float"),
]


def _good(spec: dict[str, Any]) -> bytes:
    return CASES[0][1] if spec is RAGGED else example(f=("int64", [1, 2]))


@pytest.mark.corrupts
@pytest.mark.parametrize(
    ("spec", "record", "said"), CASES, ids=[f"{i}:{c[2] or 'OK'}" for i, c in enumerate(CASES)]
)
def test_verify_refuses_what_tf_refuses(tmp_path: Path, spec: dict, record: bytes, said: str | None) -> None:
    """The record third of three: named by number and byte offset, with its feature."""
    good = _good(spec)
    out = tfrecord_bundle(tmp_path / "b", [good, good, record], spec)
    problems = verify(str(out), workers=1)
    if said is None:
        assert problems == []
        return
    assert len(problems) == 1, problems
    offset = 2 * (len(good) + 16)
    assert problems[0].startswith(
        f"data-00000-of-00001.tfrecord: record 3 at byte {offset} does not parse with the spec: "
    ), problems
    assert said in problems[0]


@pytest.mark.corrupts
@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("0 99999999999999999999", "not a record index"),
        ("0 9000000000000000000", "says offset 0 size 9000000000000000000"),
        ("abc def", "not a record index"),
        ("0", "not a record index"),
    ],
)
def test_verify_names_a_damaged_record_index(tmp_path: Path, line: str, said: str) -> None:
    good = example(f=("int64", [1, 2]))
    out = tfrecord_bundle(tmp_path / "b", [good, good], FIXED, index=True)
    index = out / "data-00000-of-00001.tfrecord.tfindex"
    index.write_text(index.read_text().splitlines()[0] + "\n" + line + "\n")
    problems = verify(str(out), workers=1)
    assert any(p.startswith("data-00000-of-00001.tfrecord.tfindex: ") and said in p for p in problems), (
        problems
    )
