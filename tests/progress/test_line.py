"""The one progress line: its text for conversions and scans, and a terminal's line rewritten."""

from __future__ import annotations

import io

import pytest

from recordforge.progress.line import LiveLine, clock, progress_text


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.0, "0:00"), (59.9, "0:59"), (61, "1:01"), (3599, "59:59"), (3725, "1:02:05")]
)
def test_clock(seconds: float, text: str) -> None:
    assert clock(seconds) == text


@pytest.mark.parametrize(
    ("args", "kwargs", "text"),
    [
        (
            ("converting", 250_000, "rows", 2.0),
            {"total": 1_000_000},
            "converting: 250,000 rows of 1,000,000 (25%), 125,000 rows/s, 0:02 elapsed, ETA 0:06",
        ),
        (
            ("converting", 0, "rows", 0.0),
            {"total": 10},
            "converting: 0 rows of 10 (0%), 0 rows/s, 0:00 elapsed",
        ),
        (
            ("converting", 12, "rows", 1.0),
            {"total": 10},
            "converting: 12 rows of 10 (100%), 12 rows/s, 0:01 elapsed",
        ),
        (
            ("stats", 3_000, "records", 10.0),
            {"files": (1, 4), "share": 0.25},
            "stats: 3,000 records, 1/4 files, 300 records/s, 0:10 elapsed, ETA 0:30",
        ),
        (
            ("verify", 5, "records", 1.0),
            {"files": (2, 2), "share": 1.0},
            "verify: 5 records, 2/2 files, 5 records/s, 0:01 elapsed",
        ),
    ],
)
def test_progress_text(args: tuple, kwargs: dict, text: str) -> None:
    assert progress_text(*args, **kwargs) == text


def test_a_terminal_line_is_rewritten_and_cleared() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=True)
    line.show("long text")
    line.show("short")
    line.clear()
    assert out.getvalue() == "\rlong text" + "\rshort    " + "\r     \r"


def test_elsewhere_each_text_is_a_line() -> None:
    out = io.StringIO()
    line = LiveLine(out, tty=False)
    line.show("one")
    line.show("two")
    line.clear()
    assert out.getvalue() == "one\ntwo\n"
