"""--output_format webdataset (issue 58): every type read back by the `webdataset` package's default
decoders and by plain `tarfile`, compared with the source; the samples are the TFRecord bundle's
Examples exactly; the same flags give the same bytes; splits, shuffle, images, two loader
processes; crash points in tests/e2e/test_crash_points.py."""

from __future__ import annotations

import datetime as dt
import decimal
import hashlib
import io
import json
import multiprocessing
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from recordforge.pipelines.convert import run
from recordforge.records import webdataset as wd
from recordforge.records.tfrecord import iter_records

wds = pytest.importorskip("webdataset")

_UTC = dt.timezone.utc
N = 40


def _table() -> tuple[pa.Table, list[dict[str, Any]]]:
    """A table of every type the schema language has (a null in every nullable column each 5th
    row), and the schema declaring it."""
    rng = np.random.default_rng(58)
    rows = []
    for i in range(N):
        null = i % 5 == 4
        n = int(rng.integers(0, 4))
        rows.append(
            {
                "id": i,
                "i": None if null else [0, -1, 2**63 - 1, -(2**63), int(rng.integers(-99, 99))][i % 5],
                "f": None if null else float(np.float32(rng.normal())),
                "f32": None if null else float(np.float32([0.0, -0.0, np.inf, 1e-40, rng.normal()][i % 5])),
                "exact": None if null else [0.1, -1e300, 5e-324, float("nan"), float(rng.normal())][i % 5],
                "b": None if null else bool(i % 2),
                "s": None if null else ["", "héllo", 'a,b\n"c"', "x" * n][i % 4],
                "raw": None
                if null
                else [b"", b"\xff\x00", bytes(rng.integers(0, 256, 5, dtype=np.uint8))][i % 3],
                "day": None
                if null
                else dt.date(1970, 1, 1) + dt.timedelta(days=int(rng.integers(-9999, 40000))),
                "at": None
                if null
                else dt.datetime(2001, 2, 3, tzinfo=_UTC)
                + dt.timedelta(microseconds=int(rng.integers(-(10**15), 10**15))),
                "tod": None if null else dt.time(int(rng.integers(0, 24)), int(rng.integers(0, 60)), i % 60),
                "price": None if null else decimal.Decimal(int(rng.integers(-(10**9), 10**9))).scaleb(-2),
                "cents": None if null else decimal.Decimal(int(rng.integers(-(10**9), 10**9))).scaleb(-2),
                "nums": None if null else [int(x) for x in rng.integers(-100, 100, n)],
                "vals": None if null else [float(np.float32(x)) for x in rng.normal(size=n)],
                "tags": None if null else [f"t{x}é" for x in range(n)],
                "blobs": None if null else [bytes([x, 0, 255]) for x in range(n)],
                "pair": None if null else [float(np.float32(x)) for x in rng.normal(size=2)],
                "grid": None if null else [[int(x) for x in rng.integers(-9, 9, 3)] for _ in range(2)],
                "wide": None if null else [float(x) for x in rng.normal(size=2)],
                "rag": None
                if null
                else [[int(x) for x in rng.integers(0, 9, int(k))] for k in rng.integers(0, 3, n)],
            }
        )
    types = {
        "id": pa.int64(), "i": pa.int64(), "f": pa.float64(), "f32": pa.float32(), "exact": pa.float64(),
        "b": pa.bool_(), "s": pa.string(), "raw": pa.binary(), "day": pa.date32(),
        "at": pa.timestamp("us", tz="UTC"), "tod": pa.time32("s"), "price": pa.decimal128(18, 2),
        "cents": pa.decimal128(18, 2), "nums": pa.list_(pa.int64()), "vals": pa.list_(pa.float32()),
        "tags": pa.list_(pa.string()), "blobs": pa.list_(pa.binary()), "pair": pa.list_(pa.float32(), 2),
        "grid": pa.list_(pa.list_(pa.int64(), 3), 2), "wide": pa.list_(pa.float64(), 2),
        "rag": pa.list_(pa.list_(pa.int64())),
    }  # fmt: skip
    features = [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "i", "type": "int64"},
        {"name": "f", "type": "float64", "narrow": True},
        {"name": "f32", "type": "float32"},
        {"name": "exact", "type": "float64", "encode": "bytes"},
        {"name": "b", "type": "bool"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "day", "type": "date"},
        {"name": "at", "type": "timestamp", "unit": "us"},
        {"name": "tod", "type": "time", "unit": "s"},
        {"name": "price", "type": "decimal", "as": "string"},
        {"name": "cents", "type": "decimal", "as": "scaled_int", "scale": 2},
        {"name": "nums", "type": "int64", "shape": [-1]},
        {"name": "vals", "type": "float32", "shape": [-1]},
        {"name": "tags", "type": "string", "shape": [-1]},
        {"name": "blobs", "type": "bytes", "shape": [-1]},
        {"name": "pair", "type": "float32", "shape": [2]},
        {"name": "grid", "type": "int64", "shape": [2, 3]},
        {"name": "wide", "type": "float64", "shape": [2], "encode": "bytes"},
        {"name": "rag", "type": "int64", "shape": [-1, -1]},
    ]
    return pa.Table.from_pylist(rows, pa.schema(types)), features


def _expected(name: str, v: Any) -> tuple[str, Any]:
    """(member extension, value the default decoders must give) of a source value."""
    if name in ("id", "i", "cents"):
        return "cls", int(v.scaleb(2)) if name == "cents" else v
    if name in ("s", "price"):
        return "txt", str(v)
    if name == "raw":
        return "bin", v
    if name == "tags":
        return "json", v
    if name == "blobs":
        return "pyd", v
    array = {
        "f": lambda: np.float32(v),
        "f32": lambda: np.float32(v),
        "exact": lambda: np.float64(v),
        "b": lambda: np.bool_(v),
        "day": lambda: np.datetime64(v, "D"),
        "at": lambda: np.datetime64(v.replace(tzinfo=None), "us"),
        "tod": lambda: np.timedelta64((v.hour * 60 + v.minute) * 60 + v.second, "s"),
        "nums": lambda: np.array(v, np.int64),
        "vals": lambda: np.array(v, np.float32),
        "pair": lambda: np.array(v, np.float32),
        "grid": lambda: np.array(v, np.int64),
        "wide": lambda: np.array(v, np.float64),
        "rag": lambda: np.array([x for row in v for x in row], np.int64),
    }[name]()
    return "npy", np.asarray(array)


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == want.dtype
            and got.shape == want.shape
            and got.tobytes() == want.tobytes()  # bit for bit: -0.0, nan, subnormals
        )
    return type(got) is type(want) and got == want


def _convert(tmp_path: Path, name: str, *flags: str, fmt: str = "webdataset") -> tuple[Path, dict]:
    table, features = _table()
    if not (tmp_path / "t.parquet").exists():
        pq.write_table(table, tmp_path / "t.parquet", row_group_size=16)
        (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"features": features}))
    out = tmp_path / name
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    meta = run([*argv, "--output", str(out), "--output_format", fmt, *flags])
    return out, meta


def _urls(out: Path, meta: dict) -> list[str]:
    return [str(out / s["file"]) for s in meta["shards"]]


def test_every_type_decodes_with_webdataset_defaults_to_the_source_values(tmp_path: Path) -> None:
    out, meta = _convert(tmp_path, "wds", "--deterministic", "--num_shards", "3")
    assert meta["format"] == "webdataset" and meta["num_records"] == N
    assert all(s["file"].endswith(".tar") for s in meta["shards"])
    rows = _table()[0].to_pylist()
    samples = list(wds.WebDataset(_urls(out, meta), shardshuffle=False).decode())
    assert len(samples) == N
    seen = set()
    for sample in samples:
        rec = rows[sample["id.cls"]]
        seen.add(rec["id"])
        members = {k for k in sample if not k.startswith("__")}
        want = {}
        for name, value in rec.items():
            if value is not None:
                ext, expect = _expected(name, value)
                want[f"{name}.{ext}"] = expect
        if rec["rag"] is not None:
            want["rag.row_lengths.npy"] = np.array([len(r) for r in rec["rag"]], np.int64)
        assert members == set(want), rec["id"]  # an absent feature has no member
        for key, expect in want.items():
            assert _same(sample[key], expect), (rec["id"], key, sample[key], expect)
    assert seen == set(range(N))


def test_samples_are_the_tfrecord_bundles_examples_and_plain_tarfile_reads_them(tmp_path: Path) -> None:
    flags = ("--deterministic", "--num_shards", "2")
    wds_out, wds_meta = _convert(tmp_path, "wds", *flags)
    tf_out, tf_meta = _convert(tmp_path, "tf", *flags, "--compression", "none", fmt="tfrecord")
    checked: dict[str, dict[str, Any]] = {}
    for w, t in zip(wds_meta["shards"], tf_meta["shards"], strict=True):
        examples = [e for _, e in wd.read_examples(str(wds_out / w["file"]))]
        assert examples == list(iter_records(str(tf_out / t["file"]), "none"))
        data = (wds_out / w["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == w["sha256"] and len(data) == w["bytes"]
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            infos = tar.getmembers()
            keys = [m.name.split(".", 1)[0] for m in infos]
            assert len(dict.fromkeys(keys)) == w["records"]
            for m in infos:
                assert (m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) == (0, 0, 0, "", "", 0o644)
                assert m.isreg()
            # Members of a sample in name order, samples in the order of their records.
            by_key: dict[str, list[str]] = {}
            for m in infos:
                by_key.setdefault(m.name.split(".", 1)[0], []).append(m.name)
            assert all(names == sorted(names) for names in by_key.values())
            # Every member decoded by hand (no webdataset) equals the source's value.
            for m in infos:
                handle = tar.extractfile(m)
                assert handle is not None
                got = _by_hand(m.name.rsplit(".", 1)[1], handle.read())
                checked.setdefault(m.name.split(".", 1)[0], {})[m.name.split(".", 1)[1]] = got
    rows = {r["id"]: r for r in _table()[0].to_pylist()}
    assert len(checked) == N
    for members in checked.values():
        rec = rows[members["id.cls"]]
        for member, got in members.items():
            name = member.rsplit(".", 1)[0]
            if name == "rag.row_lengths":
                assert _same(got, np.array([len(r) for r in rec["rag"]], np.int64))
            else:
                assert _same(got, _expected(name, rec[name])[1]), (rec["id"], member)


def _by_hand(ext: str, data: bytes) -> Any:
    if ext == "cls":
        return int(data)
    if ext == "txt":
        return data.decode()
    if ext == "json":
        return json.loads(data)
    if ext == "pyd":
        return pickle.loads(data)
    if ext == "npy":
        return np.load(io.BytesIO(data))
    return data


def test_the_same_flags_give_the_same_bytes(tmp_path: Path) -> None:
    a, meta_a = _convert(tmp_path, "a", "--shuffle", "--num_shards", "2", "--splits", "train=3,eval=1")
    b, meta_b = _convert(tmp_path, "b", "--shuffle", "--num_shards", "2", "--splits", "train=3,eval=1")
    shas = [(s["file"].split("/", 1)[1], s["sha256"]) for s in meta_a["shards"]]
    assert shas == [(s["file"].split("/", 1)[1], s["sha256"]) for s in meta_b["shards"]]
    assert {s["split"] for s in meta_a["shards"]} == {"train", "eval"}
    by_split: dict[str, list[int]] = {}
    for s in meta_a["shards"]:
        ids = [x["id.cls"] for x in wds.WebDataset(str(a / s["file"]), shardshuffle=False).decode()]
        by_split.setdefault(s["split"], []).extend(ids)
    assert sorted(by_split["train"] + by_split["eval"]) == list(range(N))
    assert by_split["train"] != sorted(by_split["train"])  # shuffled


def _ids(urls: list[str]) -> list[int]:
    return [s["id.cls"] for s in wds.WebDataset(urls, shardshuffle=False).decode()]


def test_two_loader_processes_see_every_record_once(tmp_path: Path) -> None:
    out, meta = _convert(tmp_path, "wds", "--records_per_shard", "7")
    urls = _urls(out, meta)
    assert len(urls) == 6
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        seen = pool.map(_ids, [urls[0::2], urls[1::2]])
    assert sorted(seen[0] + seen[1]) == list(range(N))


def test_images_keep_their_bytes_and_parts(tmp_path: Path) -> None:
    from PIL import Image

    (tmp_path / "img").mkdir()
    raw = {}
    rng = np.random.default_rng(1)
    for name, fmt in (("a.png", "PNG"), ("b.jpg", "JPEG")):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (5, 4, 3), dtype=np.uint8)).save(buf, format=fmt)
        (tmp_path / "img" / name).write_bytes(buf.getvalue())
        raw[name] = buf.getvalue()
    table = pa.table({"path": [str(tmp_path / "img" / n) for n in raw], "n": [0, 1]})
    pq.write_table(table, tmp_path / "m.parquet")
    schema = {
        "features": [{"name": "image", "type": "image", "column": "path"}, {"name": "n", "type": "int64"}]
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(schema))
    out = tmp_path / "out"
    meta = run(["--source", str(tmp_path / "m.parquet"), "--schema", str(tmp_path / "s.yaml"),
                "--output", str(out), "--output_format", "webdataset"])  # fmt: skip
    samples = sorted(wds.WebDataset(_urls(out, meta), shardshuffle=False).decode(), key=lambda s: s["n.cls"])
    assert samples[0]["image.png"] == raw["a.png"] and samples[1]["image.jpg"] == raw["b.jpg"]
    assert (samples[0]["image:height.cls"], samples[0]["image:width.cls"]) == (5, 4)
    assert samples[1]["image:format.txt"] == "jpeg"
    croissant = json.loads((out / "croissant.json").read_text())
    assert {d["encodingFormat"] for d in croissant["distribution"]} == {"application/x-tar"}


def test_sequences_and_transforms_are_refused_in_one_line(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": pa.array([1.0, 2.0], pa.float32())}), tmp_path / "t.parquet")
    schema = {"features": [{"name": "x", "type": "float32", "transform": {"scale_to_z_score": {}}}]}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(schema))
    with pytest.raises(Exception, match="webdataset.*not with transforms"):
        run(["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "s.yaml"),
             "--output", str(tmp_path / "o"), "--output_format", "webdataset"])  # fmt: skip
    with pytest.raises(Exception, match="--compression none"):
        run(["--source", str(tmp_path / "t.parquet"), "--output", str(tmp_path / "o"),
             "--output_format", "webdataset", "--compression", "gzip"])  # fmt: skip


def test_a_corrupt_member_fails_verify_naming_its_sample(tmp_path: Path) -> None:
    from recordforge.records.webdataset import example_of

    with pytest.raises(ValueError):
        example_of([("x", "npy", b"not an npy")])
    with pytest.raises(Exception, match="names"):
        example_of([("x", "pyd", pickle.dumps([np.int64(1)]))])  # a global: never unpickled


def test_append_adds_samples_and_tf_data_refuses_in_one_line(tmp_path: Path) -> None:
    import recordforge

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": list(range(10))}), tmp_path / "in" / "a.parquet")
    argv = ["--source", str(tmp_path / "in" / "*.parquet"), "--output", str(tmp_path / "out")]
    run([*argv, "--output_format", "webdataset"])
    pq.write_table(pa.table({"id": list(range(10, 15))}), tmp_path / "in" / "b.parquet")
    meta = run([*argv, "--output_format", "webdataset", "--append"])
    assert meta["num_records"] == 15
    assert sorted(_ids(_urls(tmp_path / "out", meta))) == list(range(15))
    with pytest.raises(Exception, match="WebDataset tar shards, which tf.data does not read"):
        recordforge.read(str(tmp_path / "out"))
