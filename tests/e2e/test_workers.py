"""Multi-process local runs: workers forked from the driver write what one in-process worker writes,
fail the run as loudly, and leave no process behind."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from independent import file_records

from recordforge.output import crashpoints
from recordforge.pipelines.convert import run
from recordforge.runners.local_runner import LocalRunner
from recordforge.tools.verify import verify

TWO_WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _records(output: Path) -> Counter:
    meta = json.loads((output / "metadata.json").read_text())
    return Counter(r for s in meta["shards"] for r in file_records(str(output / s["file"]), "gzip"))


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """A fresh `recordforge convert` process: the way users run it, and the only kind of process
    the fork server is made in (pytest's own may run threads)."""
    return subprocess.run(
        # --debug: the INFO line that says how workers started is shown
        [sys.executable, "-m", "recordforge", "convert", *args, "--debug"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _processes_mentioning(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(pid))
    return found


def test_forked_workers_write_what_one_worker_writes(parquet_source: str, tmp_path: Path) -> None:
    run(["--source", parquet_source, "--output", str(tmp_path / "one"), "--batch_size", "128"])
    two = tmp_path / "two"
    proc = _cli("--source", parquet_source, "--output", str(two), "--batch_size", "128", *TWO_WORKERS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workers are forked from the driver" in proc.stderr
    # Each worker's Arrow pool gets its share of the cores, not a pool as wide as the machine.
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert proc.stderr.count(f"Arrow's CPU pool is {share} threads wide") == 2, proc.stderr[-3000:]
    one_records = _records(tmp_path / "one")
    assert sum(one_records.values()) == 2100
    assert _records(two) == one_records  # every record, byte for byte
    meta = json.loads((two / "metadata.json").read_text())
    assert meta["num_records"] == 2100 and len(meta["shards"]) >= 1
    # The fork server and its workers are gone with the run: no process names the output folder.
    assert _processes_mentioning(str(two)) == []


def test_a_ctrl_c_while_the_runner_closes_its_workers_ends_the_run(
    parquet_source: str, tmp_path: Path
) -> None:
    """SIGINT to the driver alone (as a scheduler's kill of one pid or a notebook's interrupt
    sends it; a terminal's Ctrl-C also stops the workers) as Beam closes the first of two forked
    workers: Beam's close of the other is cut short, and the fork server used to wait for that
    worker, which waited for work, forever. The commit was before it: the run has published,
    says so, and exits 0."""
    out = tmp_path / "out"
    env = {**os.environ, crashpoints.ENV: "workers_closing", crashpoints.SIGNAL_ENV: "SIGINT"}
    # A bound well above the run's seconds: a hang fails here, not at _cli's default.
    proc = _cli("--source", parquet_source, "--output", str(out), *TWO_WORKERS, env=env, timeout=150)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workers are forked from the driver" in proc.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert f"version {meta['version']} is published; the run was interrupted after its commit" in proc.stderr
    assert meta["num_records"] == 2100 and verify(str(out)) == []
    assert _processes_mentioning(str(out)) == []


def test_omp_num_threads_still_sizes_a_forked_workers_arrow_pool(parquet_source: str, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "3"}
    proc = _cli("--source", parquet_source, "--output", str(tmp_path / "out"), *TWO_WORKERS, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("Arrow's CPU pool is 3 threads wide") == 2, proc.stderr[-3000:]


def test_a_bad_row_in_a_forked_worker_fails_the_run_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"col": pa.array([1, 2, 3, None, 5] * 40, pa.int64())}), path, row_group_size=50)
    schema = tmp_path / "schema.yaml"
    schema.write_text("features:\n  - name: col\n    type: int64\n    nulls: required\n")
    out = tmp_path / "out"
    proc = _cli("--source", str(path), "--output", str(out), "--schema", str(schema), *TWO_WORKERS)
    assert proc.returncode != 0
    assert "workers are forked from the driver" in proc.stderr
    assert str(path) in proc.stderr and "row 4" in proc.stderr and "'col'" in proc.stderr
    assert not (out / "_SUCCESS").exists()
    assert _processes_mentioning(str(out)) == []


def test_a_forked_worker_logs_like_the_driver(parquet_source: str, tmp_path: Path) -> None:
    # A worker's warning reaches stderr once, in the CLI's own format; Beam's harness start-up
    # (INFO) and its "no main session" warning (a forked worker needs none) do not.
    folder = Path(parquet_source).parent  # three good files of 700 rows; one more, truncated
    data = (folder / "t0.parquet").read_bytes()
    (folder / "z.parquet").write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    proc = _cli("--source", parquet_source, "--output", str(out), "--skip_unreadable_files", *TWO_WORKERS)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "workers are forked from the driver" in proc.stderr
    warning = f"WARNING recordforge.transforms.source_types: skipping unreadable input {folder / 'z.parquet'}"
    assert proc.stderr.count(warning) == 1, proc.stderr[-3000:]
    for noise in ("semi_persistent", "sdk harness starting", "Worker: severity"):
        assert noise not in proc.stderr
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == 2100
    assert [u["file"] for u in meta["unreadable_files"]] == [str(folder / "z.parquet")]


def test_with_other_threads_running_workers_start_fresh(parquet_source: str, tmp_path: Path, caplog) -> None:
    # A thread that could hold a lock at fork time: the runner must not fork this process.
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    args = ["--source", parquet_source, "--batch_size", "128"]
    try:
        with caplog.at_level("INFO", logger="recordforge.runners.local_runner"):
            run([*args, "--output", str(tmp_path / "two"), *TWO_WORKERS])
    finally:
        stop.set()
    assert "start as fresh processes: this process already runs other threads" in caplog.text
    run([*args, "--output", str(tmp_path / "one")])
    assert _records(tmp_path / "two") == _records(tmp_path / "one")


def _sampling_period(_: object) -> int:
    from apache_beam.runners.worker import statesampler

    return statesampler.get_current_tracker().sampling_period_ms


def test_bundles_sample_their_state_promptly_and_the_swap_is_undone() -> None:
    import apache_beam as beam
    from apache_beam.runners.worker import statesampler
    from apache_beam.testing.util import assert_that, equal_to

    original = statesampler.StateSampler
    with beam.Pipeline(runner=LocalRunner()) as p:
        assert_that(p | beam.Create([0]) | beam.Map(_sampling_period), equal_to([20]))
    assert statesampler.StateSampler is original


def _seen_by_a_worker(_: object, claims: str | None) -> tuple[int, bool]:
    return _sampling_period(_), claims is not None and os.path.isdir(claims)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    ("broken", "expected"),
    [
        (None, (20, True)),  # every feature: a run of two workers has a claims folder they see
        ("version", (200, False)),  # another Beam: Beam's FnApiRunner as it is
        ("sampler", (200, True)),  # assumption 5 broken: Beam's own sampler, the rest kept
        ("repeat", (20, False)),  # bundles replayed before they run: no claims (assumption 6)
    ],
)
def test_a_feature_whose_assumption_fails_is_left_to_beam_with_one_log_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, broken: str | None, expected: tuple
) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from recordforge.runners import local_runner
    from recordforge.runners.session import LOCAL_RUNNER, runner_traits, session

    flags = []
    if broken == "version":
        monkeypatch.setattr(local_runner, "BEAM_VERSION", "1.0")
    elif broken == "sampler":
        monkeypatch.setitem(local_runner._RUN_TIME_CHECKS, 5, lambda: "StateSampler.__init__ takes []")
    elif broken == "repeat":
        flags = ["--direct_runner_bundle_repeat=1"]
    with caplog.at_level("INFO", logger="recordforge.runners.local_runner"):
        # Traits of two workers (one has no one to share with); the pipeline runs in process.
        traits = runner_traits(
            PipelineOptions([f"--runner={LOCAL_RUNNER}", "--direct_num_workers=2", *flags])
        )
        with session(traits), beam.Pipeline(runner=LocalRunner(), options=PipelineOptions(flags)) as p:
            seen = p | beam.Create([0]) | beam.Map(_seen_by_a_worker, traits.claims)
            assert_that(seen, equal_to([expected]))
    warnings = _warnings(caplog)
    if broken is None:
        assert warnings == []
    else:
        assert len(warnings) == 1, warnings
        number = {"version": 1, "sampler": 5, "repeat": 6}[broken]
        assert f"assumption {number}: " in warnings[0] and "local_runner" in warnings[0]
