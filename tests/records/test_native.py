"""The native loops (_native.c): CRC32C against google-crc32c, framing against a framing built
with struct, and the encoder against protobuf for every feature kind and null policy."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np
import pyarrow as pa
import pytest
from tensorflow.core.example import example_pb2

from recordforge.conforming.conform import conform_batch
from recordforge.records import _native
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.encoding import ExampleEncoder
from recordforge.records.tfrecord import frame_records, framed, read_records
from recordforge.schemas import compile_schema, schema_from_dict


@pytest.mark.parametrize("hardware", [True, False])
def test_crc32c_matches_google_crc32c(hardware: bool) -> None:
    """Every length from 0 to 300 at every alignment of the first byte, and a long buffer."""
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, 400, dtype=np.uint8).tobytes()
    for start in range(8):
        for length in range(301):
            piece = raw[start : start + length]
            assert _native.crc32c(piece, hardware) == google_crc32c.value(piece), (start, length)
    big = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    assert _native.crc32c(big, hardware) == google_crc32c.value(big)


def _reference_frame(record: bytes) -> bytes:
    head = struct.pack("<Q", len(record))
    return head + struct.pack("<I", masked_crc32c(head)) + record + struct.pack("<I", masked_crc32c(record))


@pytest.mark.parametrize("typ", [pa.large_binary(), pa.binary()])
def test_framed_matches_struct_framing(typ: pa.DataType, tmp_path) -> None:
    rng = np.random.default_rng(1)
    records = [
        b"",
        b"\x00",
        *(rng.integers(0, 256, int(k), dtype=np.uint8).tobytes() for k in [1, 127, 128, 70000]),
    ]
    records += [rng.integers(0, 256, int(k), dtype=np.uint8).tobytes() for k in rng.integers(0, 400, 200)]
    array = pa.array(records, typ)
    for sliced, expected in ((array, records), (array.slice(3, 50), records[3:53])):
        offsets, data = framed(sliced)
        frames = [_reference_frame(r) for r in expected]
        assert data.tobytes() == b"".join(frames)
        assert offsets.tolist() == np.concatenate([[0], np.cumsum([len(f) for f in frames])]).tolist()
        assert frame_records(sliced).to_pylist() == frames
    path = tmp_path / "records.tfrecord"
    path.write_bytes(framed(array)[1].tobytes())
    assert [r for _, r in read_records(str(path), "none")] == records
    empty_offsets, empty = framed(pa.array([], typ))
    assert empty_offsets.tolist() == [0] and len(empty) == 0


def test_frame_refuses_offsets_outside_the_data() -> None:
    with pytest.raises(ValueError, match="record 1 reaches outside the data"):
        _native.frame_records(np.array([0, 2, 9], np.int64), b"abcd")


# Every kind, shape and null policy a feature can have (images are bytes and int64 scalars). No
# key is a prefix of another: protobuf's Python (upb) orders such keys longest first ("fl" before
# "f"), its C++ by bytes, as RecordForge does (test_encoding checks the order).
EVERY_KIND = compile_schema(
    schema_from_dict(
        {
            "features": [
                {"name": "i_abs", "type": "int64"},
                {"name": "i_req", "type": "int64", "nulls": "required"},
                {"name": "i_def", "type": "int64", "nulls": "default", "default": -7},
                {"name": "f_abs", "type": "float32"},
                {"name": "f_def", "type": "float32", "nulls": "default", "default": 0.5},
                {"name": "d_nar", "type": "float64", "narrow": True},
                {"name": "s_abs", "type": "string"},
                {"name": "s_def", "type": "string", "nulls": "default", "default": "unknown"},
                {"name": "b_abs", "type": "bytes"},
                {"name": "t_abs", "type": "bool"},
                {"name": "l_int", "type": "int64", "shape": [-1]},
                {"name": "l_flt", "type": "float32", "shape": [3]},
                {"name": "l_byt", "type": "bytes", "shape": [-1]},
                {"name": "m_int", "type": "int64", "shape": [2, 2]},
                {"name": "k" * 200, "type": "string", "column": "s_abs"},  # a key longer than 127 bytes
            ]
        }
    )
)


def _every_kind_batch(rng: np.random.Generator, n: int) -> pa.RecordBatch:
    def maybe(values: list, p: float = 0.25) -> list:
        return [None if rng.random() < p else v for v in values]

    ints = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    ints = np.where(rng.random(n) < 0.5, ints, rng.integers(-200, 200, n))  # one and ten bytes
    words = [rng.integers(0, 256, int(k), dtype=np.uint8).tobytes() for k in rng.integers(0, 20000, n)]
    return pa.RecordBatch.from_pydict(
        {
            "i_abs": pa.array(maybe([int(x) for x in ints])),
            "i_req": pa.array(maybe([int(x) for x in rng.integers(-(2**40), 2**40, n)], 0.05)),
            "i_def": pa.array(maybe([int(x) for x in rng.integers(-5, 5, n)])),
            "f_abs": pa.array(maybe(list(rng.standard_normal(n).astype(np.float32))), pa.float32()),
            "f_def": pa.array(maybe([0.0] * n), pa.float32()),
            "d_nar": pa.array(maybe(list(rng.standard_normal(n) * 1e30))),
            "s_abs": pa.array(maybe(["é" * int(k) for k in rng.integers(0, 90, n)])),
            "s_def": pa.array(maybe(["", "x", "ab"] * (n // 3) + [""] * (n % 3))),
            "b_abs": pa.array(maybe(words), pa.binary()),
            "t_abs": pa.array(maybe(list(rng.random(n) < 0.5))),
            "l_int": pa.array(
                maybe([[int(x) for x in rng.integers(-5, 2**62, int(k))] for k in rng.integers(0, 30, n)])
            ),
            "l_flt": pa.array(
                maybe([list(rng.standard_normal(3).astype(np.float32)) for _ in range(n)]),
                pa.list_(pa.float32()),
            ),
            "l_byt": pa.array(
                maybe(
                    [
                        [w[: int(k)] for k in rng.integers(0, 300, int(m))]
                        for w, m in zip(words, rng.integers(0, 4, n), strict=True)
                    ]
                ),
                pa.list_(pa.binary()),
            ),
            "m_int": pa.array(
                maybe([[[int(x) for x in r] for r in rng.integers(-9, 9, (2, 2))] for _ in range(n)])
            ),
        }
    )


def _protobuf(row: dict, kinds: dict[str, str]) -> bytes:
    fields = {"INT64": "int64_list", "FLOAT": "float_list", "BYTES": "bytes_list"}
    want = example_pb2.Example()
    want.features.SetInParent()
    for name, v in row.items():
        if v is None:
            continue
        values = getattr(want.features.feature[name], fields[kinds[name]])
        values.SetInParent()
        values.value.extend(v if isinstance(v, list) else [v])
    return want.SerializeToString(deterministic=True)


@pytest.mark.parametrize("seed", range(3))
def test_every_kind_and_null_policy_matches_protobuf(seed: int) -> None:
    """Through conform (a null where `required` is a bad row, left out), with records long enough
    for every length to take two and three varint bytes, sliced and whole."""
    rng = np.random.default_rng(seed)
    batch = _every_kind_batch(rng, 120)
    result = conform_batch(batch, EVERY_KIND, file="mem", first_row=0)
    conformed = result.batch
    assert {bad.column for bad in result.rejected} == {"i_req"}
    kinds = {c.name: c.kind.name for c in EVERY_KIND.columns}
    expected = [_protobuf(row, kinds) for row in conformed.to_pylist()]
    assert max(len(e) for e in expected) > 16384
    assert ExampleEncoder(EVERY_KIND).encode(conformed).to_pylist() == expected
    assert ExampleEncoder(EVERY_KIND).encode(conformed.slice(7, 30)).to_pylist() == expected[7:37]


def test_absent_everywhere_and_no_rows() -> None:
    """A column null on every row is left out of every record; no feature present: `0x0A 0x00`."""
    plan = compile_schema(
        schema_from_dict({"features": [{"name": "a", "type": "int64"}, {"name": "b", "type": "bytes"}]})
    )
    batch = pa.RecordBatch.from_pydict(
        {"a": pa.array([None, None], pa.int64()), "b": pa.array([None, b"x"], pa.binary())}
    )
    conformed = conform_batch(batch, plan, file="mem", first_row=0).batch
    assert ExampleEncoder(plan).encode(conformed).to_pylist() == [
        b"\x0a\x00",
        _protobuf({"b": b"x"}, {"b": "BYTES"}),
    ]
    assert ExampleEncoder(plan).encode(conformed.slice(0, 0)).to_pylist() == []


def test_encoder_refuses_offsets_outside_the_values() -> None:
    """A caller's malformed column is a ValueError, not a read outside the buffers."""
    offsets = np.array([0, 5], np.int64)
    values = np.array([1, 2], np.int64)
    spec = (b"\x0a\x01a", 2, None, 0, offsets, 0, values, 0, None)
    with pytest.raises(ValueError, match="row 0 of column 0 reaches outside its buffers"):
        _native.encode_examples(1, [spec])


def test_find_records_and_data_crcs() -> None:
    """Whole records are found up to an incomplete one or one whose length CRC fails; data CRCs
    that fail are named by index."""
    records = [b"a" * k for k in (0, 1, 200, 3)]
    offsets, data = framed(pa.array(records, pa.large_binary()))
    raw = data.tobytes()
    heads, used, bad = _native.find_records(raw + raw[:20])  # the empty record, then a cut one
    assert np.frombuffer(heads, np.int64).tolist() == [*offsets[:-1].tolist(), len(raw)]
    assert (used, bad) == (len(raw) + 16, False)
    broken = bytearray(raw)
    broken[int(offsets[2]) + 8] ^= 1  # the third record's length CRC
    heads, used, bad = _native.find_records(bytes(broken))
    assert (len(heads) // 8, used, bad) == (2, int(offsets[2]), True)
    broken = bytearray(raw)
    broken[int(offsets[2]) + 12 + 5] ^= 1  # a byte of the third record's data
    broken[int(offsets[4]) - 1] ^= 1  # the last record's data CRC
    lengths = np.array([len(r) for r in records], np.int64)
    assert _native.data_crc_mismatches(bytes(broken), offsets[:-1].copy(), lengths) == [2, 3]
    assert _native.data_crc_mismatches(raw, offsets[:-1].copy(), lengths) == []


def _unaligned(buf: pa.Buffer) -> pa.Buffer:
    """The same bytes at an odd address (as buffers come out of a pickle on a Dask worker)."""
    return pa.py_buffer(b"\0" + buf.to_pybytes())[1:]


def test_unaligned_buffers_encode_and_frame_alike() -> None:
    batch = _every_kind_batch(np.random.default_rng(5), 40)
    conformed = conform_batch(batch, EVERY_KIND, file="mem", first_row=0).batch
    moved = []
    for col in conformed.columns:
        if pa.types.is_large_list(col.type):
            valid, offsets = col.buffers()[:2]
            col = pa.LargeListArray.from_buffers(
                col.type, len(col), [valid, _unaligned(offsets)], children=[col.values], offset=col.offset
            )
        moved.append(col)
    encoder = ExampleEncoder(EVERY_KIND)
    encoded = encoder.encode(conformed)
    assert encoder.encode(pa.RecordBatch.from_arrays(moved, schema=conformed.schema)).equals(encoded)
    valid, offsets, data = encoded.buffers()
    shifted = pa.Array.from_buffers(pa.large_binary(), len(encoded), [valid, _unaligned(offsets), data])
    assert framed(shifted)[1].tobytes() == framed(encoded)[1].tobytes()


@pytest.mark.parametrize("key", ["k", "key_of_5_", "a_key_of_twenty_bytes"])
def test_entries_either_side_of_one_byte_lengths_match_protobuf(key: str) -> None:
    """An entry under 128 bytes is written with one-byte lengths, a longer one with varints: every
    kind at every size across that line, scalar and list, matches protobuf."""
    n = 150
    plan = compile_schema(
        schema_from_dict(
            {
                "features": [
                    {"name": key + "s", "type": "string", "column": "s"},
                    {"name": key + "i", "type": "int64", "shape": [-1], "column": "i"},
                    {"name": key + "f", "type": "float32", "shape": [-1], "column": "f"},
                    {"name": key + "b", "type": "bytes", "shape": [-1], "column": "b"},
                ]
            }
        )
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "s": pa.array(["x" * k for k in range(n)]),
            "i": pa.array([[300] * (k // 2) for k in range(n)], pa.list_(pa.int64())),  # 2 bytes each
            "f": pa.array([[1.5] * (k // 4) for k in range(n)], pa.list_(pa.float32())),
            "b": pa.array([[b"y" * k, b""] for k in range(n)], pa.list_(pa.binary())),
        }
    )
    conformed = conform_batch(batch, plan, file="mem", first_row=0).batch
    kinds = {c.name: c.kind.name for c in plan.columns}
    expected = [_protobuf(row, kinds) for row in conformed.to_pylist()]
    assert ExampleEncoder(plan).encode(conformed).to_pylist() == expected


def test_encoder_names_the_first_bad_row_and_its_first_bad_column() -> None:
    def int_lists(name: bytes, rows: list[int] | None) -> tuple:
        """An int64 column over values 0, 1, 2: scalar (rows None) or lists at offsets `rows`."""
        offsets = None if rows is None else np.array(rows, np.int64)
        return (b"\x0a\x01" + name, 2, None, 0, offsets, 0, np.arange(3, dtype=np.int64), 0, None)

    good, late, early = int_lists(b"a", None), int_lists(b"b", [0, 1, 2, 9]), int_lists(b"c", [0, 1, 9, 9])
    with pytest.raises(ValueError, match="row 1 of column 2 reaches outside its buffers"):
        _native.encode_examples(3, [good, late, early])
    with pytest.raises(ValueError, match="row 1 of column 1 reaches outside its buffers"):
        _native.encode_examples(3, [good, early, early])
