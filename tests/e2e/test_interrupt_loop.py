"""Ctrl-C at many points of a conversion, with the CPUs busy: an interrupted run keeps its
finished pieces every time, and its rerun converts only the rest (issue 56).

Each point is chosen by an event, not a delay: `recordforge convert` runs in a process group of its
own, the test watches its `_pieces/` folder, and when the k-th part record appears it copies every
piece record there and sends SIGINT to the group (the runner's workers get it too, as from a
terminal). k runs from the first part to near the last, so the signal lands early, in the middle
and late in the run. After each: exit 130, one line on stderr, nothing published, every piece
recorded before the signal still there (its bytes, and its part's bytes); then the same command
publishes the records an uninterrupted run does, read back with a CRC-checking framing reader,
keeping at least the rows those pieces finished and converting exactly the rest.

What it found: with the run's forked workers ended by the same Ctrl-C, the driver printed an
ERROR per worker ("forked Beam worker ... ended without a status") and the tracebacks of Beam's
gRPC threads reading their connections before its one line (fixed: runners/interrupts.py; unit
tests in tests/runners/test_interrupts.py and tests/cli/test_main.py). No piece was lost.

The mutation it catches (issue 56, "Ctrl-C sometimes deletes every finished piece"): in
`src/recordforge/output/publishing.py`, `Publication._discard`, make an interrupted run discard its
pieces as a failed one does,

    if interrupted and list_files(layout.pieces_dir(root)):   ->   if False:

and the first point fails ("the piece records of the interrupted run are gone"); put the line
back and it passes. So does `Publication.__exit__` passing `interrupted=False` to `_discard` (an
interrupt taken for a failure, as the read-ahead bug of 671d940 made it).

The default test takes 4 points (about 40 s on a busy 2-core machine, its burners included); the
`stress` one at least 40 (`pytest -m stress tests/e2e/test_interrupt_loop.py`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from independent import bundle_records
from kept_pieces import finished_rows

from demo.sampledata import taxi_table

ROWS, FILES, ROW_GROUP = 30_000, 4, 3_000
# About 26 parts: a part is recorded when it holds 256 KiB, and a worker's last one is short.
SHARD, WORKERS = "256KiB", "2"
_PART = re.compile(r"part-[0-9a-f]{32}\.json")
_RECORD = re.compile(r"(batches|part|published)-[0-9a-f]{32}\.json")
# Bounds for a hang, not speed checks: a run here takes a few seconds.
_DEADLINE_S = 120


def _digests(out: Path) -> np.ndarray:
    """Every published record's 8-byte hash, sorted: the records as a multiset."""
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["compression"] == "gzip"
    hashes = [
        int.from_bytes(hashlib.blake2b(r, digest_size=8).digest(), "little") for r in bundle_records(out)
    ]
    assert len(hashes) == ROWS * FILES
    return np.sort(np.array(hashes, dtype=np.uint64))


def _argv(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "recordforge", "convert", "--source", str(src / "*.parquet"),
            "--output", str(out), "--schema", "examples/taxi.yaml", "--shard_size", SHARD,
            "--direct_num_workers", WORKERS]  # fmt: skip


def _pieces(out: Path) -> Path | None:
    found = list(out.glob("v-*/_pieces"))
    assert len(found) <= 1, found
    return found[0] if found else None


def _parts(out: Path) -> int:
    """How many part records the run has written so far (0 before its pieces folder is made,
    and once its commit has deleted it)."""
    pieces = _pieces(out)
    try:
        return 0 if pieces is None else sum(bool(_PART.fullmatch(n)) for n in os.listdir(pieces))
    except FileNotFoundError:
        return 0


def _records(pieces: Path) -> dict[str, bytes]:
    """The piece records in the folder (written whole, under their final names), by name."""
    found = {}
    for name in os.listdir(pieces):
        if _RECORD.fullmatch(name):
            try:
                found[name] = (pieces / name).read_bytes()
            except FileNotFoundError:  # pragma: no cover - the run deletes its pieces only at its commit
                pass
    return found


def _run_until_parts(argv: list[str], out: Path, k: int) -> tuple[subprocess.Popen, Path, dict[str, bytes]]:
    """Starts the run in its own process group and, once its k-th part record is there, copies
    every piece record and sends SIGINT to the group. Returns the process (still to be reaped),
    its pieces folder and the records copied before the signal."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + _DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if _parts(out) >= k:
                pieces = _pieces(out)
                assert pieces is not None
                before = _records(pieces)
                os.killpg(proc.pid, signal.SIGINT)
                return proc, pieces, before
            if proc.poll() is not None:
                _, err = proc.communicate()
                pytest.fail(f"the run ended ({proc.returncode}) before its part record {k}: {err}")
            time.sleep(0.002)  # a poll of the folder (no inotify here), not a guessed delay
        pytest.fail(f"no part record {k} in {_DEADLINE_S} s")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("interrupt-src")
    for i in range(FILES):
        table = taxi_table(ROWS, seed=i, first_id=i * ROWS)
        pq.write_table(table, src / f"t{i}.parquet", row_group_size=ROW_GROUP)
    return src


@pytest.fixture(scope="module")
def whole(source: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int]:
    """An uninterrupted run's records, and the most part records seen in its pieces folder."""
    out = tmp_path_factory.mktemp("interrupt-whole") / "out"
    proc = subprocess.Popen(_argv(source, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    parts = 0
    while proc.poll() is None:  # the pieces are deleted only at the commit, after the last part
        parts = max(parts, _parts(out))
        time.sleep(0.002)
    _, err = proc.communicate(timeout=_DEADLINE_S)
    assert proc.returncode == 0, err
    assert parts >= 8, f"only {parts} part records: the loop needs more points"
    return _digests(out), parts


@pytest.fixture
def busy() -> Iterator[None]:
    """Every core kept busy by a niced burner while the test runs (a signal then lands while the
    run's threads wait on one another, where the read-ahead bug was)."""
    burners = [
        subprocess.Popen(["nice", "-n", "10", sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield
    finally:
        for b in burners:
            b.kill()
        for b in burners:
            b.wait()


def _interrupt_and_resume(source: Path, out: Path, k: int, whole: np.ndarray) -> str:
    argv = _argv(source, out)
    proc, pieces, before = _run_until_parts(argv, out, k)
    try:
        _, err = proc.communicate(timeout=_DEADLINE_S)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    where = f"interrupted at part record {k}"
    assert proc.returncode == 130, f"{where}: {err}"
    assert not (out / "metadata.json").exists(), where
    assert pieces.is_dir(), f"{where}: the piece records of the interrupted run are gone"
    after = _records(pieces)
    lost = sorted(set(before) - set(after))
    assert not lost, f"{where}: the piece records of the interrupted run are gone: {lost}"
    assert all(after[n] == raw for n, raw in before.items()), where
    parts = [json.loads(raw) for n, raw in before.items() if _PART.fullmatch(n)]
    assert len(parts) >= k, where
    for part in parts:  # each recorded part's file, as recorded
        assert hashlib.sha256(Path(part["tmp"]).read_bytes()).hexdigest() == part["sha256"], where
    finished = finished_rows(json.loads(r) for r in before.values())
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recordforge convert: interrupted: nothing published"), (
        f"{where}: {err}"
    )
    assert lines[0].endswith(
        f"kept in {pieces.parent.name}: the same command resumes them (--resume=false starts clean)"
    ), f"{where}: {err}"

    rerun = subprocess.run(argv, capture_output=True, text=True, timeout=_DEADLINE_S * 3)
    assert rerun.returncode == 0, f"{where}: the rerun failed: {rerun.stderr}"
    meta = json.loads((out / "metadata.json").read_text())
    resumed = meta["resumed"]
    assert resumed is not None and resumed["version"] == meta["version"] == pieces.parent.name, where
    assert resumed["parts"] >= len(parts), f"{where}: {resumed}, {len(parts)} parts recorded"
    assert resumed["rows"] >= finished, f"{where}: {resumed}, {finished} rows finished"
    assert resumed["rows_converted"] == ROWS * FILES - resumed["rows"] == meta["rows_read"] - resumed["rows"]
    assert f"converted {resumed['rows_converted']:,} rows" in rerun.stdout, rerun.stdout
    assert np.array_equal(_digests(out), whole), f"{where}: the records differ from an uninterrupted run's"
    return f"k={k}: {len(before)} records, {finished} rows finished, kept {resumed['rows']}"


def _last(parts: int) -> int:
    """The last point: a tenth (at least 3) before the last part an uninterrupted run recorded,
    as a run's parts vary a little with how its batches fall to the workers."""
    return max(1, parts - max(3, parts // 10))


def _loop(source: Path, tmp_path: Path, whole: tuple[np.ndarray, int], points: list[int]) -> None:
    seen = [_interrupt_and_resume(source, tmp_path / f"out-{i}", k, whole[0]) for i, k in enumerate(points)]
    print("\n".join(seen))


def test_an_interrupted_run_keeps_its_finished_pieces(
    source: Path, whole: tuple[np.ndarray, int], busy: None, tmp_path: Path
) -> None:
    """Four points: the first part, a third and two thirds of the way, and near the last."""
    last = _last(whole[1])
    _loop(source, tmp_path, whole, sorted({1, round(last / 3), round(2 * last / 3), last}))


@pytest.mark.stress
def test_an_interrupted_run_keeps_its_finished_pieces_at_many_points(
    source: Path, whole: tuple[np.ndarray, int], busy: None, tmp_path: Path
) -> None:
    """At least 40 points: every part count from the first to near the last, over and over."""
    every = list(range(1, _last(whole[1]) + 1))
    _loop(source, tmp_path, whole, every * -(-40 // len(every)))
