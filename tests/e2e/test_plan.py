"""`recordforge plan`: the estimate within 15% of what `convert` then writes, rows exact from Parquet
footers, the footers alone read for many files, and the same refusals as a run."""

from __future__ import annotations

import datetime
import decimal
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import recordforge
from bench.table import make_table
from demo.sampledata import mnist_folder
from recordforge.errors import RecordForgeError

_CLOSE = 0.15


def _close(estimated: float | None, actual: float) -> bool:
    return estimated is not None and abs(estimated - actual) <= _CLOSE * max(actual, 1)


def _check(plan: dict[str, Any], meta: dict[str, Any], *, rows_exact: bool) -> None:
    """Per split: rows (exact, or within 15%), output bytes and shard count within 15% of what
    the conversion wrote."""
    splits = meta.get("split_counts") or {"data": {"records": meta["num_records"]}}
    by_split: dict[str, list[dict[str, Any]]] = {}
    for shard in meta["shards"]:
        name = shard["file"].split("/")[1] if meta.get("split_counts") else "data"
        by_split.setdefault(name, []).append(shard)
    assert {s["name"] for s in plan["splits"]} == set(splits)
    total = meta["rows_read"]
    assert plan["rows"] == total if rows_exact else _close(plan["rows"], total), (plan["rows"], total)
    for split in plan["splits"]:
        shards = by_split.get(split["name"], [])
        wrote = sum(s["bytes"] for s in shards)
        records = splits[split["name"]]["records"]
        assert _close(split["rows"], records), (split, records)
        assert _close(split["output_bytes"], wrote), (split, wrote)
        assert _close(split["shards"], len(shards)), (split, len(shards))


def _plan_then_convert(
    source: str, out: Path, *, schema: str | None = None, **flags: Any
) -> tuple[dict, dict]:
    plan = recordforge.plan(source, str(out), schema, **flags)
    assert not out.exists(), "plan wrote into the output"
    meta = recordforge.convert(source, str(out), schema, **flags)
    # Recorded beside the run: its own estimate, from a smaller sample than plan's.
    estimated = meta["estimated"]
    assert estimated["rows"] == plan["rows"] and _close(estimated["output_bytes"], plan["output_bytes"])
    return plan, meta


def test_the_bench_table(tmp_path: Path) -> None:
    src = tmp_path / "bench.parquet"
    pq.write_table(make_table(300_000), src, row_group_size=50_000)
    plan, meta = _plan_then_convert(str(src), tmp_path / "out", shard_size="4MB")
    assert plan["work_items"] == 6 and meta["num_records"] == 300_000
    assert len(meta["shards"]) > 5
    _check(plan, meta, rows_exact=True)


def _every_type(repeat: int) -> pa.Table:
    n = 6
    base = pa.table(
        {
            "i8": pa.array([1, -2, 3, -4, 5, 6], pa.int8()),
            "f64": pa.array([0.1, 1e-310, -1e30, 3.14, float("nan"), None]),
            "s": pa.array(["", "é", None, "x", "y", "z"], pa.large_string()),
            "bin": pa.array([b"\x00", b"", b"\xff", None, b"a", b"b"]),
            "flag": pa.array([True, False, None, True, False, True]),
            "ts": pa.array([datetime.datetime(2024, 1, k + 1) for k in range(n)], pa.timestamp("us")),
            "d32": pa.array([datetime.date(2020, 1, k + 1) for k in range(n)], pa.date32()),
            "dec": pa.array([decimal.Decimal(f"{k}.25") for k in range(n)], pa.decimal128(10, 2)),
            "ints": pa.array([[1], [], None, [2, 3], [4], [5]], pa.list_(pa.int64())),
            "vec": pa.array([[1.0, 2.0]] * n, pa.list_(pa.float32(), 2)),
            "ragged": pa.array(
                [[[1], [2, 3]], [], None, [[]], [[4]], [[5, 6, 7]]], pa.list_(pa.list_(pa.int64()))
            ),
        }
    )
    return pa.concat_tables([base] * repeat)


def test_the_every_type_table(tmp_path: Path) -> None:
    src = tmp_path / "all.parquet"
    pq.write_table(_every_type(3000), src)
    plan, meta = _plan_then_convert(str(src), tmp_path / "out")
    _check(plan, meta, rows_exact=True)


def test_a_csv_file(tmp_path: Path) -> None:
    src = tmp_path / "t.csv"
    pacsv.write_csv(make_table(60_000).drop_columns(["ilist", "flist"]), src)
    plan, meta = _plan_then_convert(str(src), tmp_path / "out", max_rejected_fraction=1.0)
    assert not plan["rows_exact"]
    _check(plan, meta, rows_exact=False)


def test_an_image_folder(tmp_path: Path) -> None:
    mnist_folder(str(tmp_path / "digits"), per_class=30)
    plan, meta = _plan_then_convert(str(tmp_path / "digits"), tmp_path / "out", format="images")
    assert plan["rows_exact"]
    _check(plan, meta, rows_exact=True)


def test_three_splits(tmp_path: Path) -> None:
    src = tmp_path / "bench.parquet"
    pq.write_table(make_table(120_000), src)
    plan, meta = _plan_then_convert(
        str(src), tmp_path / "out", splits="train=8,eval=1,test=1", shard_size="2MB"
    )
    assert len(plan["splits"]) == 3
    _check(plan, meta, rows_exact=True)


def _bytes_read() -> int:
    """What this process has read through system calls (page cache included)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_ten_thousand_files_by_their_footers_alone(tmp_path: Path) -> None:
    """The rows of 10,000 files exact from their footers, read alone: each file holds ~80 KB of
    row data and a footer of ~1 KB, so reading row data would show as ~800 MB."""
    rng = np.random.default_rng(0)
    one = tmp_path / "one.parquet"
    pq.write_table(
        pa.table({"x": rng.integers(0, 2**62, 10_000), "y": rng.random(10_000)}), one, compression="none"
    )
    folder = tmp_path / "many"
    folder.mkdir()
    data = one.read_bytes()
    for k in range(10_000):
        (folder / f"part-{k:05d}.parquet").write_bytes(data)
    recordforge.plan(str(one), str(tmp_path / "warm"))  # imports and first-use set-up, not counted
    before, start = _bytes_read(), time.monotonic()
    plan = recordforge.plan(str(folder / "*.parquet"), str(tmp_path / "out"))
    took, read = time.monotonic() - start, _bytes_read() - before
    assert plan["rows"] == 100_000_000 and plan["rows_exact"] and plan["work_items"] == 10_000
    # The first file is read for the schema and the sample: a few of its 160 KB, once or twice.
    assert read < 10_000 * 4096 + 5 * len(data) + (8 << 20), read
    assert took < 60, took


def test_what_a_run_refuses_the_plan_refuses_in_one_line(tmp_path: Path) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), src)
    out = tmp_path / "out"
    recordforge.convert(str(src), str(out))
    with pytest.raises(RecordForgeError, match="overwrite"):
        recordforge.plan(str(src), str(out))
    done = subprocess.run(
        [sys.executable, "-m", "recordforge", "plan", "--source", str(src), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("recordforge plan: error:") and "--overwrite" in line


def test_the_command_prints_the_plan_and_json(tmp_path: Path) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(make_table(20_000), src)
    argv = ["--source", str(src), "--output", str(tmp_path / "out"), "--num_shards", "400"]
    run = [sys.executable, "-m", "recordforge", "plan"]
    text = subprocess.run([*run, *argv], capture_output=True, text=True, timeout=300, check=True).stdout
    assert "20,000 rows (exact, from the Parquet footers)" in text
    assert "split data: 20,000 rows" in text and "in 400 shards" in text
    assert "warning: split data: 400 shards of about" in text  # under 10 MiB each
    as_json = json.loads(
        subprocess.run(
            [*run, "--json", *argv], capture_output=True, text=True, timeout=300, check=True
        ).stdout
    )
    assert as_json["rows"] == 20_000 and as_json["shards"] == 400 and as_json["warnings"]
    assert not (tmp_path / "out").exists()
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


@pytest.mark.parametrize("fmt", ["jsonl", "orc", "arrow"])
def test_the_table_formats(tmp_path: Path, fmt: str) -> None:
    """ORC and Arrow files' rows exact (footer, batches), JSON Lines' estimated from its lines."""
    import pyarrow.feather as feather
    import pyarrow.orc as orc

    table = make_table(40_000).drop_columns(["ilist", "flist"])
    src = tmp_path / f"t.{fmt}"
    if fmt == "jsonl":
        src.write_text("\n".join(json.dumps(row) for row in table.to_pylist()) + "\n")
    elif fmt == "orc":
        orc.write_table(table, src, stripe_size=1 << 20)
    else:
        feather.write_feather(table, src, chunksize=5_000)
    plan, meta = _plan_then_convert(str(src), tmp_path / "out", format=fmt)
    _check(plan, meta, rows_exact=fmt != "jsonl")


def test_a_delta_table(tmp_path: Path) -> None:
    """A snapshot's rows exact from its Parquet files' footers, its bytes from a sample of them."""
    import deltalake  # the `delta` extra, installed with dev

    deltalake.write_deltalake(str(tmp_path / "t"), make_table(30_000))
    deltalake.write_deltalake(str(tmp_path / "t"), make_table(10_000, seed=1), mode="append")
    plan, meta = _plan_then_convert(str(tmp_path / "t"), tmp_path / "out", format="delta")
    assert plan["files"] == 2
    _check(plan, meta, rows_exact=True)


def test_a_dataflow_plan_prices_the_job(tmp_path: Path) -> None:
    """Built offline (--dry_run=True: local paths allowed), priced by the runner adapter."""
    src = tmp_path / "t.parquet"
    pq.write_table(make_table(20_000), src)
    plan = recordforge.plan(
        str(src),
        str(tmp_path / "out"),
        runner="DataflowRunner",
        dry_run=True,
        temp_location="gs://bucket/tmp",
        region="europe-west1",
        machine_type="n1-standard-4",
        num_workers=5,
    )
    cost = plan["cost"]
    assert cost["runner"] == "Dataflow" and cost["workers"] == 5 and cost["region"] == "europe-west1"
    assert cost["worker_hours"] > 0 and cost["cost_usd"] >= 0 and cost["prices_date"]
    local = recordforge.plan(str(src), str(tmp_path / "out"))
    assert local["cost"] is None
