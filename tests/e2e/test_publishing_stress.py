"""Pairs and triples of runs started together on one output, over and over, under CPU load, on a
local disk and on gs:// (emulator): each ends in a promised state, and nothing is left behind."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from forked_runs import ForkedRuns, Outcome
from independent import file_records

from recordforge.files import layout
from recordforge.files.storage import list_files, read_bytes
from recordforge.tools.verify import verify

_ROWS = 20
_SEED = 46
_LOCKED = re.compile(
    r"recordforge convert: error: (?P<out>\S+) is being written by run (?P<run>v-\S+) \(host \S+, pid \d+, "
    r"since \S+\); wait for it, or if that run is dead remove (?P<lock>\S+)"
)


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Two processes spinning for the whole test, so the runs are descheduled at arbitrary points."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for proc in spinners:
        proc.kill()
        proc.wait()


def _source(folder: Path, rid: int) -> str:
    """A tiny input whose every record names its run."""
    path = folder / f"run{rid}.parquet"
    pq.write_table(pa.table({"run": [rid] * _ROWS, "i": list(range(_ROWS))}), path)
    return str(path)


_SCHEMA = (
    "features:\n  - {name: run, type: int64, nulls: required}\n  - {name: i, type: int64, nulls: required}\n"
)


def _argv(source: str, out: str) -> list[str]:
    schema = Path(source).with_name("schema.yaml")
    if not schema.exists():
        schema.write_text(_SCHEMA)  # a schema given: no inference, so no warning on stderr
    return ["convert", "--source", source, "--output", out, "--schema", str(schema), "--overwrite"] + [
        "--compression",
        "none",
    ]


def _listing(out: str) -> list[str]:
    return [layout.relative(p, out) for p in list_files(out)]


def _check_round(out: str, rids: list[int], outcomes: list[Outcome]) -> None:
    """The promises after runs `rids` started together on `out` and ended with `outcomes`."""
    from conftest import example_to_dict

    meta = json.loads(read_bytes(layout.join(out, layout.METADATA)))
    records = [
        example_to_dict(raw)
        for shard in meta["shards"]
        for raw in file_records(layout.join(out, shard["file"]), meta["compression"])
    ]
    published = {r["run"][0] for r in records}
    assert len(published) == 1 and len(records) == _ROWS, f"records of runs {sorted(published)}"
    winner = rids.index(published.pop())  # raises when it is no run of this round
    codes = [o.code for o in outcomes]
    assert codes[winner] == 0 and set(codes) <= {0, 1}
    holders = {meta["version"]} | ({meta["previous_version"]} if codes.count(0) > 1 else set())
    for o in outcomes:
        if o.code:
            lines = o.stderr.strip().splitlines()
            match = _LOCKED.fullmatch(lines[0]) if len(lines) == 1 else None
            assert match and match["out"] == out and match["run"] in holders, "not the lock's message"
            assert match["lock"] == layout.lock_path(out)
    assert verify(out) == []
    kept = {meta["version"], meta["previous_version"]} - {None}
    left = set(_listing(out)) - {f"{v}/{rel}" for v in kept for rel in _version_files(out, v)}
    left -= set(layout.TOP_FILES) | {f"{layout.STATE_DIR}/runs/{v}" for v in kept}
    left.discard(f"{layout.STATE_DIR}/lock.guard")  # kept on purpose (layout.py)
    assert left == set(), "left behind"


def _version_files(out: str, version: str) -> list[str]:
    return [layout.relative(p, layout.join(out, version)) for p in list_files(layout.join(out, version))]


def _rounds(forked: ForkedRuns, out: str, src: Path, pairs: int, triples: int, env: dict[str, str]) -> int:
    """Runs `pairs` pairs and `triples` triples, each after a random delay of up to 50 ms."""
    rng = random.Random(_SEED)
    sizes = [2] * pairs + [3] * triples
    rng.shuffle(sizes)
    (first,) = forked.together([(_argv(_source(src, 0), out), 0.0)], env)
    assert first.code == 0, first.stderr
    for round_no, size in enumerate(sizes):
        rids = [round_no * 10 + k + 1 for k in range(size)]
        runs = [(_argv(_source(src, rid), out), rng.uniform(0, 0.05)) for rid in rids]
        outcomes = forked.together(runs, env)
        try:
            _check_round(out, rids, outcomes)
        except AssertionError as exn:
            ran = "".join(
                f"\n  run {r}: exit {o.code}, stderr: {o.stderr}" for r, o in zip(rids, outcomes, strict=True)
            )
            shown = "\n  ".join(_listing(out))
            raise AssertionError(f"round {round_no} of seed {_SEED}: {exn}{ran}\n{out}:\n  {shown}") from exn
    return len(sizes)


def _gcs_env() -> dict[str, str]:
    import os

    names = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")
    return {n: os.environ[n] for n in names if n in os.environ}


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_runs_started_together_end_in_a_promised_state(
    forked: ForkedRuns, cpu_load: None, tmp_path: Path, request: pytest.FixtureRequest, where: str
) -> None:
    """A few rounds on every `make test`; the long version is marked `stress`."""
    out = str(tmp_path / "out") if where == "local" else request.getfixturevalue("gcs_bucket") + "/out"
    env = _gcs_env() if where == "gcs" else {}
    assert _rounds(forked, out, tmp_path, pairs=4, triples=1, env=env) == 5


@pytest.mark.stress
@pytest.mark.parametrize("where, pairs, triples", [("local", 50, 10), ("gcs", 6, 2)])
def test_many_runs_started_together_end_in_a_promised_state(
    forked: ForkedRuns,
    cpu_load: None,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    where: str,
    pairs: int,
    triples: int,
) -> None:
    out = str(tmp_path / "out") if where == "local" else request.getfixturevalue("gcs_bucket") + "/out"
    env = _gcs_env() if where == "gcs" else {}
    assert _rounds(forked, out, tmp_path, pairs, triples, env) == pairs + triples
