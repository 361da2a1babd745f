"""A local conversion without runner flags uses every core, but a small one keeps one worker
(pipelines/resolve.py): the pipeline that runs is made with the workers resolve decided."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge.pipelines.convert import run
from recordforge.runners import workers as workers_module


@pytest.mark.parametrize("small", [True, False], ids=["small", "large"])
def test_the_run_gets_the_workers_resolve_decided(
    small: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pq.write_table(pa.table({"x": list(range(1000))}), tmp_path / "t.parquet")
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda _: {0, 1, 2, 3})
    if not small:
        monkeypatch.setattr(workers_module, "SMALL_ROWS", 1000)
    with caplog.at_level(logging.INFO, logger="recordforge.runners.local_runner"):
        meta = run(["--source", str(tmp_path / "t.parquet"), "--output", str(tmp_path / "out")])
    assert meta["num_records"] == 1000
    started = [r.getMessage() for r in caplog.records if "multi_processing workers" in r.getMessage()]
    assert len(started) == (0 if small else 1), started
