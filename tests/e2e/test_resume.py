"""A run of 300,000 rows in six files killed at a finished piece (SIGKILL, and separately Ctrl-C) at
about 70% of its parts, then rerun: the rerun keeps at least the rows the killed run recorded as
finished, converts the rest, and publishes the records an uninterrupted run does."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from forked_runs import ForkedRuns
from independent import bundle_records
from kept_pieces import finished_rows

import recordforge
from demo.sampledata import taxi_table
from recordforge.files import layout
from recordforge.files.storage import exists, list_files, read_bytes
from recordforge.output import crashpoints
from recordforge.tools.verify import verify

ROWS, FILES, ROW_GROUP = 50_000, 6, 6_250
# Shards of 1 MiB (about 16 for this input, each a part recorded when it fills, besides the short
# parts where a bundle ends). The crash point counts per process: with two workers each writes
# about half of the parts, so the 7th part of the first worker there is about 70-80% of the run.
WORKERS, KILL_AFTER, SHARD = "2", "7", "1MiB"


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("resume-src")
    for i in range(FILES):
        pq.write_table(
            taxi_table(ROWS, seed=i, first_id=i * ROWS), src / f"t{i}.parquet", row_group_size=ROW_GROUP
        )
    return src


def _argv(src: Path, out: Path, *extra: str, workers: str = WORKERS) -> list[str]:
    schema = "examples/taxi.yaml"
    return ["convert", "--source", str(src / "*.parquet"), "--output", str(out), "--schema", schema,
            "--direct_num_workers", workers, "--shard_size", SHARD, *extra]  # fmt: skip


def _digests(out: Path | str) -> np.ndarray:
    """Every record's 8-byte hash, sorted: the records as a multiset, compared exactly enough."""
    hashes = [
        int.from_bytes(hashlib.blake2b(r, digest_size=8).digest(), "little") for r in bundle_records(out)
    ]
    return np.sort(np.array(hashes, dtype=np.uint64))


def _finished_rows(pieces: Path) -> int:
    """The rows the recorded pieces finished (tests/kept_pieces.py): what a rerun keeps at least."""
    return finished_rows(json.loads(p.read_text()) for p in pieces.glob("*.json"))


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_run_is_resumed_by_its_rerun(
    forked: ForkedRuns, source: Path, tmp_path: Path, how: str
) -> None:
    whole, out = tmp_path / "whole", tmp_path / "out"
    env = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: KILL_AFTER}
    if how == "SIGINT":
        env[crashpoints.SIGNAL_ENV] = "SIGINT"
    first, killed = forked.together([(_argv(source, whole), 0.0), (_argv(source, out), 0.0)], envs=[{}, env])
    assert first.code == 0, first.stderr
    assert killed.code == (-9 if how == "SIGKILL" else 130), killed.stderr
    assert not (out / layout.METADATA).exists()
    (pieces,) = [p for p in out.glob("v-*/_pieces")]
    assert len(list(pieces.glob("part-*.json"))) >= int(KILL_AFTER)
    finished = _finished_rows(pieces)  # recorded before the kill
    assert finished > 0
    if how == "SIGINT":  # one line says so, and what the rerun will do
        assert (
            killed.stderr.strip()
            .splitlines()[-1]
            .endswith(
                f"kept in {pieces.parent.name}: the same command resumes them (--resume=false starts clean)"
            )
        ), killed.stderr

    (rerun,) = forked.together([(_argv(source, out), 0.0)], timeout=300)
    assert rerun.code == 0, rerun.stderr
    meta = json.loads((out / layout.METADATA).read_text())
    resumed = meta["resumed"]
    assert resumed["version"] == meta["version"] == pieces.parent.name
    assert resumed["rows"] + resumed["rows_converted"] == meta["rows_read"] == ROWS * FILES
    # The bound is what the killed run recorded, not a fixed share of the rows (a third once
    # failed under load, where the signal landed earlier or later in the run).
    assert resumed["rows"] >= finished, (resumed, finished)
    assert f"converted {resumed['rows_converted']:,} rows" in rerun.stdout
    # A rolling writer keeps parts (joined into shards by the rerun), never whole shards.
    assert resumed["parts"] > 0 and resumed["shards"] == 0
    assert f"{resumed['parts']:,} parts) of the interrupted run" in rerun.stdout
    assert verify(str(out)) == []
    assert np.array_equal(_digests(out), _digests(whole))
    # Nothing of the killed run is left beside the published version: no pieces, no parts.
    assert sorted(p.name for p in (out / meta["version"]).iterdir() if p.name.startswith("_")) == []


def _shard_bytes(out: Path) -> dict[str, bytes]:
    """Each published shard's name (in its version folder) and bytes."""
    meta = json.loads((out / layout.METADATA).read_text())
    return {s["file"].split("/", 1)[1]: (out / s["file"]).read_bytes() for s in meta["shards"]}


@pytest.fixture(scope="module")
def deterministic(
    forked: ForkedRuns, source: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, bytes]:
    """An uninterrupted --deterministic run's shards: 10 of them (a shard per 1 MiB of input)."""
    out = tmp_path_factory.mktemp("deterministic") / "whole"
    (whole,) = forked.together([(_argv(source, out, "--deterministic"), 0.0)])
    assert whole.code == 0, whole.stderr
    return _shard_bytes(out)


@pytest.mark.parametrize("how", ["SIGKILL", "SIGINT"])
def test_a_killed_deterministic_run_resumes_to_the_same_bytes(
    forked: ForkedRuns, source: Path, deterministic: dict[str, bytes], tmp_path: Path, how: str
) -> None:
    """--deterministic: the shards a killed run finished are kept whole. One worker writes the 10
    shards one after another, so the 7th is 70% of them; the rerun converts the batches of the
    others (the rows the finished shards do not hold, and the one batch that straddles the last
    finished shard's end) and publishes the uninterrupted run's bytes."""
    out = tmp_path / "out"
    argv = _argv(source, out, "--deterministic", workers="1")
    env = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: "7"}
    if how == "SIGINT":
        env[crashpoints.SIGNAL_ENV] = "SIGINT"
    (killed,) = forked.together([(argv, 0.0)], envs=[env])
    assert killed.code == (-9 if how == "SIGKILL" else 130), killed.stderr
    assert not (out / layout.METADATA).exists()
    (pieces,) = [p for p in out.glob("v-*/_pieces")]
    shards = [json.loads(p.read_text()) for p in pieces.glob("shard-*.json")]
    finished, held = len(shards), sum(s["count"] for s in shards)  # recorded before the kill
    assert 7 <= finished < len(deterministic)  # a Ctrl-C lands while the worker goes on

    (rerun,) = forked.together([(argv, 0.0)], timeout=300)
    assert rerun.code == 0, rerun.stderr
    meta = json.loads((out / layout.METADATA).read_text())
    resumed = meta["resumed"]
    assert resumed["version"] == meta["version"] == pieces.parent.name
    # A placed writer keeps whole shards, and the closing line says so.
    assert resumed["shards"] == finished and resumed["parts"] == 0
    assert f"{finished} shards) of the interrupted run" in rerun.stdout
    assert resumed["rows"] + resumed["rows_converted"] == meta["rows_read"] == ROWS * FILES
    assert 0 < resumed["rows_converted"] <= ROWS * FILES - held + ROW_GROUP, (resumed, held)
    got = _shard_bytes(out)
    assert got == deterministic, _differences(got, deterministic)
    assert verify(str(out)) == []
    assert sorted(p.name for p in (out / meta["version"]).iterdir() if p.name.startswith("_")) == []


def _differences(got: dict[str, bytes], want: dict[str, bytes]) -> str:
    """Which shards differ, and whether their inflated bytes do too (the records differ) or only
    their compressed bytes (the deflate stream differs): a failure says which it was."""
    lines = [f"shards {sorted(got)} against {sorted(want)}"]
    for name in sorted(set(got) & set(want)):
        if got[name] != want[name]:
            same = zlib.decompress(got[name], wbits=47) == zlib.decompress(want[name], wbits=47)
            inflated = "equal" if same else "DIFFER"
            lines.append(f"{name}: {len(got[name])} vs {len(want[name])} bytes; inflated {inflated}")
    return "\n".join(lines)


def test_a_killed_shuffled_run_keeps_its_shards(forked: ForkedRuns, source: Path, tmp_path: Path) -> None:
    """--shuffle with splits: every batch has records in every shard, so the rerun converts all
    of them again, but writes only the shards the killed run had not finished; the bytes are an
    uninterrupted run's."""
    flags = ("--shuffle", "--splits", "train=3,test=1")
    whole, out = tmp_path / "whole", tmp_path / "out"
    env = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: "5"}
    first, killed = forked.together(
        [(_argv(source, whole, *flags, workers="1"), 0.0), (_argv(source, out, *flags, workers="1"), 0.0)],
        envs=[{}, env],
    )
    assert first.code == 0, first.stderr
    assert killed.code == -9, killed.stderr
    (rerun,) = forked.together([(_argv(source, out, *flags, workers="1"), 0.0)], timeout=300)
    assert rerun.code == 0, rerun.stderr
    resumed = json.loads((out / layout.METADATA).read_text())["resumed"]
    assert resumed["shards"] == 5 and resumed["parts"] == 0 and resumed["pieces"] == 0
    assert resumed["rows_converted"] == ROWS * FILES
    assert _shard_bytes(out) == _shard_bytes(whole)
    assert verify(str(out)) == []


def test_resume_false_starts_clean(forked: ForkedRuns, source: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: "3"}
    (killed,) = forked.together([(_argv(source, out), 0.0)], envs=[env])
    assert killed.code == -9
    (killed_version,) = [p.name for p in out.glob("v-*")]
    (rerun,) = forked.together([(_argv(source, out, "--resume=false"), 0.0)], timeout=300)
    assert rerun.code == 0, rerun.stderr
    meta = json.loads((out / layout.METADATA).read_text())
    assert "resumed" not in meta and meta["num_records"] == ROWS * FILES
    assert not (out / killed_version).exists() and verify(str(out)) == []


def test_a_killed_run_on_gcs_is_resumed_by_its_rerun(gcs_bucket: str, tmp_path: Path) -> None:
    """The same on gs:// (the GCS emulator): parts and records are objects, written whole."""
    src = tmp_path / "src"
    src.mkdir()
    rows, files = 50_000, 6
    for i in range(files):
        table = taxi_table(rows, seed=i, first_id=i * rows)
        pq.write_table(table, src / f"t{i}.parquet", row_group_size=12_500)
    out = f"{gcs_bucket}/out"

    def argv(output: str) -> list[str]:
        return [sys.executable, "-m", "recordforge", "convert", "--source", str(src / "*.parquet"),
                "--output", output, "--schema", "examples/taxi.yaml", "--direct_num_workers", "2",
                "--shard_size", "512KiB"]  # fmt: skip

    def convert(output: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv(output), capture_output=True, text=True, timeout=600)

    whole = convert(str(tmp_path / "whole"))
    assert whole.returncode == 0, whole.stderr
    # Killed from outside (the crash point counts per worker, and the workers' shares are uneven
    # here): the run and its workers, once 75% of its parts (about one per 512 KiB) are recorded.
    parts = sum(s["bytes"] for s in json.loads((tmp_path / "whole" / layout.METADATA).read_text())["shards"])
    parts //= 512 << 10
    proc = subprocess.Popen(argv(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if sum(p.endswith(".json") and "/part-" in p for p in list_files(out)) >= 0.75 * parts:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    proc.communicate(timeout=60)
    assert proc.returncode == -9, "the run ended before 75% of its parts were recorded"
    assert not exists(f"{out}/{layout.METADATA}")
    records = [p for p in list_files(out) if "/_pieces/" in p and p.endswith(".json")]
    finished = finished_rows(json.loads(read_bytes(p)) for p in records)  # recorded before the kill
    assert finished > 0
    rerun = convert(out)
    assert rerun.returncode == 0, rerun.stderr
    meta = json.loads(read_bytes(f"{out}/{layout.METADATA}"))
    resumed = meta["resumed"]
    assert resumed["rows"] + resumed["rows_converted"] == meta["rows_read"] == rows * files
    assert resumed["rows"] >= finished and resumed["rows_converted"] <= rows * files - finished, (
        resumed,
        finished,
    )
    assert recordforge.verify(out) == []
    assert np.array_equal(_digests(out), _digests(tmp_path / "whole"))
    assert not [p for p in list_files(f"{out}/{meta['version']}") if "/_" in layout.relative(p, out)]
