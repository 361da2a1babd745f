"""--profile: a conversion's timeline from every worker, and the same output as without it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

import recordforge
from bench.table import make_table
from recordforge.tracing.trace import read_summary


def test_a_profiled_run_traces_every_worker_and_writes_the_same_bytes(tmp_path: Path) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(make_table(60_000), src, row_group_size=10_000)
    flags = {"direct_num_workers": 2, "direct_running_mode": "multi_processing", "deterministic": True}
    plain = recordforge.convert(str(src), str(tmp_path / "plain"), num_shards=2, **flags)
    trace = tmp_path / "trace.json"
    profiled = recordforge.convert(
        str(src), str(tmp_path / "profiled"), num_shards=2, profile=str(trace), **flags
    )
    assert [s["sha256"] for s in profiled["shards"]] == [s["sha256"] for s in plain["shards"]]
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    by_stage: dict[str, set[int]] = {}
    for e in spans:
        by_stage.setdefault(e["name"], set()).add(e["pid"])
    for stage in ("read", "conform", "encode", "start-up", "commit"):
        assert stage in by_stage, (stage, sorted(by_stage))
    # Forked workers traced, each as a process of its own beside the driver (which one encodes
    # what is theirs to share out).
    (driver,) = by_stage["plan"]
    assert by_stage["encode"] - {driver} and len(by_stage["start-up"]) >= 2
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
    summary = read_summary(str(trace))
    assert summary.wall > 0 and len(summary.processes) >= 2
    assert sum(summary.stages.values()) > 0
