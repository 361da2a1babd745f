"""A profiled run's spans as one Chrome trace (Perfetto loads it) and a summary of where time went."""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from recordforge.files.storage import open_read, write_atomically

__all__ = ["Summary", "read_summary", "summary_lines", "write_trace"]

# Spans that are waiting, not work: left out of a process's busy time and of the stages' shares
# ("run": the driver waiting for the pipeline, whose work its other spans show).
WAITS = frozenset({"wait for input", "wait for writer", "run"})


@dataclass(frozen=True)
class Summary:
    """Seconds per stage (all processes and threads), and per process its busy and idle time
    within the run's window."""

    wall: float
    stages: dict[str, float]
    processes: dict[int, tuple[float, float]]  # pid: (busy seconds, idle seconds)


def _load(folder: str) -> tuple[list[tuple[str, int, int, int, int]], dict[int, int]]:
    spans, started = [], {}
    for path in sorted(glob.glob(os.path.join(folder, "spans-*.jsonl"))):
        pid = int(os.path.basename(path)[6:-6])
        with open(path) as f:
            for line in f:
                name, tid, start, duration = json.loads(line)
                if name == "process":
                    started[pid] = start
                else:
                    spans.append((name, pid, tid, start, duration))
    return spans, started


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def write_trace(folder: str, path: str, *, driver: int, run_start_ns: int, run_end_ns: int) -> Summary:
    """Merges the spans recorded in `folder` into a Chrome trace-event JSON at `path` (each
    process's start-up as a span of its own) and sums them up for `summary_lines`."""
    spans, started = _load(folder)
    events: list[dict[str, Any]] = []
    origin = min([run_start_ns, *(s[3] for s in spans), *started.values()])
    pids = sorted({s[1] for s in spans} | set(started) | {driver})
    for pid in pids:
        name = "driver" if pid == driver else f"worker {pid}"
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}})
    for pid, at in started.items():
        first = min((s[3] for s in spans if s[1] == pid), default=at)
        if first > at:
            events.append(_event("start-up", pid, pid, at, first - at, origin))
    for name, pid, tid, start, duration in spans:
        events.append(_event(name, pid, tid, start, duration, origin))
    stages: dict[str, float] = defaultdict(float)
    busy: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for name, pid, _, start, duration in spans:
        if name != "run":
            stages[name] += duration / 1e9
        if name not in WAITS:
            busy[pid].append((start, start + duration))
    for pid, at in started.items():
        first = min((s[3] for s in spans if s[1] == pid), default=at)
        stages["start-up"] += max(0, first - at) / 1e9
    wall = (run_end_ns - run_start_ns) / 1e9
    processes = {}
    for pid in pids:
        if pid == driver and not any(
            s[1] == pid and s[0] not in WAITS | {"plan", "build", "commit"} for s in spans
        ):
            continue  # a driver that only planned, built, waited and committed: not a worker
        window = (run_end_ns - max(run_start_ns, started.get(pid, run_start_ns))) / 1e9
        worked = _union(busy.get(pid, [])) / 1e9
        processes[pid] = (worked, max(0.0, window - worked))
    summary = Summary(wall, dict(stages), processes)
    other = {"wall": wall, "stages": summary.stages, "processes": {str(k): v for k, v in processes.items()}}
    trace = {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"recordforge_summary": other}}
    write_atomically(path, json.dumps(trace).encode())
    return summary


def read_summary(path: str) -> Summary:
    """The summary a trace written by `write_trace` carries."""
    with open_read(path) as f:
        other = json.loads(f.read())["otherData"]["recordforge_summary"]
    processes = {int(k): (float(v[0]), float(v[1])) for k, v in other["processes"].items()}
    return Summary(float(other["wall"]), {k: float(v) for k, v in other["stages"].items()}, processes)


def _event(name: str, pid: int, tid: int, start: int, duration: int, origin: int) -> dict[str, Any]:
    return {
        "name": name,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": (start - origin) / 1e3,
        "dur": duration / 1e3,
    }


def summary_lines(summary: Summary, path: str) -> list[str]:
    """Where the time went: each stage's seconds and share of all recorded time, and each worker's
    idle time within the run."""
    total = sum(summary.stages.values()) or 1.0
    lines = [f"profile: {path} (open it in https://ui.perfetto.dev); {summary.wall:.2f} s wall"]
    for name, seconds in sorted(summary.stages.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {name:22} {seconds:8.2f} s  {100 * seconds / total:5.1f}%")
    for pid, (busy, idle) in sorted(summary.processes.items()):
        lines.append(f"  process {pid}: busy {busy:.2f} s, idle {idle:.2f} s of the run")
    return lines
