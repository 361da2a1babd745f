"""Resolving a run only reads: it never writes or locks, even over an output a killed run left
half-committed; the run that publishes takes the output's lock once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.output import lease as lease_module
from recordforge.pipelines.convert import run
from recordforge.pipelines.resolve import request_from_argv, resolve


def _args(tmp_path: Path) -> list[str]:
    src = tmp_path / "in" / "t.parquet"
    src.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"i": list(range(40)), "s": [f"r{i}" for i in range(40)]}), src)
    # One in-process worker: the spy on the lock sees every acquisition.
    out = tmp_path / "out"
    return ["--source", str(src), "--output", str(out), "--compression", "none", "--direct_num_workers", "1"]


def _killed_after_the_commit(tmp_path: Path) -> tuple[list[str], Path]:
    """An output whose last run was killed at the commit point: the top-level metadata.json names
    its version, and _SUCCESS and the other top-level copies were never written."""
    args = _args(tmp_path)
    env = {**os.environ, "RECORDFORGE_CRASH_AT": "committed"}
    done = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", *args], env=env, capture_output=True, timeout=300
    )
    assert done.returncode == -9, done.stderr.decode()[-2000:]
    out = tmp_path / "out"
    assert (out / layout.METADATA).exists() and not (out / layout.SUCCESS).exists()
    return args, out


def _snapshot(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file and folder under `out` with its modification time (and a file's bytes)."""
    return {
        str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(out.rglob("*"))
    }


@pytest.fixture
def spied_locks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The output paths of every lock acquired from now on."""
    taken: list[str] = []
    acquire = lease_module.Lease.acquire.__func__  # type: ignore[attr-defined]

    def spy(cls: type, path: str, *args: object, **kwargs: object) -> object:
        taken.append(path)
        return acquire(cls, path, *args, **kwargs)

    monkeypatch.setattr(lease_module.Lease, "acquire", classmethod(spy))
    return taken


@pytest.mark.parametrize("overwrite", [False, True])
def test_resolve_writes_nothing_over_a_killed_commit(
    tmp_path: Path, spied_locks: list[str], overwrite: bool
) -> None:
    """A refused run (no --overwrite) fails in resolve, where a run would; an allowed one resolves;
    neither writes, finishes the killed commit or takes the lock there. (Put back the
    `finish_interrupted_commit` call in `resolve` and this fails: _SUCCESS appears.)"""
    args, out = _killed_after_the_commit(tmp_path)
    before = _snapshot(out)
    request = request_from_argv([*args, *(["--overwrite"] if overwrite else [])])
    if overwrite:
        resolved = resolve(request.options, request.config)
        assert resolved.state is not None and resolved.state.version is not None
    else:
        with pytest.raises(RecordForgeError, match="overwrite"):
            resolve(request.options, request.config)
    assert _snapshot(out) == before
    assert spied_locks == []


def test_a_refused_run_still_finishes_the_killed_commit_under_the_lock(
    tmp_path: Path, spied_locks: list[str]
) -> None:
    """The output is left whole by the run that will not publish: _SUCCESS and the copies are
    written, under the lock, taken once."""
    args, out = _killed_after_the_commit(tmp_path)
    with pytest.raises(RecordForgeError, match="overwrite"):
        run(args)
    assert (out / layout.SUCCESS).exists()
    assert spied_locks == [layout.lock_path(str(out))]


@pytest.mark.parametrize("killed", [False, True])
def test_a_run_takes_the_lock_once(tmp_path: Path, spied_locks: list[str], killed: bool) -> None:
    """Fresh, or over a killed commit (which the publication finishes under its own lock: with the
    repair back in resolve, the lock was taken twice)."""
    if killed:
        args, out = _killed_after_the_commit(tmp_path)
        args = [*args, "--overwrite"]
    else:
        args, out = _args(tmp_path), tmp_path / "out"
    meta = run(args)
    assert meta["rows_written"] == 40
    assert (out / layout.SUCCESS).exists()
    assert spied_locks == [layout.lock_path(str(out))]
