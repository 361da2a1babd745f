"""run_report: the closing lines say what a run appended and what it kept, parts and shards apart."""

from __future__ import annotations

from typing import Any

import pytest

from recordforge.output.run_report import done_lines


def _resumed(parts: int, shards: int) -> dict[str, Any]:
    return {"resumed": {"version": "v-x", "pieces": 7, "rows": 7000, "parts": parts, "shards": shards,
                        "rows_converted": 3000}}  # fmt: skip


@pytest.mark.parametrize(
    ("parts", "shards", "kept"),
    [
        (3, 0, "3 parts"),  # a rolling writer's parts, joined into shards by the rerun
        (0, 7, "7 shards"),  # a placed writer's (--deterministic, --shuffle) whole shards
        (1, 1, "1 part and 1 shard"),
        (0, 0, "0 parts"),
    ],
)
def test_a_resumed_run_reports_kept_parts_and_kept_shards_apart(parts: int, shards: int, kept: str) -> None:
    assert done_lines(_resumed(parts, shards)) == [
        f"resumed: kept 7 finished pieces (7,000 rows, {kept}) of the interrupted run; converted 3,000 rows"
    ]


def test_an_append_reports_what_it_converted_and_kept() -> None:
    meta = {
        "appended": {
            "base_version": "v-base",
            "reused": {"shards": 4, "rows": 2100},
            "converted": {"files": 1, "shards": 1, "rows_read": 700},
        }
    }
    assert done_lines(meta) == [
        "appended: converted 1 new file (700 rows) into 1 shard; "
        "kept 4 shards (2,100 rows) of v-base as they are"
    ]
    assert done_lines({**meta, "skipped": True}) == [] and done_lines({}) == []
