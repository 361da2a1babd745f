"""What a run converted and what it kept, from its metadata.json: the lines the CLI closes with."""

from __future__ import annotations

from typing import Any

__all__ = ["done_lines", "kept_files"]


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
    if resumed and resumed.get("finished"):  # killed once its version was whole (output/finished.py)
        lines.append(
            f"resumed: kept the finished version of the interrupted run ({_n(resumed['rows'], 'row')}, "
            f"{kept_files(resumed)}), its shards checked; converted {_n(resumed['rows_converted'], 'row')}"
        )
    elif resumed:
        lines.append(
            f"resumed: kept {_n(resumed['pieces'], 'finished piece')} ({_n(resumed['rows'], 'row')}, "
            f"{kept_files(resumed)}) of the interrupted run; "
            f"converted {_n(resumed['rows_converted'], 'row')}"
        )
    estimated = meta.get("estimated")
    # An append's estimate is of its new files alone, its shards beside the kept ones: not comparable.
    if estimated and not (meta.get("skipped") or appended) and estimated.get("output_bytes") is not None:
        wrote = sum(int(shard["bytes"]) for shard in meta.get("shards", ()))
        off = (estimated["output_bytes"] / wrote - 1) * 100 if wrote else 0.0
        lines.append(
            f"planned: {_n(estimated['rows'] or 0, 'row')}, {estimated['output_bytes'] / 1e6:.1f} MB in "
            f"{_n(estimated['shards'] or 0, 'shard')}; wrote {wrote / 1e6:.1f} MB "
            f"(the plan's bytes {off:+.0f}%)"
        )
    return lines


def kept_files(resumed: dict[str, Any]) -> str:
    """What a rerun kept, e.g. "3 parts", "7 shards" or "3 parts and 7 shards": a rolling writer's
    kept files are parts (joined into shards by the rerun), a placed writer's whole shards."""
    counts = [(resumed.get("parts", 0), "part"), (resumed.get("shards", 0), "shard")]
    return " and ".join(_n(n, word) for n, word in counts if n) or _n(0, "part")
