"""Spans of a run's stages, recorded per process and thread when `--profile` asks, else nothing."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENV", "enabled", "flush", "process_start_ns", "record", "span", "start", "stop"]

# The folder each process of a profiled run appends its spans to (one file per process); forked
# workers inherit it with the environment. Unset: nothing is recorded, and a span costs one check.
ENV = "RECORDFORGE_PROFILE_DIR"
_FLUSH_AT = 4096

_lock = threading.Lock()
_spans: list[tuple[str, int, int, int]] = []  # (name, thread id, start ns, duration ns)
_dir: str | None = os.environ.get(ENV) or None
_announced = 0  # the pid whose start was written


def start(folder: str) -> None:
    """Records from now on, in this process and the processes it starts, into `folder`."""
    global _dir, _announced
    os.makedirs(folder, exist_ok=True)
    os.environ[ENV] = folder
    _dir, _announced = folder, 0


def enabled() -> bool:
    return _dir is not None


def stop() -> None:
    """Flushes and stops recording (the environment no longer names the folder)."""
    global _dir
    flush()
    os.environ.pop(ENV, None)
    _dir = None


def record(name: str, start_ns: int, end_ns: int) -> None:
    """A span of `name` on this thread, from `start_ns` to `end_ns` (time.perf_counter_ns)."""
    if _dir is None:
        return
    _spans.append((name, threading.get_native_id(), start_ns, end_ns - start_ns))
    if len(_spans) >= _FLUSH_AT:
        flush()


@contextmanager
def span(name: str) -> Iterator[None]:
    """Records the block as a span of `name` (nothing when not profiling)."""
    if _dir is None:
        yield
        return
    begin = time.perf_counter_ns()
    try:
        yield
    finally:
        record(name, begin, time.perf_counter_ns())


def flush() -> None:
    """Appends this process's spans to its file: called at the end of each bundle, since a
    forked worker may end without running atexit handlers."""
    if _dir is None or not _spans:
        return
    with _lock:
        taken = _spans[:]
        del _spans[: len(taken)]
    # perf_counter_ns is CLOCK_MONOTONIC on Linux: one clock for every process of the machine.
    global _announced
    if _announced != os.getpid():  # once per process: when it started, for its start-up span
        _announced = os.getpid()
        taken.insert(0, ("process", 0, process_start_ns(), 0))
    lines = "".join(json.dumps(s, separators=(",", ":")) + "\n" for s in taken)
    with open(os.path.join(_dir, f"spans-{os.getpid()}.jsonl"), "a") as f:
        f.write(lines)


def _after_fork() -> None:
    """A forked child starts with none of its parent's unflushed spans (the parent writes them)."""
    del _spans[:]


os.register_at_fork(after_in_child=_after_fork)


def process_start_ns() -> int:
    """When this process started, on the spans' clock (a forked worker: when it was forked)."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / ticks  # seconds after boot
    ago = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    return time.perf_counter_ns() - int(ago * 1e9)
