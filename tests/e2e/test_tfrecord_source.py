"""TFRecord and ArrayRecord in (issue 59 part 1): a gzip bundle of every type converts to ArrayRecord,
to uncompressed TFRecord and to 3 splits with every record byte-identical, read back by tf.data,
ArrayRecord's own reader and protobuf; Examples of another writer convert with an inferred
schema; a record that is not an Example of the schema is a dead letter naming file and record; a
CRC error fails naming file and record, or skips the rest; one large file is read as record
ranges by two workers."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from conftest import example_to_dict, published_root, tf_raw_records
from test_table_formats import ARROW_TYPES, _rows

from recordforge.pipelines.convert import DEFAULT_RUNNER, run
from recordforge.records import record_pieces
from recordforge.records.chunks import read_record_chunks
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.encoding import ExampleEncoder
from recordforge.records.example_batches import ExampleDecoder
from recordforge.runners.session import runner_traits
from recordforge.schemas import compile_schema, load_schema
from recordforge.transforms.record_source import ReadRecords


def _tf_read(output: Path) -> list[bytes]:
    """Every record of a TFRecord bundle, by tf.data alone."""

    meta = json.loads((output / "metadata.json").read_text())
    files = [str(output / s["file"]) for s in meta["shards"]]
    return tf_raw_records(files, meta["tf_compression_type"])


def _array_record_read(output: Path) -> list[bytes]:
    """Every record of an ArrayRecord bundle, by array_record's own reader."""
    from array_record.python.array_record_module import ArrayRecordReader

    meta = json.loads((output / "metadata.json").read_text())
    out: list[bytes] = []
    for s in meta["shards"]:
        reader = ArrayRecordReader(str(output / s["file"]))
        out += reader.read(0, reader.num_records())
        reader.close()
    return out


def _frame(payload: bytes) -> bytes:
    head = struct.pack("<Q", len(payload))
    return head + struct.pack("<I", masked_crc32c(head)) + payload + struct.pack("<I", masked_crc32c(payload))


@pytest.fixture(scope="module")
def gzip_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    """An every-type table converted to gzip TFRecords, and its records as tf.data reads them."""
    tmp = tmp_path_factory.mktemp("bundle")
    pq.write_table(pa.Table.from_pylist(_rows(400), pa.schema(ARROW_TYPES)), tmp / "t.parquet")
    run(["--source", str(tmp / "t.parquet"), "--output", str(tmp / "gz"), "--compression", "gzip"])
    records = _tf_read(tmp / "gz")
    assert len(records) == 400
    return tmp / "gz", records


@pytest.mark.parametrize("output_format", ["array_record", "tfrecord"])
def test_a_gzip_bundle_converts_with_every_record_byte_identical(
    tmp_path: Path, gzip_bundle: tuple[Path, list[bytes]], output_format: str
) -> None:
    bundle, source = gzip_bundle
    out = tmp_path / "out"
    args = ["--output_format", output_format, "--compression", "none", "--deterministic"]
    meta = run(["--source", str(bundle), "--output", str(out), *args])
    assert (meta["source_format"], meta["rows_read"], meta["rows_written"]) == ("tfrecord", 400, 400)
    got = _array_record_read(out) if output_format == "array_record" else _tf_read(out)
    assert sorted(got) == sorted(source)
    # The bundle's schema comes through unchanged: the same features, the same feature spec.
    root = published_root(bundle)
    assert json.loads((out / "feature_spec.json").read_text()) == json.loads(
        (root / "feature_spec.json").read_text()
    )


def test_re_encoding_reproduces_recordforge_records(gzip_bundle: tuple[Path, list[bytes]]) -> None:
    """Without pass-through, the decoded columns encoded again in the plan's order give the very
    bytes RecordForge wrote (so a record re-encoded for a changed feature differs only there)."""
    bundle, source = gzip_bundle
    plan = compile_schema(load_schema(str(published_root(bundle) / "schema.yaml")))
    decoder, encoder = ExampleDecoder(plan), ExampleEncoder(plan)
    again: list[bytes] = []
    for shard in sorted(published_root(bundle).glob("data-*")):
        for chunk in read_record_chunks(str(shard)):
            decoded = decoder.decode(chunk.data, chunk.starts, chunk.ends)
            assert decoded.bad == [] and decoded.records.null_count == 0
            again += encoder.encode(decoded.batch).to_pylist()
    assert again == source


def test_three_splits_by_a_key_feature(tmp_path: Path, gzip_bundle: tuple[Path, list[bytes]]) -> None:
    bundle, source = gzip_bundle
    out = tmp_path / "out"
    splits = ["--splits", "train=8,validation=1,test=1", "--split_key", "id", "--compression", "gzip"]
    meta = run(["--source", str(bundle), "--output", str(out), *splits])
    assert meta["rows_written"] == 400
    by_split: dict[str, list[bytes]] = {}
    for name in ("train", "validation", "test"):
        shards = [s for s in meta["shards"] if s["split"] == name]
        by_split[name] = [r for s in shards for r in _tf_read_files([out / s["file"]])]
        assert by_split[name], name
    assert sorted(r for rs in by_split.values() for r in rs) == sorted(source)
    # A key's records stay in one split: the same id never lands in two.
    ids = {n: {example_to_dict(r)["id"][0] for r in rs} for n, rs in by_split.items()}
    assert not (ids["train"] & ids["validation"]) and not (ids["train"] & ids["test"])


def _tf_read_files(files: list[Path]) -> list[bytes]:
    return tf_raw_records([str(f) for f in files], "GZIP")


def _foreign_examples(n: int) -> list[bytes]:
    """Examples written by TensorFlow's own protobuf classes, not by RecordForge."""
    import tensorflow as tf

    out = []
    for i in range(n):
        feature = {
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            "score": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 4, -i])),
            "name": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"n{i}".encode(), b"\xff"])),
        }
        if i % 3:
            feature["tags"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"t"] * (i % 4)))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out


def test_foreign_examples_convert_with_an_inferred_schema(tmp_path: Path) -> None:
    import tensorflow as tf

    records = _foreign_examples(50)
    with tf.io.TFRecordWriter(str(tmp_path / "x.tfrecord")) as w:
        for r in records:
            w.write(r)
    out = tmp_path / "out"
    meta = run(["--source", str(tmp_path / "x.tfrecord"), "--output", str(out), "--compression", "none"])
    assert (meta["rows_read"], meta["rows_written"]) == (50, 50)
    assert sorted(_tf_read(out)) == sorted(records)  # every feature fits: passed through
    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["id"] == {"kind": "FixedLenFeature", "dtype": "int64", "shape": []}
    assert spec["score"]["shape"] == [2] and spec["tags"]["kind"] == "VarLenFeature"


def test_a_record_not_of_the_schema_is_a_dead_letter_naming_file_and_record(tmp_path: Path) -> None:
    import tensorflow as tf

    records = _foreign_examples(20)
    good_schema = tmp_path / "s.yaml"
    good_schema.write_text(
        "features:\n"
        "  - {name: id, type: int64, nulls: required}\n"
        "  - {name: score, type: float32, shape: [2]}\n"
        "  - {name: name, type: bytes, shape: [-1]}\n"
    )
    bad = dict(enumerate(records))
    bad[4] = b"\x0a\xff\xff"  # not a tf.train.Example
    wrong = tf.train.Example()
    wrong.features.feature["id"].float_list.value.append(1.5)  # the schema says int64
    bad[9] = wrong.SerializeToString()
    short = tf.train.Example.FromString(records[13])
    del short.features.feature["score"].float_list.value[1]  # shape [2] needs two values
    bad[13] = short.SerializeToString()
    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"".join(_frame(bad[i]) for i in range(20)))
    args = ["--source", str(path), "--schema", str(good_schema)]
    with pytest.raises(Exception, match=r"x.tfrecord, row 5, column '\*'.*\[rule: example\]"):
        run([*args, "--output", str(tmp_path / "strict")])
    out = tmp_path / "out"
    meta = run([*args, "--output", str(out), "--max_rejected", "5", "--compression", "none"])
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (20, 17, 3)
    lines = [
        json.loads(x)
        for f in (published_root(out) / "_rejected").glob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    got = sorted((r["file"], r["row"], r["column"], r["rule"]) for r in lines)
    assert got == [
        (str(path), 5, "*", "example"),
        (str(path), 10, "id", "example"),
        (str(path), 14, "score", "example"),
    ]
    assert "float_list" in next(r["reason"] for r in lines if r["row"] == 10)
    # The records that fit keep their features the schema names (tags is not among them).
    written = sorted(example_to_dict(r)["id"][0] for r in _tf_read(out))
    assert written == [i for i in range(20) if i not in (4, 9, 13)]


def test_a_crc_error_names_file_and_record_and_fails_or_skips(tmp_path: Path) -> None:
    records = _foreign_examples(30)
    data = bytearray(b"".join(_frame(r) for r in records))
    at = sum(len(_frame(r)) for r in records[:11]) + 12 + 3  # inside record 12's payload
    data[at] ^= 0x40
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tfrecord").write_bytes(bytes(data))
    (tmp_path / "src" / "b.tfrecord").write_bytes(b"".join(_frame(r) for r in records))
    args = ["--source", str(tmp_path / "src" / "*.tfrecord")]
    with pytest.raises(Exception, match=r"a.tfrecord: record 12: data CRC mismatch"):
        run([*args, "--output", str(tmp_path / "o1")])
    meta = run([*args, "--output", str(tmp_path / "o2"), "--skip_unreadable_files"])
    assert [(u["file"], u["error"]) for u in meta["unreadable_files"]] == [
        (str(tmp_path / "src" / "a.tfrecord"), "record 12: data CRC mismatch")
    ]
    assert (meta["rows_read"], meta["rows_written"]) == (41, 41)  # 11 before it, and all of b


def _large_file(tmp_path: Path, n: int) -> tuple[Path, list[bytes]]:
    rng = np.random.default_rng(7)
    import tensorflow as tf

    records = []
    for i in range(n):
        ex = tf.train.Example()
        ex.features.feature["id"].int64_list.value.append(i)
        ex.features.feature["blob"].bytes_list.value.append(rng.bytes(int(rng.integers(10, 300))))
        records.append(ex.SerializeToString())
    path = tmp_path / "big.tfrecord"
    path.write_bytes(b"".join(_frame(r) for r in records))
    return path, records


STOCK_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


@pytest.mark.parametrize(
    ("runner", "options"),
    [
        (DEFAULT_RUNNER, {"direct_num_workers": 2, "direct_running_mode": "multi_processing"}),
        (STOCK_RUNNER, {"direct_num_workers": 2}),
    ],
    ids=["share", "spread"],
)
def test_a_large_file_is_read_as_record_ranges_by_two_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str, options: dict[str, Any]
) -> None:
    """Two workers read one large TFRecord file as several record ranges (the
    `record_work_items` metric), which together give each record once, at its own number."""
    path, records = _large_file(tmp_path, 3000)
    size = path.stat().st_size
    monkeypatch.setattr(record_pieces, "SPLIT_BYTES", size // 2)
    monkeypatch.setattr(record_pieces, "PIECE_BYTES", size // 8)
    pieces = record_pieces.pieces(str(path), size)
    assert len(pieces) >= 6 and [p.first_record for p in pieces] == sorted({p.first_record for p in pieces})
    schema = tmp_path / "s.yaml"
    schema.write_text(
        "features:\n  - {name: id, type: int64, nulls: required}\n  - {name: blob, type: bytes}\n"
    )
    plan = compile_schema(load_schema(str(schema)))
    p = beam.Pipeline(runner=runner, options=PipelineOptions(flags=[], **options))
    traits = runner_traits(PipelineOptions(flags=[f"--runner={runner}"], **options))
    read = p | ReadRecords([str(path)], plan, batch_size=128, traits=traits)
    # (record number, id, digest of the bytes passed through) of each record read
    got = read["batches"] | beam.FlatMap(
        lambda b: [
            (b.first_row + i, v, hashlib.sha256(r).hexdigest())
            for i, (v, r) in enumerate(
                zip(b.batch.column("id").to_pylist(), b.records.to_pylist(), strict=True)
            )
        ]
    )
    assert_that(got, equal_to([(i, i, hashlib.sha256(r).hexdigest()) for i, r in enumerate(records)]))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(MetricsFilter().with_name("record_work_items"))["counters"]
    assert sum(c.committed for c in counters) == len(pieces)


def test_append_and_shuffle_over_record_files(tmp_path: Path) -> None:
    """Day 1 converts a.tfrecord; day 2 adds b.tfrecord and --append converts only it (the day-1
    shard kept); a --shuffle run of both holds the same records."""
    records = _foreign_examples(40)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.tfrecord").write_bytes(b"".join(_frame(r) for r in records[:25]))
    args = ["--source", str(tmp_path / "src" / "*.tfrecord"), "--compression", "none"]
    first = run([*args, "--output", str(tmp_path / "out"), "--append"])
    assert first["rows_written"] == 25
    old = {s["file"]: (tmp_path / "out" / s["file"]).stat().st_ino for s in first["shards"]}
    (tmp_path / "src" / "b.tfrecord").write_bytes(b"".join(_frame(r) for r in records[25:]))
    second = run([*args, "--output", str(tmp_path / "out"), "--append"])
    assert second["appended"]["converted"]["rows_read"] == 15 and second["rows_written"] == 40
    assert {
        s["file"]: (tmp_path / "out" / s["file"]).stat().st_ino for s in second["shards"] if s["file"] in old
    } == old
    assert sorted(_tf_read(tmp_path / "out")) == sorted(records)
    shuffled = run([*args, "--output", str(tmp_path / "shuffled"), "--shuffle"])
    assert shuffled["rows_written"] == 40 and sorted(_tf_read(tmp_path / "shuffled")) == sorted(records)


def test_rows_after_a_rejected_record_keep_their_numbers(tmp_path: Path) -> None:
    """A record over --max_record_bytes after a dead letter names its own number in its file."""
    import tensorflow as tf

    records = _foreign_examples(12)
    records[2] = b"\x0a\xff\xff"  # a dead letter before the rows that follow
    big = tf.train.Example.FromString(records[7])
    big.features.feature["name"].bytes_list.value.append(b"x" * 500)
    records[7] = big.SerializeToString()
    path = tmp_path / "x.tfrecord"
    path.write_bytes(b"".join(_frame(r) for r in records))
    schema = tmp_path / "s.yaml"
    schema.write_text(
        "features:\n  - {name: id, type: int64, nulls: required}\n"
        "  - {name: name, type: bytes, shape: [-1]}\n"
    )
    args = ["--schema", str(schema), "--max_rejected", "5", "--max_record_bytes", "300"]
    meta = run(["--source", str(path), "--output", str(tmp_path / "o"), *args])
    root = published_root(tmp_path / "o")
    lines = [json.loads(x) for f in (root / "_rejected").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert sorted((r["row"], r["column"], r["rule"]) for r in lines) == [
        (3, "*", "example"),
        (8, "name", "record_size"),
    ]
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (12, 10, 2)
