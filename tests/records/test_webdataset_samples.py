"""WebDataset samples made column by column (`SampleCodec.encode_batch`) against the record-by-record
reference (`SampleCodec.encode_records`, the writer as it was) byte for byte, and against plain
tarfile, numpy, json and pickle reading the samples back to the Examples' values."""

from __future__ import annotations

import io
import json
import pickle
import struct
import tarfile
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from recordforge.records import webdataset as wd
from recordforge.records.example_pb import Example
from recordforge.records.webdataset import columns
from recordforge.schemas import compile_schema, schema_from_dict

_LONG = "a_feature_name_long_enough_that_its_member_name_needs_a_pax_header_" + "x" * 20
FEATURES = [
    {"name": "i", "type": "int64"},
    {"name": "cents", "type": "decimal", "as": "scaled_int", "scale": 2},
    {"name": "s", "type": "string"},
    {"name": "price", "type": "decimal", "as": "string"},
    {"name": "raw", "type": "bytes"},
    {"name": "img", "type": "image"},
    {"name": "f32", "type": "float32"},
    {"name": "nar", "type": "float64", "narrow": True},
    {"name": "exact", "type": "float64", "encode": "bytes"},
    {"name": "b", "type": "bool"},
    {"name": "day", "type": "date"},
    {"name": "at", "type": "timestamp", "unit": "us"},
    {"name": "tod", "type": "time", "unit": "s"},
    {"name": "nums", "type": "int64", "shape": [-1]},
    {"name": "flags", "type": "bool", "shape": [-1]},
    {"name": "vals", "type": "float32", "shape": [-1]},
    {"name": "tags", "type": "string", "shape": [-1]},
    {"name": "blobs", "type": "bytes", "shape": [-1]},
    {"name": "pair", "type": "float32", "shape": [2]},
    {"name": "grid", "type": "int64", "shape": [2, 3]},
    {"name": "wide", "type": "float64", "shape": [2], "encode": "bytes"},
    {"name": "many", "type": "float64", "shape": [-1], "encode": "bytes"},
    {"name": "rag", "type": "int64", "shape": [-1, -1]},
    {"name": "dotted.name", "type": "int64", "shape": [-1]},
    {"name": _LONG, "type": "float32"},
]
# Names a schema refuses, but a member name may hold: tarfile gives them pax headers.
_UNICODE = [wd.Member("naïve_ünï", "cls"), wd.Member("größe", "npy", "float32", (-1,))]
CODEC = wd.SampleCodec(
    tuple(
        sorted(
            [
                *wd.SampleCodec.of(compile_schema(schema_from_dict({"features": FEATURES})).features).members,
                *_UNICODE,
            ],
            key=lambda m: m.name,
        )
    )
)
FILE = "gs://bucket/some/file.parquet"
# A float32 whose bits the serialized records carry where a test wants a signalling NaN.
_MARK = struct.unpack("<f", struct.pack("<I", 0x0DEC0DED))[0]
_SNAN = struct.pack("<I", 0x7F800001)


def _floats(rng: np.random.Generator, c: int) -> list[float]:
    pick = [0.0, -0.0, float("inf"), float("nan"), 1e-40, _MARK]
    return [
        pick[int(rng.integers(len(pick)))] if rng.random() < 0.3 else float(np.float32(rng.normal()))
        for _ in range(c)
    ]


def _count(rng: np.random.Generator, m: wd.Member) -> int:
    if m.shape != (-1,):
        return int(np.prod(m.shape))
    return int(rng.choice([0, 1, 2, 3, 7, 70, int(rng.integers(0, 200))]))


def _value(rng: np.random.Generator, m: wd.Member) -> tuple[str, list[Any]]:
    """(list kind, values) of a random value of the member's feature."""
    if m.ext == "cls":
        pick = [0, -1, 2**63 - 1, -(2**63), 7, int(rng.integers(-(2**62), 2**62))]
        return "int64_list", [pick[int(rng.integers(len(pick)))]]
    if m.ext == "txt" and m.feature.endswith("/format"):
        return "bytes_list", [str(rng.choice(["png", "jpeg", "webp", "raw", "bmpü"])).encode()]
    if m.ext in ("txt", "bin", "image"):
        size = int(rng.choice([0, 1, 5, 383, 384, 385, 511, 512, 513, 1500]))
        if m.ext == "txt":
            return "bytes_list", [("é" * size)[: size // 2].encode()]
        return "bytes_list", [rng.integers(0, 256, size, dtype=np.uint8).tobytes()]
    if m.ext == "json":
        texts = ["", "plain", 'quote " and \\ back', "new\nline\ttab", "ünïcödé ☃", "\x00\x1f\x7f"]
        return "bytes_list", [str(rng.choice(texts)).encode() for _ in range(int(rng.integers(0, 5)))]
    if m.ext == "pyd":
        blobs = [b"", b"a", b"\x00", b"ab", bytes(300)]
        return "bytes_list", [blobs[int(rng.integers(len(blobs)))] for _ in range(int(rng.integers(0, 6)))]
    c = _count(rng, m)
    if m.dtype == "float64":
        doubles = rng.normal(size=c)
        doubles[rng.random(c) < 0.2] = np.nan
        return "bytes_list", [doubles.astype("<f8").tobytes()]
    if m.dtype == "float32":
        return "float_list", _floats(rng, c)
    if m.dtype == "bool":
        return "int64_list", [int(x) for x in rng.choice([0, 1, 1, 2, -1], c)]
    return "int64_list", [int(x) for x in rng.integers(-(2**63), 2**63 - 1, c, dtype=np.int64, endpoint=True)]


def _example(rng: np.random.Generator, present: float = 0.8) -> bytes:
    ex = Example()
    ex.features.SetInParent()
    for m in CODEC.members:
        if rng.random() > present:
            continue
        if m.feature.startswith("img/") and "img" not in ex.features.feature:
            continue  # an image's parts come with it
        kind, values = _value(rng, m)
        feature = ex.features.feature[m.feature]
        if m.shape == (-1,) and m.dtype != "float64" and rng.random() < 0.1:
            feature.SetInParent()  # present with no list at all: an empty array
            continue
        target = getattr(feature, kind)
        target.SetInParent()
        target.value.extend(values)
    if "img" in ex.features.feature:  # an image has its format
        if "img/format" not in ex.features.feature:
            ex.features.feature["img/format"].bytes_list.value.append(b"png")
    raw = ex.SerializeToString(deterministic=True)
    return raw.replace(struct.pack("<f", _MARK), _SNAN)


def _records(seed: int, n: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [_example(rng, present=[0.0, 0.5, 0.8, 1.0][i % 4]) for i in range(n)]


@pytest.fixture()
def columnwise_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The record-by-record way is not taken by encode_batch (it stays callable directly)."""

    def refuse(*args: Any) -> None:
        raise AssertionError("encode_batch fell back to the record-by-record encoder")

    monkeypatch.setattr(wd.SampleCodec, "encode_records", refuse)


def _reference(records: pa.Array, first_row: int = 0) -> list[bytes]:
    return [CODEC.encode(wd.sample_key(FILE, first_row + i), r) for i, r in enumerate(records.to_pylist())]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("columnwise_only")
def test_columnwise_samples_are_the_record_by_record_bytes(seed: int) -> None:
    records = pa.array(_records(seed, 240), pa.large_binary())
    got = CODEC.encode_batch(FILE, 1000 * seed, records)
    assert got.type == pa.large_binary()
    assert got.to_pylist() == _reference(records, 1000 * seed)


@pytest.mark.usefixtures("columnwise_only")
def test_slices_binary_arrays_and_key_widths() -> None:
    raw = _records(9, 60)
    records = pa.array(raw, pa.binary()).slice(7, 40)
    assert CODEC.encode_batch(FILE, 10**12 - 40, records).to_pylist() == _reference(records, 10**12 - 40)
    empty = pa.array([b""] * 3, pa.large_binary())  # Examples with no feature: empty samples
    assert CODEC.encode_batch(FILE, 0, empty).to_pylist() == [b""] * 3


@pytest.mark.usefixtures("columnwise_only")
def test_records_out_of_the_canonical_layout() -> None:
    """Examples protobuf would write otherwise (keys out of order, one in two messages, a
    feature the schema lacks) are decoded by protobuf inside the columnwise way, as before."""
    rng = np.random.default_rng(5)
    records = []
    for _ in range(50):
        a, b = _example(rng, 0.5), _example(rng, 0.5)
        extra = Example()
        extra.features.feature["not_in_schema"].int64_list.value.append(3)
        records.append(b + a + extra.SerializeToString())
    arr = pa.array(records, pa.large_binary())
    assert CODEC.encode_batch(FILE, 0, arr).to_pylist() == _reference(arr)


@pytest.mark.usefixtures("columnwise_only")
def test_image_formats_without_their_image() -> None:
    rng = np.random.default_rng(4)
    records = []
    for i in range(30):
        ex = Example.FromString(_example(rng))
        if i % 3 == 0:
            if "img" in ex.features.feature:
                del ex.features.feature["img"]
            ex.features.feature["img/format"].bytes_list.value[:] = [b"jpeg"]
        records.append(ex.SerializeToString(deterministic=True))
    arr = pa.array(records, pa.large_binary())
    assert CODEC.encode_batch(FILE, 0, arr).to_pylist() == _reference(arr)


def test_batches_it_does_not_take_are_written_or_refused_as_before() -> None:
    rng = np.random.default_rng(3)
    good = _records(3, 5)
    wrong_kind = Example()
    wrong_kind.features.feature["nums"].float_list.value.extend([1.5, -2.0])
    arr = pa.array([*good, wrong_kind.SerializeToString()], pa.large_binary())
    assert CODEC.encode_batch(FILE, 0, arr).to_pylist() == _reference(arr)
    no_format = Example()
    no_format.features.feature["img"].bytes_list.value.append(b"\x89PNG")
    for bad in (no_format.SerializeToString(), b"\xff\xff not an example", None):
        arr = pa.array([_example(rng), bad], pa.large_binary())
        with pytest.raises(Exception) as columnwise:
            CODEC.encode_batch(FILE, 0, arr)
        with pytest.raises(Exception) as reference:
            _reference(arr)
        assert type(columnwise.value) is type(reference.value)


def _read_back(sample: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(sample + wd.END_OF_ARCHIVE), mode="r:") as tar:
        return [(info, tar.extractfile(info).read()) for info in tar]  # type: ignore[union-attr]


def _values(kind: str | None, feature: Any) -> list[Any]:
    return list(getattr(feature, kind).value) if kind else []


@pytest.mark.usefixtures("columnwise_only")
def test_plain_tarfile_and_numpy_read_the_examples_values_back() -> None:
    raw = _records(11, 120)
    samples = CODEC.encode_batch(FILE, 42, pa.array(raw, pa.large_binary())).to_pylist()
    members = {m.feature: m for m in CODEC.members}
    for i, (record, sample) in enumerate(zip(raw, samples, strict=True)):
        feature = Example.FromString(record).features.feature
        read = _read_back(sample)
        names = [info.name for info, _ in read]
        key = wd.sample_key(FILE, 42 + i)
        assert [n.partition(".")[2].rpartition(".")[0] for n in names] == sorted(
            m.name for m in CODEC.members if m.feature in feature
        )
        for info, data in read:
            assert (info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname) == (
                0,
                0o644,
                0,
                0,
                "",
                "",
            )
            assert info.size == len(data) and info.isreg()
            k, _, rest = info.name.partition(".")
            name, _, ext = rest.rpartition(".")
            assert k == key
            m = members[name.replace(":", "/")]
            values = _values(feature[m.feature].WhichOneof("kind"), feature[m.feature])
            if ext == "cls":
                assert int(data) == values[0]
            elif ext == "json":
                assert json.loads(data) == [v.decode() for v in values]
            elif ext == "pyd":
                assert pickle.loads(data) == values  # noqa: S301 - the test's own samples
            elif ext == "npy":
                array = np.load(io.BytesIO(data), allow_pickle=False)
                assert array.dtype == np.dtype(m.dtype)
                if m.dtype == "float64":
                    assert array.tobytes() == values[0]
                elif m.dtype == "float32":
                    want = np.array(values, np.float32)  # protobuf's floats (a NaN made quiet)
                    assert array.ravel().tobytes() == want.tobytes()
                else:
                    flat = array.ravel()
                    got = flat.tolist() if m.dtype == "bool" else flat.view(np.int64).tolist()
                    assert got == [bool(v) if m.dtype == "bool" else v for v in values]
                if m.shape != (-1,):
                    assert array.shape == m.shape
            else:
                assert data == values[0]
                if m.ext == "image":
                    fmt = feature["img/format"].bytes_list.value[0].decode()
                    assert ext == {"jpeg": "jpg"}.get(fmt, fmt)


def test_header_rows_are_tarfiles_headers() -> None:
    rng = np.random.default_rng(2)
    sizes = np.array([0, 1, 7, 8, 511, 512, 513, 8**11 - 1, *rng.integers(0, 8**11, 40)], np.int64)
    for name, ext in (("a", "cls"), ("img:height", "cls"), ("x" * 70, "npy"), ("grid", "npy")):
        template = columns._template(name, ext)
        assert template is not None
        keys = [wd.sample_key(f"file{j}", int(r)) for j, r in enumerate(rng.integers(0, 10**12, len(sizes)))]
        rows = columns._header_rows(
            template, np.frombuffer("".join(keys).encode(), np.uint8).reshape(len(keys), -1), sizes
        )
        for key, size, row in zip(keys, sizes.tolist(), rows, strict=True):
            info = tarfile.TarInfo(f"{key}.{name}.{ext}")
            info.size, info.mtime, info.mode = size, 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            assert row.tobytes() == info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    # Over 100 bytes, or not ASCII: tarfile writes a pax header first, and so does the encoder.
    assert columns._template("x" * 71, "npy") is None
    assert columns._template("naïve", "cls") is None


@pytest.mark.parametrize(
    "dtype, shape",
    [("int64", ()), ("int64", (0,)), ("bool", (3,)), ("float32", (2, 3)), ("float64", (100001,)),
     ("datetime64[D]", (1,)), ("datetime64[us]", ()), ("timedelta64[s]", (12,))],
)  # fmt: skip
def test_npy_headers_are_numpys(dtype: str, shape: tuple[int, ...]) -> None:
    array = np.arange(int(np.prod(shape)), dtype=np.int64).astype(dtype).reshape(shape)
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    assert columns._npy_header(dtype, shape) + array.tobytes() == out.getvalue()
