"""What a killed or interrupted run's piece records promise its rerun, counted from the records
alone (src/recordforge/output/pieces.py says how they are written)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["finished_rows"]


def finished_rows(records: Iterable[dict[str, Any]]) -> int:
    """The rows of the batches whose every record the recorded parts hold: what a rerun keeps at
    least. `records` are the parsed `batches-*.json` and `part-*.json` files of a `_pieces/`."""
    ledger: dict[tuple[str, int], tuple[int, dict[str, int]]] = {}
    ranges: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for record in records:
        for file, first_row, rows, counts in record.get("batches", []):
            ledger[(file, first_row)] = (rows, counts)
        for split, file, first_row, start, end in record.get("keys", []):
            ranges.setdefault((split, file, first_row), []).append((start, end))
    finished = 0
    for (file, first_row), (rows, counts) in ledger.items():
        whole = True
        for split, n in counts.items():
            at = 0
            for start, end in sorted(ranges.get((split, file, first_row), [])):
                whole = whole and start == at
                at = end
            whole = whole and at == n
        finished += rows if whole else 0
    return finished
