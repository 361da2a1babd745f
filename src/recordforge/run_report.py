"""What a run converted and what it kept, from its metadata.json: the lines the CLI closes with."""

from __future__ import annotations

from typing import Any

__all__ = ["done_lines"]


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def done_lines(meta: dict[str, Any]) -> list[str]:
    """A line each for what the run appended and what it resumed (none for a plain build), so
    that a scheduler's log says what the run actually converted."""
    lines = []
    appended = meta.get("appended")
    if appended and not meta.get("skipped"):
        kept, new = appended["reused"], appended["converted"]
        lines.append(
            f"appended: converted {_n(new['files'], 'new file')} ({_n(new['rows_read'], 'row')}) into "
            f"{_n(new['shards'], 'shard')}; kept {_n(kept['shards'], 'shard')} ({_n(kept['rows'], 'row')}) "
            f"of {appended['base_version']} as they are"
        )
    resumed = meta.get("resumed")
    if resumed:
        lines.append(
            f"resumed: kept {_n(resumed['pieces'], 'finished piece')} ({_n(resumed['rows'], 'row')}, "
            f"{_n(resumed['parts'], 'part')}) of the interrupted run; "
            f"converted {_n(resumed['rows_converted'], 'row')}"
        )
    return lines
