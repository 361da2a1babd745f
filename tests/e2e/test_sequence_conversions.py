"""Whole conversions of a clickstream into SequenceExamples: read back by tf.io against a pandas
groupby reference, the same bytes from CSV and Parquet and from one worker or two."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import dask_profiler
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from independent import file_records

from recordforge.pipelines.convert import run
from recordforge.tools.describe import format_inspect, inspect
from recordforge.tools.stats import stats

MAX_LENGTH = 30
SCHEMA = {
    "features": [
        {"name": "session", "type": "string", "nulls": "required"},
        {"name": "country", "type": "string"},
        {"name": "ts", "type": "int64", "nulls": "required"},
        {"name": "page", "type": "string"},
        {"name": "dwell", "type": "float32"},
        {"name": "items", "type": "int64", "shape": [-1]},
    ],
    "sequence": {
        "key": "session",
        "order": "ts",
        "context": ["country"],
        "max_length": MAX_LENGTH,
        "longer": "split",
    },
}


def clickstream(events: int, sessions: int, seed: int, epoch_ms: int = 1_700_000_000_000) -> pd.DataFrame:
    """Events of `sessions` sessions in random order; a session's timestamps are distinct, its
    country one value (or null for all of its events); pages, dwell times and item lists null
    at random."""
    rng = np.random.default_rng(seed)
    session = rng.integers(0, sessions, events)
    # Distinct within a session: a random permutation of all events' ranks.
    ts = rng.permutation(events).astype(np.int64) * 1000 + epoch_ms
    countries = np.array(["fr", "de", "jp", None], dtype=object)[rng.integers(0, 4, sessions)]

    def nulls(values: list, p: float) -> list:
        return [None if rng.random() < p else v for v in values]

    return pd.DataFrame(
        {
            "session": [f"s{k:06d}" for k in session],
            "country": countries[session],
            "ts": ts,
            "page": nulls([f"/p/{k}" for k in rng.integers(0, 500, events)], 0.1),
            # Multiples of 1/8: exact in float32 and in CSV text.
            "dwell": nulls([float(k) / 8 for k in rng.integers(0, 4000, events)], 0.2),
            "items": nulls(
                [[int(v) for v in rng.integers(0, 10**6, int(m))] for m in rng.integers(0, 4, events)], 0.2
            ),
        }
    )


def write_parquet(frame: pd.DataFrame, folder: Path, files: int) -> str:
    folder.mkdir()
    table = pa.Table.from_pandas(frame, preserve_index=False).cast(
        pa.schema(
            [
                ("session", pa.string()),
                ("country", pa.string()),
                ("ts", pa.int64()),
                ("page", pa.string()),
                ("dwell", pa.float32()),
                ("items", pa.list_(pa.int64())),
            ]
        )
    )
    for k, part in enumerate(np.array_split(np.arange(len(frame)), files)):
        pq.write_table(table.take(pa.array(part)), folder / f"events-{k}.parquet", row_group_size=1500)
    return str(folder / "*.parquet")


def write_csv(frame: pd.DataFrame, folder: Path, files: int) -> str:
    folder.mkdir()
    text = frame.copy()
    text["items"] = [json.dumps(v) if v is not None else None for v in text["items"]]
    for k, part in enumerate(np.array_split(np.arange(len(frame)), files)):
        text.iloc[part].to_csv(folder / f"events-{k}.csv", index=False)
    return str(folder / "*.csv")


def reference(frame: pd.DataFrame) -> dict[tuple[str, int], dict[str, Any]]:
    """pandas' groupby(key).sort_values(order), cut into chunks of MAX_LENGTH steps."""
    out = {}
    for session, group in frame.sort_values("ts").groupby("session", sort=False):
        rows = group.to_dict("records")
        for chunk, start in enumerate(range(0, len(rows), MAX_LENGTH)):
            steps = rows[start : start + MAX_LENGTH]
            out[(session, chunk)] = {
                "country": rows[0]["country"] if isinstance(rows[0]["country"], str) else None,
                "ts": [r["ts"] for r in steps],
                "page": [[] if _null(r["page"]) else [r["page"]] for r in steps],
                "dwell": [[] if _null(r["dwell"]) else [r["dwell"]] for r in steps],
                "items": [[] if _null(r["items"]) else list(r["items"]) for r in steps],
            }
    return out


def _null(value: Any) -> bool:
    """None, or pandas' NaN for a missing value."""
    return value is None or (isinstance(value, float) and value != value)


def _schema_file(tmp_path: Path) -> str:
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(SCHEMA, sort_keys=False))
    return str(path)


def read_back(output: str) -> dict[tuple[str, int], dict[str, Any]]:
    """Every sequence, read by recordforge.read (tf.io.parse_single_sequence_example)."""
    import recordforge

    out = {}
    for context, steps in recordforge.read(output):
        key = (context["session"].numpy().decode(), int(context["chunk_index"].numpy()))
        country = context["country"].values.numpy().tolist()
        assert key not in out
        out[key] = {
            "country": country[0].decode() if country else None,
            "ts": steps["ts"].numpy().tolist(),
            "page": [[v.decode() for v in s] for s in steps["page"].to_list()],
            "dwell": steps["dwell"].to_list(),
            "items": steps["items"].to_list(),
        }
    return out


def _records(output: Path) -> list[bytes]:
    meta = json.loads((output / "metadata.json").read_text())
    return [r for s in meta["shards"] for r in file_records(str(output / s["file"]), meta["compression"])]


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    return clickstream(20_000, 1_000, seed=7)


def test_clickstream_read_back_equals_pandas_groupby(events: pd.DataFrame, tmp_path: Path) -> None:
    source = write_parquet(events, tmp_path / "parquet", files=4)
    output = tmp_path / "out"
    meta = run(["--source", source, "--output", str(output), "--schema", _schema_file(tmp_path)])
    want = reference(events)
    assert meta["rows_read"] == meta["rows_written"] == len(events)
    assert meta["rows_rejected"] == 0
    assert meta["num_records"] == len(want)
    assert meta["sequence"]["key"] == ["session"]
    assert read_back(str(output)) == want
    spec = json.loads((output / "feature_spec.json").read_text())
    assert set(spec) == {"context", "sequence"}
    # Batched: fixed-shape steps padded to the batch's longest sequence, with the lengths.
    import recordforge

    context, steps, lengths = next(iter(recordforge.read(str(output), batch_size=8)))
    longest = int(lengths["ts"].numpy().max())
    assert steps["ts"].shape == (8, longest)
    assert steps["items"].shape[:2] == (8, None) and context["session"].shape == (8,)
    summary = stats(str(output), workers=1)
    assert summary["records"] == len(want) and "context features only" in summary["note"]
    assert set(summary["features"]) == {"session", "country", "chunk_index"}
    shown = format_inspect(inspect(str(output), n=1))
    assert "steps ts: FixedLenSequenceFeature int64" in shown and "ts[steps]: int64[[" in shown


def test_context_conflicts_and_short_groups_are_dead_letters(tmp_path: Path) -> None:
    frame = clickstream(2_000, 100, seed=3)
    conflicted = frame["session"] == "s000001"
    frame.loc[conflicted, "country"] = ["fr" if i % 2 else "de" for i in range(conflicted.sum())]
    source = write_parquet(frame, tmp_path / "parquet", files=2)
    schema = {**SCHEMA, "sequence": {**SCHEMA["sequence"], "min_length": 3}}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema, sort_keys=False))
    output = tmp_path / "out"
    meta = run(
        ["--source", source, "--output", str(output), "--schema", str(path), "--max_rejected_fraction", "0.5"]
    )
    sizes = frame.groupby("session").size()
    short = int(sizes[sizes < 3].sum())
    conflict = int(sizes["s000001"])
    assert meta["rejected_by_rule"] == {
        **({"sequence_min_length": short} if short else {}),
        "sequence_context": conflict,
    }
    assert meta["rows_read"] == meta["rows_written"] + meta["rows_rejected"] == len(frame)
    lines = [
        json.loads(line)
        for f in sorted(output.glob("v-*/_rejected/*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert (
        sorted(line["record"]["session"] for line in lines if line["rule"] == "sequence_context")
        == ["s000001"] * conflict
    )


def test_csv_equals_parquet_and_two_workers_equal_one(events: pd.DataFrame, tmp_path: Path) -> None:
    schema = _schema_file(tmp_path)
    flags = ["--schema", schema, "--deterministic", "--num_shards", "3"]
    # An empty CSV cell of a string column is "" (docs/schema.md): so it is in the Parquet files.
    events = events.assign(page=events["page"].fillna(""), country=events["country"].fillna(""))
    parquet = write_parquet(events, tmp_path / "parquet", files=4)
    csv = write_csv(events, tmp_path / "csv", files=3)
    run(["--source", parquet, "--output", str(tmp_path / "p"), *flags])
    run(["--source", csv, "--output", str(tmp_path / "c"), *flags])
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordforge",
            "convert",
            "--source",
            parquet,
            "--output",
            str(tmp_path / "two"),
            *flags,
            "--direct_running_mode=multi_processing",
            "--direct_num_workers=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = _records(tmp_path / "p")
    assert len(one) == len(reference(events))
    assert _records(tmp_path / "c") == one
    assert _records(tmp_path / "two") == one


def _from_tfxio(row: dict[str, Any]) -> tuple[tuple[str, int], dict[str, Any]]:
    """A row of TFXIO's record batches in the reference's form."""
    steps = row["##SEQUENCE##"]
    return (row["session"][0].decode(), row["chunk_index"][0]), {
        "country": row["country"][0].decode() if row["country"] else None,
        "ts": [s[0] for s in steps["ts"]],
        "page": [[v.decode() for v in s or []] for s in steps["page"]],
        "dwell": [s or [] for s in steps["dwell"]],
        "items": [s or [] for s in steps["items"]],
    }


def test_tfxio_reads_the_bundle_with_its_schema(tmp_path: Path) -> None:
    """schema.pbtxt is a TFMD schema that tfx-bsl's TFSequenceExampleRecord reads the shards
    with: the context at the top, the feature lists in ##SEQUENCE##."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.public import tfxio

    # Timestamps from 0: tfx-bsl 1.21's SequenceExample decoder keeps only the low 32 bits of an
    # int64 in a feature list (a protobuf-built record shows it too), a bug of its own.
    frame = clickstream(3_000, 150, seed=11, epoch_ms=0)
    source = write_parquet(frame, tmp_path / "parquet", files=2)
    output = tmp_path / "out"
    meta = run(["--source", source, "--output", str(output), "--schema", _schema_file(tmp_path)])
    schema = text_format.Parse((output / "schema.pbtxt").read_text(), schema_pb2.Schema())
    records = tfxio.TFSequenceExampleRecord(
        file_pattern=[str(output / s["file"]) for s in meta["shards"]],
        telemetry_descriptors=["recordforge-test"],
        schema=schema,
    )
    with TestPipeline() as p:
        rows = (
            p
            | records.BeamSource(batch_size=100)
            | beam.FlatMap(lambda batch: [_from_tfxio(r) for r in batch.to_pylist()])
        )
        assert_that(rows, equal_to(list(reference(frame).items())))


def _tfxio_rows(output: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """Every sequence as tfx-bsl's TFSequenceExampleRecord reads it with the bundle's schema."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx_bsl.coders import sequence_example_coder

    meta = json.loads((output / "metadata.json").read_text())
    schema = text_format.Parse((output / "schema.pbtxt").read_text(), schema_pb2.Schema())
    decoder = sequence_example_coder.SequenceExamplesToRecordBatchDecoder(
        "##SEQUENCE##", schema.SerializeToString()
    )
    records = _records(output)
    out = {}
    for start in range(0, len(records), 5000):
        for row in decoder.DecodeBatch(records[start : start + 5000]).to_pylist():
            key, value = _from_tfxio(row)
            out[key] = value
    assert len(out) == len(records) == meta["num_records"]
    return out


@pytest.mark.stress
def test_million_events_in_fifty_thousand_sessions(tmp_path: Path) -> None:
    """The issue's check: 1M events in ~50k sessions over 8 Parquet files in random order, and the
    same as CSV: read back by tf.io and by tfx-bsl, every sequence equals the pandas reference,
    and CSV gives the Parquet bytes."""
    # Timestamps from 0 (tfx-bsl keeps 32 bits of feature-list int64s); strings without nulls,
    # since an empty CSV cell of a string column is "".
    frame = clickstream(1_000_000, 50_000, seed=42, epoch_ms=0)
    frame = frame.assign(page=frame["page"].fillna(""), country=frame["country"].fillna(""))
    flags = ["--schema", _schema_file(tmp_path), "--deterministic", "--num_shards", "8"]
    parquet = write_parquet(frame, tmp_path / "parquet", files=8)
    csv = write_csv(frame, tmp_path / "csv", files=8)
    meta = run(["--source", parquet, "--output", str(tmp_path / "p"), *flags])
    run(["--source", csv, "--output", str(tmp_path / "c"), *flags])
    want = reference(frame)
    assert meta["rows_read"] == meta["rows_written"] == 1_000_000
    assert meta["num_records"] == len(want)
    assert read_back(str(tmp_path / "p")) == want
    assert _tfxio_rows(tmp_path / "p") == want
    assert _records(tmp_path / "c") == _records(tmp_path / "p")


def test_infer_schema_prints_a_sequence_block_convert_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from recordforge.cli.main import main

    source = write_parquet(clickstream(500, 20, seed=5), tmp_path / "parquet", files=2)
    assert main(["infer-schema", "--sequence_key", "session", "--sequence_order", "ts", source]) == 0
    printed = capsys.readouterr().out
    assert yaml.safe_load(printed)["sequence"] == {"key": ["session"], "order": "ts"}
    schema = tmp_path / "inferred.yaml"
    schema.write_text(printed)
    meta = run(["--source", source, "--output", str(tmp_path / "out"), "--schema", str(schema)])
    assert meta["num_records"] == 20 and meta["rows_written"] == 500


def test_shuffle_permutes_whole_sequences_deterministically(tmp_path: Path) -> None:
    frame = clickstream(3_000, 200, seed=9)
    source = write_parquet(frame, tmp_path / "parquet", files=2)
    flags = ["--source", source, "--schema", _schema_file(tmp_path), "--num_shards", "2"]
    run([*flags, "--output", str(tmp_path / "plain"), "--deterministic"])
    run([*flags, "--output", str(tmp_path / "a"), "--shuffle", "--seed", "7"])
    run([*flags, "--output", str(tmp_path / "b"), "--shuffle", "--seed", "7"])
    plain, shuffled = _records(tmp_path / "plain"), _records(tmp_path / "a")
    assert shuffled == _records(tmp_path / "b")
    assert sorted(shuffled) == sorted(plain) and shuffled != plain


def test_a_dask_run_writes_what_a_local_run_writes(tmp_path: Path) -> None:
    import dask
    from distributed import LocalCluster

    frame = clickstream(4_000, 300, seed=13)
    source = write_parquet(frame, tmp_path / "parquet", files=3)
    flags = ["--source", source, "--schema", _schema_file(tmp_path), "--deterministic", "--num_shards", "3"]
    run([*flags, "--output", str(tmp_path / "local")])
    with (
        dask.config.set(dask_profiler.CONFIG),
        LocalCluster(
            processes=True, n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        ) as cluster,
    ):
        dask = ["--runner", "DaskRunner", "--dask_client_address", cluster.scheduler_address]
        run([*flags, "--output", str(tmp_path / "dask"), *dask])
    assert _records(tmp_path / "dask") == _records(tmp_path / "local")


def test_an_empty_input_publishes_no_sequences(tmp_path: Path) -> None:
    source = write_parquet(clickstream(10, 2, seed=1).iloc[:0], tmp_path / "parquet", files=1)
    meta = run(["--source", source, "--output", str(tmp_path / "out"), "--schema", _schema_file(tmp_path)])
    assert (meta["rows_read"], meta["rows_written"], meta["num_records"]) == (0, 0, 0)


def test_splits_hash_the_key_and_split_flags_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    from recordforge.errors import UsageError

    frame = clickstream(2_000, 100, seed=17)
    source = write_parquet(frame, tmp_path / "parquet", files=2)
    flags = ["--source", source, "--schema", _schema_file(tmp_path), "--splits", "train=1,test=1"]
    meta = run([*flags, "--output", str(tmp_path / "out")])
    counts = meta["split_counts"]
    assert counts["train"]["records"] + counts["test"]["records"] == meta["num_records"]
    assert counts["train"]["records"] and counts["test"]["records"]
    import recordforge

    sessions = {
        split: {
            c["session"].numpy().decode() for c, _ in recordforge.read(str(tmp_path / "out"), split=split)
        }
        for split in ("train", "test")
    }
    assert not sessions["train"] & sessions["test"]
    for extra in (
        ["--split_key", "session"],
        ["--split_column", "country"],
        ["--output_format", "array_record", "--compression", "none"],
        ["--record_index"],
    ):
        with pytest.raises(UsageError, match="sequence"):
            run([*flags, *extra, "--output", str(tmp_path / "refused")])


def test_a_strict_run_publishes_with_keep_last_and_writes_its_dead_letters(tmp_path: Path) -> None:
    """Rows `longer: keep_last` leaves out are dead letters that neither fail a strict run (no
    --max_rejected) nor count against its bound."""
    frame = clickstream(3_000, 40, seed=21)
    source = write_parquet(frame, tmp_path / "parquet", files=2)
    schema = {**SCHEMA, "sequence": {**SCHEMA["sequence"], "longer": "keep_last"}}
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump(schema, sort_keys=False))
    output = tmp_path / "out"
    meta = run(["--source", source, "--output", str(output), "--schema", str(path)])
    sizes = frame.groupby("session").size()
    dropped = int((sizes - MAX_LENGTH).clip(lower=0).sum())
    assert dropped and meta["rejected_by_rule"] == {"sequence_keep_last": dropped}
    assert meta["num_records"] == len(sizes) and meta["rows_written"] == len(frame) - dropped
    lines = [line for f in output.glob("v-*/_rejected/*.jsonl") for line in f.read_text().splitlines()]
    assert len(lines) == dropped
