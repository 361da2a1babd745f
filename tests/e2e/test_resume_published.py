"""A run killed after its shards were in place (at `shards_published`, `manifest_written` or
`staged`), for the rolling and the placed writer, then rerun: the rerun converts nothing again,
checks the finished shards and publishes an uninterrupted run's records (bytes, placed); a changed
input or flag between the kill and the rerun starts clean.

The mutation these catch: a rerun that drops the killed run's finished shards (before this
resume existed, every one of them converted all rows again, `resumed` absent)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import tf_raw_records
from forked_runs import ForkedRuns

from demo.sampledata import taxi_table
from recordforge.files import layout
from recordforge.output import crashpoints
from recordforge.tools.verify import verify

ROWS, FILES = 4000, 3
POINTS = ("shards_published", "manifest_written", "staged")
WRITERS = {
    "rolling": ["--shard_size", "150KB"],
    "deterministic": ["--deterministic", "--num_shards", "3"],
}


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


def _source(folder: Path) -> Path:
    folder.mkdir()
    for i in range(FILES):
        table = taxi_table(ROWS, seed=i, first_id=i * ROWS)
        pq.write_table(table, folder / f"t{i}.parquet", row_group_size=1000)
    return folder


def _argv(src: Path, out: Path, writer: str, *extra: str) -> list[str]:
    return ["convert", "--source", str(src / "*.parquet"), "--output", str(out),
            "--schema", "examples/taxi.yaml", *WRITERS[writer], *extra]  # fmt: skip


def _records(out: Path) -> Counter[bytes]:
    """The published records as a multiset, read by tf.data (CRC-checked framing), not by
    RecordForge's readers."""
    meta = json.loads((out / layout.METADATA).read_text())
    files = [str(out / s["file"]) for s in meta["shards"]]
    return Counter(tf_raw_records(files, meta["tf_compression_type"]))


def _shard_bytes(out: Path) -> dict[str, bytes]:
    meta = json.loads((out / layout.METADATA).read_text())
    return {s["file"].split("/", 1)[1]: (out / s["file"]).read_bytes() for s in meta["shards"]}


def _killed(forked: ForkedRuns, runs: dict[str, list[str]]) -> dict[str, str]:
    """Kills each run (name: argv) at the crash point its name starts with; its version folder."""
    envs = [{crashpoints.ENV: name.split(":")[0]} for name in runs]
    outcomes = forked.together([(argv, 0.0) for argv in runs.values()], envs=envs)
    versions = {}
    for (name, argv), outcome in zip(runs.items(), outcomes, strict=True):
        assert outcome.code == -9, (name, outcome.stderr)
        out = Path(argv[argv.index("--output") + 1])
        (version,) = [p.name for p in out.glob("v-*")]
        versions[name] = version
    return versions


@pytest.mark.parametrize("writer", WRITERS)
def test_a_run_killed_after_its_shards_converts_nothing_again(
    forked: ForkedRuns, tmp_path: Path, writer: str
) -> None:
    src = _source(tmp_path / "src")
    outs = {point: tmp_path / point for point in POINTS}
    (whole,) = forked.together([(_argv(src, tmp_path / "whole", writer), 0.0)])
    assert whole.code == 0, whole.stderr
    killed = _killed(forked, {point: _argv(src, out, writer) for point, out in outs.items()})

    reruns = forked.together([(_argv(src, out, writer), 0.0) for out in outs.values()])
    expected = _records(tmp_path / "whole")
    for (point, out), rerun in zip(outs.items(), reruns, strict=True):
        assert rerun.code == 0, (point, rerun.stderr)
        meta = json.loads((out / layout.METADATA).read_text())
        resumed = meta.get("resumed")
        assert resumed is not None, (point, rerun.stderr)
        assert meta["version"] == resumed["version"] == killed[point], point
        assert resumed["rows_converted"] == 0 and resumed["rows"] == meta["rows_read"] == ROWS * FILES
        assert resumed["shards"] == len(meta["shards"]) and resumed["parts"] == 0, (point, resumed)
        assert "; converted 0 rows" in rerun.stdout, (point, rerun.stdout)
        assert _records(out) == expected, point
        if writer == "deterministic":
            assert _shard_bytes(out) == _shard_bytes(tmp_path / "whole"), point
        assert verify(str(out)) == [], point
        # Nothing of the killed run is left beside its published version: no pieces, no temporaries.
        assert sorted(p.name for p in (out / meta["version"]).iterdir() if p.name.startswith("_")) == []
        assert {p.name for p in out.glob("v-*")} == {killed[point]}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_changed_input_or_flag_after_the_kill_starts_clean(
    forked: ForkedRuns, tmp_path: Path, writer: str
) -> None:
    """The same kills, then a rerun with one input rewritten, or with another compression: the
    killed run's shards are not the rerun's to publish, so it converts everything into a new
    version, and the killed run's folder is removed."""
    runs = {
        f"{point}:{change}": _argv(
            _source(tmp_path / f"src-{point}-{change}"), tmp_path / f"{point}-{change}", writer
        )
        for point in POINTS
        for change in ("input", "flag")
    }
    killed = _killed(forked, runs)
    changed = {}
    for name, argv in runs.items():
        if name.endswith("input"):
            src = Path(argv[argv.index("--source") + 1]).parent
            pq.write_table(taxi_table(ROWS + 7, seed=99, first_id=10 * ROWS), src / "t0.parquet")
            changed[name] = argv
        else:
            changed[name] = [*argv, "--compression", "none"]

    reruns = forked.together([(argv, 0.0) for argv in changed.values()])
    for (name, argv), rerun in zip(changed.items(), reruns, strict=True):
        assert rerun.code == 0, (name, rerun.stderr)
        out = Path(argv[argv.index("--output") + 1])
        meta = json.loads((out / layout.METADATA).read_text())
        assert "resumed" not in meta, (name, meta.get("resumed"))
        assert meta["version"] != killed[name] and not (out / killed[name]).exists(), name
        rows = ROWS * FILES + (7 if name.endswith("input") else 0)
        assert meta["rows_read"] == meta["num_records"] == rows, name
        assert sum(_records(out).values()) == rows and verify(str(out)) == [], name
