"""A run killed at each named step of the publishing protocol (crashpoints.py), for each writer:
the output holds the old version or the new one, whole, and the next run publishes cleanly."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from forked_runs import ForkedRuns
from independent import file_records

from demo.sampledata import taxi_table
from recordforge.files import layout
from recordforge.output import crashpoints
from recordforge.records.array_records import reading
from recordforge.tools.verify import verify

WRITERS = {
    "rolling": [],
    "num_shards": ["--num_shards", "3"],
    "deterministic": ["--deterministic", "--num_shards", "2"],
    "shuffle": ["--shuffle", "--num_shards", "2"],
    "splits": ["--splits", "train=3,eval=1"],
    "webdataset": ["--output_format", "webdataset", "--num_shards", "2"],
}
# The protocol's steps; a run killed at a finished piece is tests/e2e/test_resume.py's, one
# interrupted as the local runner closes its workers tests/e2e/test_workers.py's.
_PROTOCOL = tuple(p for p in crashpoints.POINTS if p not in ("piece_written", "workers_closing"))
_BEFORE_COMMIT = _PROTOCOL[: _PROTOCOL.index("committed")]
# The published bundle's rows and the rows the killed runs add: three row groups, shards of a few
# hundred records. A WebDataset sample is ~15 KB (its members' 512-byte headers and padding), and
# every output is read whole by verify and by tarfile: a quarter of the rows there (the protocol's
# steps do not depend on the count).
_SIZES = {"webdataset": (300, 100)}
_OLD, _NEW = 1200, 400


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


def _files(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and layout.STATE_DIR not in p.parts
    }


def _whole(out: Path) -> dict:
    """The published manifest, after checking that every shard it names holds what it says."""
    meta = json.loads((out / layout.METADATA).read_text())
    for shard in meta["shards"]:
        path = out / shard["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == shard["sha256"], shard["file"]
        assert sum(1 for _ in file_records(str(path), reading(meta))) == shard["records"]
    assert sum(s["records"] for s in meta["shards"]) == meta["num_records"]
    return meta


def _report(point: str, outcome: object, out: Path) -> str:
    listing = "\n".join(sorted(str(p.relative_to(out)) for p in out.rglob("*")))
    return f"crash at {point}: {outcome}\noutput:\n{listing}"


@pytest.mark.parametrize("writer", WRITERS)
def test_a_run_killed_at_each_step_leaves_old_or_new_whole_and_the_rerun_publishes(
    forked: ForkedRuns, tmp_path: Path, writer: str
) -> None:
    old_rows, new_rows = _SIZES.get(writer, (_OLD, _NEW))
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(taxi_table(old_rows, seed=1), src / "a.parquet", row_group_size=old_rows // 3)
    base = tmp_path / "base"

    def argv(out: Path) -> list[str]:
        source = str(src / "*.parquet")
        return ["convert", "--source", source, "--output", str(out), "--schema", "examples/taxi.yaml",
                "--overwrite", *WRITERS[writer]]  # fmt: skip

    (first,) = forked.together([(argv(base), 0.0)])
    assert first.code == 0, first.stderr
    old = _files(base)
    old_meta = _whole(base)
    pq.write_table(taxi_table(new_rows, seed=2, first_id=old_rows), src / "b.parquet")
    outs = {point: tmp_path / point for point in _PROTOCOL}
    for out in outs.values():
        shutil.copytree(base, out)

    crashed = forked.together(
        [(argv(out), 0.0) for out in outs.values()],
        envs=[{crashpoints.ENV: point} for point in outs],
    )
    for (point, out), outcome in zip(outs.items(), crashed, strict=True):
        # Killed there: a point the run never reached would have let it finish with 0.
        assert outcome.code == -9, _report(point, outcome, out)
        meta = _whole(out)
        if point in _BEFORE_COMMIT:
            assert meta == old_meta, _report(point, outcome, out)
            kept = {k: v for k, v in _files(out).items() if k.startswith(meta["version"])}
            assert kept == {k: v for k, v in old.items() if k.startswith(meta["version"])}
        else:
            assert meta["num_records"] == old_rows + new_rows and meta["version"] != old_meta["version"]

    reruns = forked.together([(argv(out), 0.0) for out in outs.values()])
    for (point, out), outcome in zip(outs.items(), reruns, strict=True):
        assert outcome.code == 0, _report(point, outcome, out)
        meta = _whole(out)
        assert meta["num_records"] == old_rows + new_rows, _report(point, outcome, out)
        assert verify(str(out)) == [], _report(point, outcome, out)
        # What the killed run left is gone: the published version and the one before it remain,
        # each recorded in the journal, and neither a lock nor a temporary file is left.
        versions = sorted(p.name for p in out.glob("v-*"))
        assert len(versions) <= 2 and meta["version"] in versions
        assert sorted(p.name for p in (out / layout.STATE_DIR / "runs").iterdir()) == versions
        assert not (out / layout.STATE_DIR / "lock").exists()
        tops = {p.name for p in out.iterdir()} - {layout.STATE_DIR, *versions}
        assert tops <= {layout.METADATA, layout.SUCCESS, *layout.TOP_FILES}, tops


def test_a_first_run_killed_at_each_step_is_followed_by_a_plain_run(
    forked: ForkedRuns, tmp_path: Path
) -> None:
    """No bundle before: killed before its commit, the output holds nothing published and a run
    without --overwrite publishes; killed after it, the output is published, and the next run
    finishes what the killed one left undone, then refuses to replace it without being asked."""
    pq.write_table(taxi_table(500, seed=3), tmp_path / "a.parquet")
    outs = {point: tmp_path / point for point in _PROTOCOL}

    def argv(out: Path) -> list[str]:
        return ["convert", "--source", str(tmp_path / "a.parquet"), "--output", str(out)]

    crashed = forked.together(
        [(argv(out), 0.0) for out in outs.values()], envs=[{crashpoints.ENV: point} for point in outs]
    )
    assert [o.code for o in crashed] == [-9] * len(outs), crashed
    reruns = forked.together([(argv(out), 0.0) for out in outs.values()])
    for (point, out), outcome in zip(outs.items(), reruns, strict=True):
        if point in _BEFORE_COMMIT:
            assert outcome.code == 0, _report(point, outcome, out)
        else:
            assert outcome.code == 1 and "already holds a published dataset" in outcome.stderr, _report(
                point, outcome, out
            )
        assert _whole(out)["num_records"] == 500 and verify(str(out)) == [], _report(point, outcome, out)


def test_a_crash_point_in_a_forked_worker_kills_the_whole_run(forked: ForkedRuns, tmp_path: Path) -> None:
    """The shard publish runs inside a Beam step: with forked local workers, in a worker. Reached
    there, the crash point kills the run's driver too (recorded under the lock), so the run dies as
    a power cut would end it, nothing is published, and the next run publishes whole."""
    pq.write_table(taxi_table(500, seed=3), tmp_path / "a.parquet")
    out = tmp_path / "out"
    argv = ["convert", "--source", str(tmp_path / "a.parquet"), "--output", str(out)]
    argv += ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
    [crashed] = forked.together([(argv, 0.0)], envs=[{crashpoints.ENV: "shards_published"}])
    assert crashed.code == -9, crashed
    assert not (out / "metadata.json").exists()
    [rerun] = forked.together([(argv, 0.0)])
    assert rerun.code == 0, rerun
    assert _whole(out)["num_records"] == 500 and verify(str(out)) == []
