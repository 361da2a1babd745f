"""The command line and `recordforge.read`, as a user runs them."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

import recordforge
from demo.sampledata import taxi_table


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "recordforge", *args], capture_output=True, text=True, timeout=300
    )


def test_convert_with_inferred_schema_and_read_back(tmp_path: Any) -> None:
    table = taxi_table(500, seed=3)
    pq.write_table(table, tmp_path / "taxi.parquet", row_group_size=100)
    out = tmp_path / "out"
    proc = _cli(
        "convert", "--source", str(tmp_path / "*.parquet"), "--output", str(out), "--compression", "none"
    )
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 500 records in 1 shard to {out}" in proc.stdout

    meta = json.loads((out / "metadata.json").read_text())
    assert meta["schema_origin"] == "inferred"
    assert meta["columns"]["pickup_zone"] == "Pickup Zone"
    assert any("float64" in n for n in meta["schema_notes"])
    assert (out / meta["version"] / "data-00000-of-00001.tfrecord").exists()

    rows = list(recordforge.read(str(out), batch_size=500))
    assert len(rows) == 1
    batch = rows[0]

    def flat(name: str) -> np.ndarray:
        # Columns without a null are dense (FixedLenFeature); the others sparse (VarLenFeature).
        t = batch[name]
        return (t.values if hasattr(t, "indices") else t).numpy()

    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["trip_id"]["kind"] == "FixedLenFeature"  # no null in the file: dense
    order = np.argsort(flat("trip_id"))
    np.testing.assert_array_equal(flat("trip_id")[order], table["trip_id"])
    np.testing.assert_array_equal(
        flat("fare_amount")[order], table["fare_amount"].to_numpy().astype(np.float32)
    )
    zones = [z.decode() for z in flat("pickup_zone")[order]]
    assert zones == table["Pickup Zone"].to_pylist()
    assert sum(1 for _ in recordforge.read(str(out))) == 500


def test_infer_schema_prints_editable_yaml(tmp_path: Any) -> None:
    pq.write_table(taxi_table(10), tmp_path / "t.parquet")
    proc = _cli("infer-schema", str(tmp_path / "t.parquet"))
    assert proc.returncode == 0, proc.stderr
    assert "column: Pickup Zone" in proc.stdout
    features = {f["name"]: f for f in yaml.safe_load(proc.stdout)["features"]}
    # float64 is narrowed to float32, as convert infers it
    assert features["fare_amount"].get("narrow") is True and "encode" not in features["fare_amount"]
    (tmp_path / "s.yaml").write_text(proc.stdout)
    out = tmp_path / "out"
    proc = _cli(
        "convert",
        "--source",
        str(tmp_path / "t.parquet"),
        "--output",
        str(out),
        "--schema",
        str(tmp_path / "s.yaml"),
    )
    assert proc.returncode == 0, proc.stderr
    pinned = json.loads((out / "feature_spec.json").read_text())
    inferred = tmp_path / "inferred"
    assert _cli("convert", "--source", str(tmp_path / "t.parquet"), "--output", str(inferred)).returncode == 0
    assert pinned == json.loads((inferred / "feature_spec.json").read_text())  # pinning changes nothing


def test_user_errors_are_one_clear_line(tmp_path: Any) -> None:
    proc = _cli("convert", "--source", str(tmp_path / "none-*.csv"), "--output", str(tmp_path))
    assert proc.returncode == 1
    assert "matched no files" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_infer_schema_prints_the_schema_convert_infers(tmp_path: Any, monkeypatch: Any) -> None:
    """One inference for both: the same files matched (a pattern without a folder part too), the
    same first file, the same dense columns (no null in any file) and CSV types from every row."""
    from recordforge.cli import main as cli

    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"a": [1, 2], "b": [None, "x"]}), "p-1.parquet")
    pq.write_table(pa.table({"a": [3, None], "b": ["y", "z"]}), "p-2.parquet")
    (tmp_path / "c.csv").write_text("n,t\n" + "1,a\n" * 3 + "2.5,b\n")
    for pattern in ("p-*.parquet", "c.csv"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli.main(["infer-schema", pattern]) == 0
        printed = yaml.safe_load(out.getvalue())
        assert cli.main(["convert", "--source", pattern, "--output", f"out-{pattern[0]}"]) == 0
        written = yaml.safe_load((tmp_path / f"out-{pattern[0]}" / "schema.yaml").read_text())
        assert printed["features"] == written["features"], pattern
