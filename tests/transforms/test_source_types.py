"""expand_patterns: every pattern listed now, none matching is an error, and a recorded interrupt
is honoured between patterns."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from recordforge import interrupts
from recordforge.errors import Interrupted, SourceError
from recordforge.transforms import source_types


def test_patterns_are_listed_and_one_matching_nothing_is_an_error(tmp_path: Path) -> None:
    for name in ("b.csv", "a.csv"):
        (tmp_path / name).write_text("x\n1\n")
    got = source_types.expand_patterns([str(tmp_path / "*.csv"), str(tmp_path / "a.csv")])
    assert [f.path for f in got] == [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    with pytest.raises(SourceError, match=r"input pattern '.*\*\.parquet' matched no files"):
        source_types.expand_patterns([str(tmp_path / "*.parquet")])


def test_an_interrupt_recorded_while_listing_ends_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a bucket is listed: the handler only records it, and the next pattern is not
    listed. Mutation: the loop's `interrupts.check()` removed (every pattern is listed first)."""
    (tmp_path / "a.csv").write_text("x\n1\n")
    listed: list[str] = []
    real = source_types.match

    def listing(pattern: str) -> Any:
        listed.append(pattern)
        interrupts.record(signal.SIGINT)  # as the handler does, mid-listing
        return real(pattern)

    monkeypatch.setattr(source_types, "match", listing)
    interrupts.clear()
    try:
        with pytest.raises(Interrupted):
            source_types.expand_patterns([str(tmp_path / "a.csv")] * 3)
    finally:
        interrupts.clear()
    assert listed == [str(tmp_path / "a.csv")]
