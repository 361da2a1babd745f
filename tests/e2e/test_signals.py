"""A conversion stopped by SIGTERM sent to its driver alone, and by SIGINT sent to its process group,
at its k-th finished part: it ends promptly, 128+N, in one line, keeping its finished pieces.

The signal handler only records the signal (cli/main.py); the run acts on it from ordinary code:
with forked workers the driver's main thread waits inside Beam's runner, so the driver ends its
workers itself (local_runner._stopped_on_interrupt) when the signal reached it alone, and a
terminal's Ctrl-C ends them directly. Either way the rerun converts only the rest.

Mutation it catches: in `src/recordforge/runners/local_runner.py`, `_stopped_on_interrupt`
not ending the workers (`server.end_workers()` -> `pass`): the SIGTERM case then runs on to
its commit and exits 0 ("the run was interrupted after its commit").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from kept_pieces import finished_rows

from demo.sampledata import taxi_table

ROWS, FILES, ROW_GROUP = 30_000, 4, 3_000
SHARD, WORKERS, POINT = "256KiB", "2", 3
_PART = re.compile(r"part-[0-9a-f]{32}\.json")
_RECORD = re.compile(r"(batches|part|published)-[0-9a-f]{32}\.json")
# Bounds for a hang, not speed checks: a run here takes a few seconds.
_DEADLINE_S = 120
# The signal to the end of the process: an uninterrupted run's remaining seconds would be close
# to this on a busy 2-core machine; an acted-on signal takes well under a second.
_PROMPT_S = 15


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("signals-src")
    for i in range(FILES):
        pq.write_table(
            taxi_table(ROWS, seed=i, first_id=i * ROWS), src / f"t{i}.parquet", row_group_size=ROW_GROUP
        )
    return src


def _argv(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "recordforge", "convert", "--source", str(src / "*.parquet"),
            "--output", str(out), "--schema", "examples/taxi.yaml", "--shard_size", SHARD,
            "--direct_num_workers", WORKERS]  # fmt: skip


def _records(out: Path) -> tuple[Path, dict[str, bytes]] | None:
    """The run's pieces folder and the piece records in it, once it has POINT part records."""
    found = list(out.glob("v-*/_pieces"))
    if not found:
        return None
    records = {}
    for name in os.listdir(found[0]):
        if _RECORD.fullmatch(name):
            try:
                records[name] = (found[0] / name).read_bytes()
            except FileNotFoundError:  # pragma: no cover - deleted only by a commit
                pass
    return (found[0], records) if sum(bool(_PART.fullmatch(n)) for n in records) >= POINT else None


@pytest.mark.parametrize(("how", "signum"), [("driver", signal.SIGTERM), ("group", signal.SIGINT)])
def test_a_signalled_run_ends_promptly_keeping_its_finished_pieces(
    source: Path, tmp_path: Path, how: str, signum: int
) -> None:
    out = tmp_path / "out"
    argv = _argv(source, out)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + _DEADLINE_S
        while (seen := _records(out)) is None:
            assert proc.poll() is None, f"the run ended ({proc.returncode}) before its part record {POINT}"
            assert time.monotonic() < deadline, f"no part record {POINT} in {_DEADLINE_S} s"
            time.sleep(0.002)  # a poll of the folder, not a guessed delay
        pieces, before = seen
        if how == "driver":
            os.kill(proc.pid, signum)  # the driver alone: its forked workers do not get it
        else:
            os.killpg(proc.pid, signum)  # as a terminal's Ctrl-C
        sent = time.monotonic()
        _, err = proc.communicate(timeout=_DEADLINE_S)
        took = time.monotonic() - sent
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + signum, err
    assert took < _PROMPT_S, f"{took:.1f} s from the signal to the end"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recordforge convert: interrupted: nothing published"), err
    assert lines[0].endswith(
        f"kept in {pieces.parent.name}: the same command resumes them (--resume=false starts clean)"
    )
    assert not (out / "metadata.json").exists()
    after = {n: (pieces / n).read_bytes() for n in before}  # every record seen is still there, whole
    assert after == before
    finished = finished_rows(json.loads(r) for r in before.values())
    assert finished > 0
    # Nothing of the run is left running: no process names the output folder.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=_DEADLINE_S * 3)
    assert rerun.returncode == 0, rerun.stderr
    meta = json.loads((out / "metadata.json").read_text())
    resumed = meta["resumed"]
    assert resumed is not None and resumed["version"] == meta["version"] == pieces.parent.name
    assert resumed["rows"] >= finished
    assert resumed["rows_converted"] == ROWS * FILES - resumed["rows"] == meta["rows_read"] - resumed["rows"]
    assert meta["num_records"] == ROWS * FILES
