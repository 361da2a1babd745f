"""probe.parquet_footers: each footer read once, and a recorded interrupt honoured between files."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge import interrupts
from recordforge.errors import Interrupted
from recordforge.sources import probe


def _files(tmp_path: Path, n: int) -> list[str]:
    paths = []
    for i in range(n):
        path = tmp_path / f"t{i}.parquet"
        pq.write_table(pa.table({"x": list(range(i + 1))}), path)
        paths.append(str(path))
    return paths


def test_footers_of_every_file(tmp_path: Path) -> None:
    paths = _files(tmp_path, 3)
    footers = probe.parquet_footers(paths)
    assert footers is not None and [footers[p].num_rows for p in paths] == [1, 2, 3]


def test_an_interrupt_recorded_while_footers_are_read_ends_the_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the footers of many remote files are read: the handler only records it, and
    the next file's read is not started. Mutation: the loop's `interrupts.check()` removed (the
    reading goes on to the last file, as it did for minutes on a bucket of thousands)."""
    paths = _files(tmp_path, 4)
    opened: list[str] = []
    real = probe.open_source

    def opening(path: str) -> Any:
        opened.append(path)
        interrupts.record(signal.SIGINT)  # as the handler does, mid-read
        return real(path)

    monkeypatch.setattr(probe, "open_source", opening)
    interrupts.clear()
    try:
        with pytest.raises(Interrupted):
            probe.parquet_footers(paths)
    finally:
        interrupts.clear()
    assert opened == paths[:1]
