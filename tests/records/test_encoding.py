"""The vectorised Example encoder against protobuf's own Example messages."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tensorflow.core.example import example_pb2

from recordforge.conforming.conform import conform_batch
from recordforge.records.encoding import ExampleEncoder
from recordforge.schemas import compile_schema, schema_from_dict

SCHEMA = schema_from_dict(
    {
        "features": [
            {"name": "i", "type": "int64"},
            {"name": "f", "type": "float32"},
            {"name": "d", "type": "float64", "narrow": True},
            {"name": "s", "type": "string"},
            {"name": "b", "type": "bytes"},
            {"name": "t", "type": "bool"},
            {"name": "il", "type": "int64", "shape": [-1]},
            {"name": "fl", "type": "float32", "shape": [2]},
            {"name": "sl", "type": "bytes", "shape": [-1]},
            {"name": "m", "type": "int64", "shape": [2, 2]},
            {"name": "a_long_feature_name_" + "x" * 150, "type": "int64", "column": "i"},
        ]
    }
)
PLAN = compile_schema(SCHEMA)


def _expected(row: dict) -> example_pb2.Example:
    ex = example_pb2.Example()
    ex.features.SetInParent()
    for f in PLAN.features:
        v = row[f.name]
        if v is None:
            continue
        vals = v if isinstance(v, list) else [v]
        feat = ex.features.feature[f.name]
        getattr(
            feat, {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}[f.kind.name]
        ).value.extend(vals)
        feat.WhichOneof("kind") or getattr(
            feat, {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}[f.kind.name]
        ).SetInParent()
    return ex


def _random_batch(rng: np.random.Generator, n: int) -> pa.RecordBatch:
    def maybe(values: list, p: float = 0.2) -> list:
        return [None if rng.random() < p else v for v in values]

    ints = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    ints[rng.random(n) < 0.3] = 0
    small = rng.integers(-300, 300, n)
    words = [bytes(rng.integers(0, 256, int(k), dtype=np.uint8)) for k in rng.integers(0, 300, n)]
    return pa.RecordBatch.from_pydict(
        {
            "i": pa.array(maybe([int(x) for x in np.where(rng.random(n) < 0.5, ints, small)])),
            "f": pa.array(maybe(list(rng.standard_normal(n).astype(np.float32))), pa.float32()),
            "d": pa.array(maybe(list(rng.standard_normal(n) * 1e30))),
            "s": pa.array(maybe(["é" * int(k) for k in rng.integers(0, 100, n)])),
            "b": pa.array(maybe(words), pa.binary()),
            "t": pa.array(maybe(list(rng.random(n) < 0.5))),
            "il": pa.array(
                maybe([list(map(int, rng.integers(-5, 2**40, int(k)))) for k in rng.integers(0, 12, n)])
            ),
            "fl": pa.array(
                maybe([list(rng.standard_normal(2).astype(np.float32)) for _ in range(n)]),
                pa.list_(pa.float32()),
            ),
            "sl": pa.array(
                maybe(
                    [
                        [w[: int(k)] for k in rng.integers(0, 140, int(m))]
                        for w, m in zip(words, rng.integers(0, 4, n), strict=True)
                    ]
                ),
                pa.list_(pa.binary()),
            ),
            "m": pa.array(
                maybe([[[int(x) for x in r] for r in rng.integers(-9, 9, (2, 2))] for _ in range(n)])
            ),
        }
    )


@pytest.mark.parametrize("seed", range(4))
def test_matches_protobuf_messages(seed: int) -> None:
    rng = np.random.default_rng(seed)
    batch = _random_batch(rng, 300)
    conformed = conform_batch(batch, PLAN, file="mem", first_row=0).batch
    encoded = ExampleEncoder(PLAN).encode(conformed)
    assert len(encoded) == batch.num_rows
    for i, row in enumerate(conformed.to_pylist()):
        got = example_pb2.Example.FromString(encoded[i].as_py())
        assert got == _expected(row), f"row {i}"
        # Our bytes are canonical: protobuf re-serializes the parsed message to the same size.
        assert len(got.SerializeToString()) == len(encoded[i].as_py())


def test_deterministic_and_keys_in_byte_order() -> None:
    batch = _random_batch(np.random.default_rng(7), 50)
    conformed = conform_batch(batch, PLAN, file="mem", first_row=0).batch
    a = ExampleEncoder(PLAN).encode(conformed)
    b = ExampleEncoder(PLAN).encode(conformed.slice(0))
    assert a.equals(b)
    for raw in a.to_pylist():
        keys = _wire_keys(raw)
        assert keys == sorted(keys)
        assert {k.decode() for k in keys} == set(example_pb2.Example.FromString(raw).features.feature)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            return value, pos


def _wire_keys(raw: bytes) -> list[bytes]:
    """The map keys in the order they stand in the serialized bytes."""
    assert raw[0] == 0x0A
    length, pos = _varint(raw, 1)
    assert pos + length == len(raw)
    keys = []
    while pos < len(raw):
        assert raw[pos] == 0x0A
        entry_len, pos = _varint(raw, pos + 1)
        assert raw[pos] == 0x0A
        key_len, kpos = _varint(raw, pos + 1)
        keys.append(raw[kpos : kpos + key_len])
        pos += entry_len
    return keys


def test_sliced_batches_encode_like_whole() -> None:
    batch = _random_batch(np.random.default_rng(3), 40)
    conformed = conform_batch(batch, PLAN, file="mem", first_row=0).batch
    whole = ExampleEncoder(PLAN).encode(conformed)
    part = ExampleEncoder(PLAN).encode(conformed.slice(13, 11))
    assert part.to_pylist() == whole.slice(13, 11).to_pylist()


@pytest.mark.parametrize(
    ("column", "value", "expected"),
    [
        ("i", 0, [0]),
        ("i", -1, [-1]),
        ("i", 2**63 - 1, [2**63 - 1]),
        ("i", -(2**63), [-(2**63)]),
        ("s", "", [b""]),
        ("b", b"\xff\x00\xfe", [b"\xff\x00\xfe"]),
        ("t", False, [0]),
        ("f", 0.0, [0.0]),
    ],
)
def test_zeros_and_edge_values_are_values(column: str, value: object, expected: list) -> None:
    plan = compile_schema(
        schema_from_dict(
            {
                "features": [
                    {
                        "name": column,
                        "type": {"i": "int64", "s": "string", "b": "bytes", "t": "bool", "f": "float32"}[
                            column
                        ],
                    }
                ]
            }
        )
    )
    typ = {"f": pa.float32(), "b": pa.binary()}.get(column)
    batch = pa.RecordBatch.from_pydict({column: pa.array([value, None], typ)})
    out = ExampleEncoder(plan).encode(conform_batch(batch, plan, file="m", first_row=0).batch)
    first = example_pb2.Example.FromString(out[0].as_py()).features.feature[column]
    assert list(getattr(first, first.WhichOneof("kind")).value) == expected
    assert column not in example_pb2.Example.FromString(out[1].as_py()).features.feature


@pytest.mark.parametrize("nulls", [0.0, 0.5, 1.0])
def test_fixed_width_columns_match_protobuf(nulls: float) -> None:
    """Columns of one width wherever present (laid out as matrices, runs of them joined as one
    part): with no nulls, some, or none present at all, and beside variable-width columns."""
    schema = schema_from_dict(
        {
            "features": [
                {"name": "a", "type": "float32"},
                {"name": "b", "type": "bytes"},  # every value 3 bytes long
                {"name": "c", "type": "float32", "shape": [3]},
                {"name": "d", "type": "int64", "shape": [-1]},  # empty list on every row
                {"name": "e", "type": "bool"},
                {"name": "f", "type": "string"},  # variable width: ends a run
                {"name": "g", "type": "float32"},
            ]
        }
    )
    plan = compile_schema(schema)
    rng = np.random.default_rng(7)
    n = 200

    def maybe(values: list) -> list:
        return [None if rng.random() < nulls else v for v in values]

    batch = pa.RecordBatch.from_pydict(
        {
            "a": pa.array(maybe(list(rng.standard_normal(n).astype(np.float32))), pa.float32()),
            "b": pa.array(
                maybe([bytes(rng.integers(0, 256, 3, dtype=np.uint8)) for _ in range(n)]), pa.binary()
            ),
            "c": pa.array(
                maybe([list(rng.standard_normal(3).astype(np.float32)) for _ in range(n)]),
                pa.list_(pa.float32()),
            ),
            "d": pa.array(maybe([[] for _ in range(n)]), pa.list_(pa.int64())),
            "e": pa.array(maybe(list(rng.random(n) < 0.5))),
            "f": pa.array(maybe(["x" * int(k) for k in rng.integers(0, 5, n)])),
            "g": pa.array(maybe([0.0] * n), pa.float32()),
        }
    )
    conformed = conform_batch(batch, plan, file="mem", first_row=0).batch
    encoded = ExampleEncoder(plan).encode(conformed)
    kinds = {f.name: f.kind.name for f in plan.features}
    for i, row in enumerate(conformed.to_pylist()):
        want = example_pb2.Example()
        want.features.SetInParent()
        for name, v in row.items():
            if v is None:
                continue
            field = {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}[kinds[name]]
            values = getattr(want.features.feature[name], field)
            values.SetInParent()
            values.value.extend(v if isinstance(v, list) else [v])
        assert encoded[i].as_py() == want.SerializeToString(deterministic=True), f"row {i}"


def _spanning(rows: list[list], null_rows: set[int], value_type: pa.DataType) -> pa.ListArray:
    """A list array of `rows` whose null rows still span their values (legal Arrow, unlike
    Parquet's reader output)."""
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int32)
    values = pa.array([v for r in rows for v in r], value_type)
    mask = pa.array([i in null_rows for i in range(len(rows))])
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)


def _protobuf(rows: list[dict], kinds: dict[str, str]) -> list[bytes]:
    """protobuf's own deterministic serialization of each {feature: values} row."""
    fields = {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}
    out = []
    for row in rows:
        want = example_pb2.Example()
        want.features.SetInParent()
        for name, v in row.items():
            values = getattr(want.features.feature[name], fields[kinds[name]])
            values.SetInParent()
            values.value.extend(v)
        out.append(want.SerializeToString(deterministic=True))
    return out


SPANNING_PLAN = compile_schema(
    schema_from_dict(
        {
            "features": [
                {"name": "il", "type": "int64", "shape": [-1]},
                {"name": "fl", "type": "float32", "shape": [2], "max": 10},
                {"name": "bl", "type": "bytes", "shape": [-1]},
                {"name": "sc", "type": "int64", "shape": [-1], "column": "scalar"},
            ]
        }
    )
)
# Rows 1, 3 and 4 are null, but span values: nulls, values a check rejects, lengths [2] forbids.
SPANNING_NULLS = {1, 3, 4}
SPANNING_ROWS = {
    "il": [[1, 2], [None, 300], [4], [5, 6], [2**40], [7, 8]],
    "fl": [[1, 2], [99, None], [5, 6], [7, 8, 9], [None], [1.5, 2.5]],
    "bl": [[b"a"], [b"\xff" * 200, None, b""], [b"bc"], [b"d"], [b"e"], [b"f", b"g"]],
}
SPANNING_EXPECTED = [
    {"bl": [b"a"], "fl": [1.0, 2.0], "il": [1, 2], "sc": [1]},
    {},
    {"bl": [b"bc"], "fl": [5.0, 6.0], "il": [4], "sc": [3]},
    {},
    {},
    {"bl": [b"f", b"g"], "fl": [1.5, 2.5], "il": [7, 8], "sc": [6]},
]


@pytest.mark.parametrize(("first", "rows"), [(0, 6), (1, 5), (3, 2)])
def test_null_lists_spanning_values_are_absent(first: int, rows: int) -> None:
    """Through conform: no row rejected for values under a null, the null rows absent, the
    others exact (protobuf's own bytes); also for slices of the batch."""
    types = {"il": pa.int64(), "fl": pa.float32(), "bl": pa.binary()}
    batch = pa.RecordBatch.from_pydict(
        {
            **{k: _spanning(v, SPANNING_NULLS, types[k]) for k, v in SPANNING_ROWS.items()},
            # a nullable scalar column feeding a [-1] feature (as a TFMD schema maps one)
            "scalar": pa.array([1, None, 3, None, None, 6]),
        }
    ).slice(first, rows)
    conformed = conform_batch(batch, SPANNING_PLAN, file="mem", first_row=0)
    assert conformed.rejected == []
    kinds = {f.name: f.kind.name for f in SPANNING_PLAN.features}
    encoded = ExampleEncoder(SPANNING_PLAN).encode(conformed.batch).to_pylist()
    assert encoded == _protobuf(SPANNING_EXPECTED[first : first + rows], kinds)


@pytest.mark.parametrize(("first", "rows"), [(0, 6), (1, 5)])
def test_encoder_takes_null_lists_spanning_values(first: int, rows: int) -> None:
    """Straight into the encoder (a caller's own batches in the plan's Arrow schema), with only
    valid values under the null rows: the same bytes as protobuf's."""
    rows_by_name = {
        "il": [[1, 2], [3, 300], [4], [5, 6], [2**40], [7, 8]],
        "fl": [[1, 2], [9, 9], [5, 6], [7, 8], [3, 4], [1.5, 2.5]],
        "bl": [[b"a"], [b"\xff" * 200, b""], [b"bc"], [b"d"], [b"e"], [b"f", b"g"]],
        "sc": [[1], [2], [3], [4], [5], [6]],
    }
    arrays = [
        _spanning(rows_by_name[field.name], SPANNING_NULLS, field.type.value_type).cast(field.type)
        for field in SPANNING_PLAN.arrow_schema
    ]
    batch = pa.RecordBatch.from_arrays(arrays, schema=SPANNING_PLAN.arrow_schema).slice(first, rows)
    kinds = {f.name: f.kind.name for f in SPANNING_PLAN.features}
    encoded = ExampleEncoder(SPANNING_PLAN).encode(batch).to_pylist()
    assert encoded == _protobuf(SPANNING_EXPECTED[first : first + rows], kinds)


def test_nullable_fixed_size_list_rows_are_absent() -> None:
    """A fixed_size_list's null rows hold their N values (here nulls); cast to a list they span
    them. The row is absent, not rejected as `list_null` (pyarrow 25's Parquet reader cannot read
    such a column back, but any in-memory Arrow source has them)."""
    plan = compile_schema(schema_from_dict({"features": [{"name": "x", "type": "float32", "shape": [2]}]}))
    values = pa.array([1.0, 2.0, None, None, 3.0, 4.0, 0.0, 0.0], pa.float32())
    x = pa.FixedSizeListArray.from_arrays(values, 2, mask=pa.array([False, True, False, True]))
    conformed = conform_batch(pa.RecordBatch.from_pydict({"x": x}), plan, file="mem", first_row=0)
    assert conformed.rejected == []
    encoded = ExampleEncoder(plan).encode(conformed.batch).to_pylist()
    assert encoded == _protobuf([{"x": [1.0, 2.0]}, {}, {"x": [3.0, 4.0]}, {}], {"x": "FLOAT"})
