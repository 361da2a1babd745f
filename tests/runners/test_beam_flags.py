"""Beam's flags as a table: the same as Beam declares, and the same answers as Beam's own parse."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recordforge.errors import UsageError
from recordforge.pipelines.command_line import check_command_line
from recordforge.pipelines.options import check_flags
from recordforge.runners.beam_flags import BEAM_FLAGS, BEAM_VERSION


def test_the_table_is_what_beam_declares() -> None:
    """In a fresh process (the suite's own options classes would add flags): regenerate with
    `python -m recordforge.runners.beam_flags > src/recordforge/runners/beam_flag_table.py`,
    then `ruff format` it."""
    code = (
        "from recordforge.runners.beam_flags import table_from_beam;"
        "v, rows = table_from_beam(); print(repr((v, tuple(rows))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    version, rows = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307 (our own repr)
    assert (version, rows) == (BEAM_VERSION, BEAM_FLAGS), "the table is stale: regenerate it"


@pytest.mark.parametrize(
    "argv",
    [
        ["--source", "a.parquet", "--output", "out"],
        ["--source=a.parquet", "--output=out", "--num_shards", "3", "--runner", "DataflowRunner"],
        ["--experiments", "a", "--experiments", "b", "--streaming", "--direct_num_workers", "2"],
        ["--direct_running_mode", "multi_processing", "--shuffle", "--seed", "7"],
        ["--num-shards", "2"],
        ["--direct_num_workrs", "2"],
        ["--direct_num_workers", "two"],
        ["--direct_running_mode", "threads"],
        ["--source", "a", "b"],
        ["--temp_location"],
        ["--streaming=true"],
        ["-"],
    ],
)
def test_the_table_answers_as_beams_parse_does(argv: list[str]) -> None:
    """Whatever the check before Beam refuses, Beam's own parse refuses, with the same line."""

    def answer(check: object) -> str | None:
        try:
            check(list(argv))  # type: ignore[operator]
        except UsageError as exn:
            return str(exn)
        return None

    assert answer(check_command_line) == answer(check_flags)
