"""Shard sizing, and what a crashed run leaves behind."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import example_to_dict, published_root
from independent import file_records

from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError
from recordforge.pipelines.convert import run
from recordforge.runners import adapter


@pytest.fixture
def source(tmp_path: Path) -> str:
    pq.write_table(taxi_table(20_000, seed=5), tmp_path / "t.parquet", row_group_size=4000)
    return str(tmp_path / "t.parquet")


def _shards(out: Path) -> list[dict]:
    meta = json.loads((out / "metadata.json").read_text())
    on_disk = sorted(f"{meta['version']}/{p.name}" for p in published_root(out).glob("data-*"))
    assert on_disk == [s["file"] for s in meta["shards"]]
    return meta["shards"]


def test_records_per_shard_is_exact(tmp_path: Path, source: str) -> None:
    run(
        [
            "--source",
            source,
            "--output",
            str(tmp_path / "out"),
            "--records_per_shard",
            "3000",
            "--batch_size",
            "1000",
        ]
    )
    shards = _shards(tmp_path / "out")
    assert [s["records"] for s in shards] == [3000] * 6 + [2000]
    n = len(shards)
    names = [s["file"].split("/", 1)[1] for s in shards]
    assert names == [f"data-{i:05d}-of-{n:05d}.tfrecord.gz" for i in range(n)]
    for s in shards:
        assert sum(1 for _ in file_records(str(tmp_path / "out" / s["file"]), "gzip")) == s["records"]


def test_shard_size_is_a_target(tmp_path: Path, source: str) -> None:
    run(
        [
            "--source",
            source,
            "--output",
            str(tmp_path / "out"),
            "--shard_size",
            "150KB",
            "--batch_size",
            "500",
            "--compression",
            "none",
        ]
    )
    shards = _shards(tmp_path / "out")
    assert len(shards) > 3
    per_record = sum(s["bytes"] for s in shards) / sum(s["records"] for s in shards)
    # Every shard but the last reaches the target and overshoots it by less than one batch.
    for s in shards[:-1]:
        assert 150_000 <= s["bytes"] < 150_000 + 500 * per_record * 1.5
    assert shards[-1]["bytes"] <= 150_000 + 500 * per_record * 1.5
    assert sum(s["records"] for s in shards) == 20_000


def test_default_is_one_shard_per_128mb(tmp_path: Path, source: str) -> None:
    meta = run(["--source", source, "--output", str(tmp_path / "out")])
    assert [s["records"] for s in meta["shards"]] == [20_000]


def test_a_crashed_run_leaves_no_success_and_a_rerun_publishes(tmp_path: Path, source: str) -> None:
    out = tmp_path / "out"
    dead = "v-20260101T000000Z-0123abcd"
    # What a run killed mid-way leaves: its journal entry, a temporary folder and a shard.
    (out / "_recordforge" / "runs").mkdir(parents=True)
    (out / "_recordforge" / "runs" / dead).write_text("{}")
    (out / dead / "_tmp-0123456789ab").mkdir(parents=True)
    (out / dead / "_tmp-0123456789ab" / "x.part").write_bytes(b"partial")
    (out / dead / "data-00000-of-00002.tfrecord.gz").write_bytes(b"partial")
    meta = run(["--source", source, "--output", str(out)])
    assert meta["num_records"] == 20_000
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [
            "_SUCCESS",
            "_recordforge",
            meta["version"],
            "croissant.json",
            "feature_spec.json",
            "metadata.json",
            "schema.pbtxt",
            "schema.yaml",
        ]
    )
    assert [p.name for p in (out / "_recordforge" / "runs").iterdir()] == [meta["version"]]
    assert sorted(p.name for p in published_root(out).iterdir()) == [
        "croissant.json",
        "data-00000-of-00001.tfrecord.gz",
        "feature_spec.json",
        "metadata.json",
        "schema.pbtxt",
        "schema.yaml",
    ]
    # Somebody else's files are never deleted without --overwrite.
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(RecordForgeError, match="--overwrite"):
        run(["--source", source, "--output", str(tmp_path / "other")])


def test_sizing_flags_are_checked(tmp_path: Path, source: str) -> None:
    with pytest.raises(RecordForgeError, match="do not combine"):
        run(["--source", source, "--output", str(tmp_path / "o"), "--num_shards", "2", "--shard_size", "1MB"])
    with pytest.raises(RecordForgeError, match="not a size"):
        run(["--source", source, "--output", str(tmp_path / "o"), "--shard_size", "lots"])


def test_a_killed_run_leaves_no_success_and_the_rerun_publishes(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys
    import time

    pq.write_table(taxi_table(400_000, seed=9), tmp_path / "big.parquet", row_group_size=20_000)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "recordforge",
        "convert",
        "--source",
        str(tmp_path / "big.parquet"),
        "--output",
        str(out),
        "--schema",
        "examples/taxi.yaml",
        "--batch_size",
        "5000",
        "--records_per_shard",
        "50000",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(out.glob("v-*/_tmp-*/*.part")) and time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)  # mid-write: shards half written, no bundle
    proc.wait()
    assert list(out.glob("v-*/_tmp-*")) and not (out / "_SUCCESS").exists()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 400000 records in 8 shards" in proc.stdout
    assert (out / "_SUCCESS").exists() and not list(out.glob("v-*/_tmp-*"))
    assert [p.name for p in out.glob("v-*")] == [json.loads((out / "metadata.json").read_text())["version"]]


def _shard_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(published_root(out).glob("data-*"))}


def test_deterministic_shards_are_balanced_runs_of_the_input_whoever_writes_them(
    tmp_path: Path, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["--source", source, "--deterministic", "--num_shards", "4", "--batch_size", "1000"]
    run([*common, "--output", str(tmp_path / "one")])
    two = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]
    run([*common, "--output", str(tmp_path / "two"), *two])
    one = _shard_files(tmp_path / "one")
    assert one == _shard_files(tmp_path / "two")
    assert list(one) == [f"data-0000{i}-of-00004.tfrecord.gz" for i in range(4)]
    # Contiguous and in input order: the shards read one after another are the table's rows.
    shards = _shards(tmp_path / "one")
    assert [s["records"] for s in shards] == [5000] * 4
    ids = [
        example_to_dict(r)["trip_id"][0]
        for s in shards
        for r in file_records(str(tmp_path / "one" / s["file"]), "gzip")
    ]
    assert ids == pq.read_table(source).column("trip_id").to_pylist()
    # The local runner spills the batches to files (deleted once the shards are written) so that
    # its grouping holds names, not records; other runners group the records: the same bytes.
    assert not list((tmp_path / "one").rglob("_tmp-*"))
    traits = adapter.runner_traits
    monkeypatch.setattr(adapter, "runner_traits", lambda o: dataclasses.replace(traits(o), spill=False))
    run([*common, "--output", str(tmp_path / "grouped")])
    assert _shard_files(tmp_path / "grouped") == one


def test_deterministic_without_num_shards_makes_a_shard_per_shard_size_of_input(
    tmp_path: Path, source: str
) -> None:
    size = Path(source).stat().st_size
    meta = run(
        [
            "--source",
            source,
            "--output",
            str(tmp_path / "out"),
            "--deterministic",
            "--shard_size",
            str(size // 3),
        ]
    )
    assert len(meta["shards"]) == 4  # ceil(size / (size // 3))
    assert sum(s["records"] for s in meta["shards"]) == 20_000


@pytest.mark.parametrize("count", [1, 3, 12])
def test_num_shards_is_exact_and_the_shards_are_about_equal(tmp_path: Path, source: str, count: int) -> None:
    """Without --deterministic the parts the workers wrote are joined into exactly that many
    shards, cut between segments (a batch here), the input in order; nothing else stays."""
    out = tmp_path / "out"
    run(["--source", source, "--output", str(out), "--num_shards", str(count), "--batch_size", "1000"])
    shards = _shards(out)
    assert [s["file"].split("/", 1)[1] for s in shards] == [
        f"data-{i:05d}-of-{count:05d}.tfrecord.gz" for i in range(count)
    ]
    records = [s["records"] for s in shards]
    assert sum(records) == 20_000 and max(records) - min(records) <= 2 * 1000
    ids = [
        example_to_dict(r)["trip_id"][0] for s in shards for r in file_records(str(out / s["file"]), "gzip")
    ]
    assert ids == pq.read_table(source).column("trip_id").to_pylist()
    assert not list(out.rglob("_tmp-*"))
