"""Two runs on one output, interleaved at each named step of the publishing protocol: every order
ends with both published one after the other, or one failed at once naming the lock's holder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from independent import file_records

from recordforge.files import layout
from recordforge.output import publishing
from recordforge.output.lease import Lease
from recordforge.pipelines.convert import run
from recordforge.tools.verify import verify


def _source(folder: Path, run_no: int, rows: int = 50) -> str:
    """A tiny input whose records say which run wrote them."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"run{run_no}.parquet"
    pq.write_table(pa.table({"run": [run_no] * rows, "i": list(range(rows))}), path)
    return str(path)


def _args(source: str, out: Path) -> list[str]:
    return ["--source", source, "--output", str(out), "--overwrite", "--compression", "none"]


def _runs_published(out: Path) -> set[int]:
    """The `run` values of the published records (one run's, if publishing never mixes)."""
    from conftest import example_to_dict

    meta = json.loads((out / layout.METADATA).read_text())
    return {
        example_to_dict(raw)["run"][0]
        for shard in meta["shards"]
        for raw in file_records(str(out / shard["file"]), meta["compression"])
    }


def _once_at(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, before: Callable[[], None]) -> None:
    """Runs `before` the first time `owner.name` is called (a named point of the protocol)."""
    original = getattr(owner, name)
    done: list[bool] = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(True)
            before()
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapped)


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    run(_args(_source(tmp_path / "in", 0), out))
    return tmp_path / "in", out


def test_a_run_published_while_another_was_prepared_is_replaced(
    published: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """B reads the output's state and builds its pipeline; A then takes the lock, publishes and
    releases it; only then does B take the lock. B must publish over A (both exit 0, one after
    the other), not fail because the state it was built against has changed."""
    src, out = published
    first: list[dict[str, Any]] = []
    _once_at(monkeypatch, publishing.Lease, "acquire", lambda: first.append(run(_args(_source(src, 1), out))))
    second = run(_args(_source(src, 2), out))
    assert second["previous_version"] == first[0]["version"]
    assert _runs_published(out) == {2} and verify(str(out)) == []


def test_a_run_published_just_after_another_released_does_not_fail_it(
    published: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publishes and releases its lock; B takes the lock and publishes before A looks at what it
    published. A published, and must say so (exit 0), not "published nothing"."""
    src, out = published
    original = Lease.release
    later: list[subprocess.CompletedProcess[str]] = []

    def release_then_another_run(lease: Lease) -> None:
        original(lease)
        if not later:  # another process: a second pipeline in this one would run inside A's
            cmd = [sys.executable, "-m", "recordforge", "convert", *_args(_source(src, 2), out)]
            later.append(subprocess.run(cmd, capture_output=True, text=True, timeout=300))

    monkeypatch.setattr(Lease, "release", release_then_another_run)
    first = run(_args(_source(src, 1), out))
    assert later[0].returncode == 0, later[0].stderr
    assert json.loads((out / layout.METADATA).read_text())["previous_version"] == first["version"]
    assert _runs_published(out) == {2} and verify(str(out)) == []
