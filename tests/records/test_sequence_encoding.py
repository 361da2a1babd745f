"""The vectorised SequenceExample encoder against protobuf's own SequenceExample messages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tensorflow.core.example import example_pb2, feature_pb2

from recordforge.conforming.conform import conform_batch
from recordforge.records.sequence_encoding import SequenceEncoder
from recordforge.schemas import schema_from_dict
from recordforge.schemas.sequence import sequence_plans

SCHEMA = schema_from_dict(
    {
        "features": [
            {"name": "user", "type": "string", "nulls": "required"},
            {"name": "region", "type": "int64", "nulls": "required"},
            {"name": "country", "type": "string"},
            {"name": "tags", "type": "bytes", "shape": [-1]},
            {"name": "ts", "type": "int64", "nulls": "required"},
            {"name": "score", "type": "float32"},
            {"name": "d", "type": "float64", "narrow": True, "nulls": "default", "default": 0.0},
            {"name": "label", "type": "string"},
            {"name": "flag", "type": "bool"},
            {"name": "ints", "type": "int64", "shape": [-1]},
            {"name": "pair", "type": "float32", "shape": [2]},
            {"name": "blobs", "type": "bytes", "shape": [-1]},
            {"name": "a_long_step_name_" + "x" * 150, "type": "int64", "column": "ts"},
        ],
        "sequence": {"key": ["user", "region"], "order": "ts", "context": ["country", "tags"]},
    }
)
PLANS = sequence_plans(SCHEMA)
_LIST = {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}


def _feature(feature: feature_pb2.Feature, kind: str, value: object) -> None:
    """Sets `feature` to `value` (a scalar, a list, or None for an empty list of `kind`)."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    getattr(feature, _LIST[kind]).SetInParent()
    getattr(feature, _LIST[kind]).value.extend(values)


def _expected(context: dict, steps: list[dict]) -> bytes:
    seq = example_pb2.SequenceExample()
    for c in PLANS.context.columns:
        if context[c.name] is not None:
            _feature(seq.context.feature[c.name], c.kind.name, context[c.name])
    for c in PLANS.steps.columns:
        fl = seq.feature_lists.feature_list[c.name]
        for step in steps:
            _feature(fl.feature.add(), c.kind.name, step[c.name])
    return seq.SerializeToString(deterministic=True)


def _random_rows(rng: np.random.Generator, n: int) -> pa.RecordBatch:
    def maybe(values: list, p: float = 0.2) -> list:
        return [None if rng.random() < p else v for v in values]

    words = [bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) for k in rng.integers(0, 200, n)]
    return pa.RecordBatch.from_pydict(
        {
            "user": pa.array([f"u{k}" for k in rng.integers(0, 5, n)]),
            "region": pa.array(rng.integers(-3, 3, n)),
            "country": pa.array(maybe(["é" * int(k) for k in rng.integers(0, 4, n)])),
            "tags": pa.array(
                maybe([[w[:3]] * int(k) for w, k in zip(words, rng.integers(0, 3, n), strict=True)])
            ),
            "ts": pa.array(rng.integers(-(2**62), 2**62, n)),
            "score": pa.array(maybe(list(rng.standard_normal(n).astype(np.float32))), pa.float32()),
            "d": pa.array(maybe(list(rng.standard_normal(n) * 1e30))),
            "label": pa.array(maybe(["" if k == 0 else "x" * int(k) for k in rng.integers(0, 200, n)])),
            "flag": pa.array(maybe(list(rng.random(n) < 0.5))),
            "ints": pa.array(
                maybe([list(map(int, rng.integers(-5, 2**40, int(k)))) for k in rng.integers(0, 9, n)])
            ),
            "pair": pa.array(
                maybe([list(rng.standard_normal(2).astype(np.float32)) for _ in range(n)]),
                pa.list_(pa.float32()),
            ),
            "blobs": pa.array(
                maybe([[w] * int(k) for w, k in zip(words, rng.integers(0, 4, n), strict=True)]),
                pa.list_(pa.binary()),
            ),
        }
    )


def _conformed(rows: pa.RecordBatch, plan: object) -> pa.RecordBatch:
    result = conform_batch(rows, plan, file="t", first_row=0)
    assert not result.rejected
    return result.batch


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n", [1, 2, 37, 400])
def test_every_kind_null_and_list_equals_protobuf(seed: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    rows = _random_rows(rng, n)
    context_rows = _conformed(rows, PLANS.context)
    steps = _conformed(rows, PLANS.steps)
    cuts = np.unique(np.concatenate([[0, n], rng.integers(1, n, min(n - 1, 5)) if n > 1 else []]))
    offsets = cuts.astype(np.int64)
    first = pa.array(offsets[:-1])
    got = SequenceEncoder(PLANS).encode(context_rows.take(first), steps, offsets).to_pylist()
    context_py = context_rows.to_pylist()
    steps_py = steps.to_pylist()
    want = [
        _expected(context_py[int(a)], steps_py[int(a) : int(b)])
        for a, b in zip(offsets[:-1], offsets[1:], strict=True)
    ]
    assert got == want


def test_parses_with_tf_parse_sequence_example() -> None:
    import tensorflow as tf

    from recordforge.schemas.sequence import sequence_feature_spec, to_tf_sequence_spec

    rows = _random_rows(np.random.default_rng(1), 5)
    steps = _conformed(rows, PLANS.steps)
    context = _conformed(rows, PLANS.context).slice(0, 1)
    (record,) = SequenceEncoder(PLANS).encode(context, steps, np.array([0, 5])).to_pylist()
    ctx_spec, seq_spec = to_tf_sequence_spec(sequence_feature_spec(SCHEMA))
    ctx, seqs, _ = tf.io.parse_sequence_example(tf.constant([record]), ctx_spec, seq_spec)
    assert ctx["user"].numpy().tolist() == [rows.column("user")[0].as_py().encode()]
    assert seqs["ts"].numpy().tolist() == [rows.column("ts").to_pylist()]
    want_il = [v or [] for v in steps.column("ints").to_pylist()]
    assert seqs["ints"][0].to_list() == want_il


def test_keys_in_byte_order() -> None:
    """Map entries stand in the byte order of their keys (as C++ protobuf's deterministic
    serialization writes them; upb, protobuf's Python core, puts "ab" before "a"), and the record
    parses to the message built in Python."""
    schema = schema_from_dict(
        {
            "features": [
                {"name": k, "type": "int64", "nulls": "required", "column": "v"}
                for k in ("k", "t", "ts", "a", "ab", "b")
            ],
            "sequence": {"key": "k", "order": "t"},
        }
    )
    plans = sequence_plans(schema)
    rows = pa.RecordBatch.from_pydict({"v": pa.array([3, 1])})
    context = _conformed(rows, plans.context).slice(0, 1)
    (raw,) = (
        SequenceEncoder(plans).encode(context, _conformed(rows, plans.steps), np.array([0, 2])).to_pylist()
    )
    want = example_pb2.SequenceExample()
    want.context.feature["k"].int64_list.value.append(3)
    for k in ("t", "ts", "a", "ab", "b"):
        for v in (3, 1):
            want.feature_lists.feature_list[k].feature.add().int64_list.value.append(v)
    got = example_pb2.SequenceExample.FromString(raw)
    assert got == want
    assert len(raw) == want.ByteSize()
    positions = [raw.index(b"\x0a" + bytes([len(k)]) + k + b"\x12") for k in (b"a", b"ab", b"b", b"t", b"ts")]
    assert positions == sorted(positions)


@pytest.mark.parametrize("offsets", [[0, 2], [1, 3], [0, 0, 3], [0, 3, 2, 3]])
def test_refuses_offsets_that_do_not_cut_the_steps(offsets: list[int]) -> None:
    rows = _random_rows(np.random.default_rng(2), 3)
    steps = _conformed(rows, PLANS.steps)
    context = _conformed(rows, PLANS.context).slice(0, len(offsets) - 1)
    with pytest.raises(ValueError, match="offsets|one step"):
        SequenceEncoder(PLANS).encode(context, steps, np.array(offsets))
