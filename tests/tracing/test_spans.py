"""Spans: recorded only when a run is profiled, flushed per process, merged into one trace."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from recordforge.tracing import spans
from recordforge.tracing.trace import read_summary, summary_lines, write_trace


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    yield tmp_path / "spans"
    spans.stop()


def test_nothing_is_recorded_unless_profiling(folder: Path) -> None:
    spans.stop()
    with spans.span("encode"):
        pass
    spans.flush()
    assert not folder.exists() and not spans.enabled()


def test_spans_are_flushed_per_process_with_its_start(folder: Path) -> None:
    spans.start(str(folder))
    assert os.environ[spans.ENV] == str(folder)  # forked workers inherit it
    with spans.span("encode"):
        time.sleep(0.01)
    spans.flush()
    (path,) = folder.glob("spans-*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0][0] == "process" and lines[0][2] <= time.perf_counter_ns()
    name, tid, start, duration = lines[1]
    assert name == "encode" and duration >= 10_000_000 and start > lines[0][2]


def test_a_forked_child_records_into_a_file_of_its_own(folder: Path) -> None:
    spans.start(str(folder))
    with spans.span("read"):
        pass
    pid = os.fork()
    if pid == 0:  # the child: the parent's unflushed span is not its to write
        with spans.span("conform"):
            pass
        spans.flush()
        os._exit(0)
    os.waitpid(pid, 0)
    spans.flush()
    written = {p.name: [json.loads(x)[0] for x in p.read_text().splitlines()] for p in folder.glob("*.jsonl")}
    assert written == {
        f"spans-{os.getpid()}.jsonl": ["process", "read"],
        f"spans-{pid}.jsonl": ["process", "conform"],
    }


def test_the_trace_and_its_summary(folder: Path, tmp_path: Path) -> None:
    folder.mkdir()
    s = 1_000_000_000
    (folder / "spans-10.jsonl").write_text(
        "\n".join(
            json.dumps(x) for x in [["process", 0, 0, 0], ["run", 1, s, 4 * s], ["commit", 1, 5 * s, s // 2]]
        )
    )
    (folder / "spans-11.jsonl").write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                ["process", 0, s, 0],
                ["read", 2, 2 * s, s],
                ["encode", 3, 2 * s, 2 * s],
                ["wait for input", 2, 3 * s, s],
            ]
        )
    )
    path = tmp_path / "trace.json"
    summary = write_trace(str(folder), str(path), driver=10, run_start_ns=s, run_end_ns=6 * s)
    trace = json.loads(path.read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"read", "encode", "run", "commit", "start-up", "process_name"} <= names
    assert summary.stages == {
        "commit": 0.5,
        "read": 1.0,
        "encode": 2.0,
        "wait for input": 1.0,
        "start-up": 2.0,
    }
    # The worker worked 2 s (read and encode overlap on two threads) of the 5 s after it started.
    assert summary.processes == {11: (2.0, 3.0)}
    assert read_summary(str(path)) == summary
    lines = summary_lines(summary, str(path))
    assert lines[1].split()[0] == "encode" and "process 11: busy 2.00 s, idle 3.00 s" in lines[-1]
