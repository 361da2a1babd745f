"""A placed writer's record of its finished shards (--deterministic, --shuffle), and which of a
killed run's shards, and so which of its batches, a rerun keeps.

A placed shard is a function of every batch's record count (its places) and of the records it
takes, so two kinds of JSON file join the rolling writer's in `_pieces/` (pieces.py; format:
docs/architecture.md), each written whole by the worker that made it:

- `placed-<hex>.json` (the placing step, once per worker and writer, after it has checked the
  counts against the killed run's it resumes, if any): the writer's shard count and the records
  of each batch `[file, first_row, records]`, the *layout* that decides every place;
- `shard-<hex>.json` (the shard writer, once a shard's temporary file is written): that file's
  path, records, bytes, sha256 and record index, and which shard of how many it is.

A rerun keeps a writer's shard when the writer's layouts all agree, the inputs are listed as the
killed run listed them (the same files, none changed), the shard count is this run's, and the
file's bytes hash to its sha256 (two intact copies of a shard, from a retried step, are the same
bytes; different bytes keep neither). It skips a batch recorded in the ledger when, in every
split it has records in, all of their places fall in kept shards (by position a run of places;
shuffled, only when the writer keeps every shard). The skipped batches' counts are handed to the
placing step, which checks that with the batches converted again they make the killed run's
layout exactly, before any place is given: the kept shards' bytes are then what this run would
write.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from recordforge.files import layout
from recordforge.files.storage import write_atomically

__all__ = [
    "PlacedKeep",
    "bounds",
    "kept_placed",
    "layout_digest",
    "layout_of",
    "placed_batches",
    "write_layout",
    "write_shard_record",
]

Batch = tuple[str, int]  # (file, first_row)
Count = tuple[str, int, int]  # (file, first_row, records)


def bounds(total: int, count: int) -> np.ndarray:
    """The first place of shards 1..count-1: shard s of S takes the places [sN/S, (s+1)N/S)."""
    return np.array([s * total // count for s in range(1, count)], dtype=np.uint64)


def layout_of(counts: Iterable[Count]) -> list[list[Any]]:
    """The counts as recorded and compared: sorted, batches with no record left out (they take
    no place, and whether a runner hands on an empty batch is not the input's business)."""
    return [[f, r, n] for f, r, n in sorted(counts) if n]


def layout_digest(batches: list[list[Any]]) -> str:
    return hashlib.sha256(json.dumps(batches).encode()).hexdigest()


def write_layout(folder: str, writer: str, count: int, batches: list[list[Any]]) -> None:
    record = {"writer": writer, "count": count, "layout": batches}
    write_atomically(layout.temp_file(folder, "placed", ".json"), json.dumps(record).encode())


def write_shard_record(folder: str, writer: str, shard: int, count: int, temp: dict[str, Any]) -> None:
    """Records a shard's temporary file (`temp`: tmp, records, bytes, sha256, index) once it is
    written: the record follows the bytes."""
    from recordforge.output import crashpoints

    record = {"writer": writer, "shard": shard, "count": count, **temp}
    write_atomically(layout.temp_file(folder, "shard", ".json"), json.dumps(record).encode())
    crashpoints.reached("piece_written")


@dataclass(frozen=True)
class PlacedKeep:
    """What a rerun keeps of one placed writer's work."""

    count: int  # the writer's shards
    layout: str  # the digest of the killed run's layout, which this run's counts must make
    shards: tuple[tuple[int, dict[str, Any]], ...]  # (shard, its record): kept, not written again
    counts: tuple[Count, ...] = ()  # the writer's records of the batches skipped

    @property
    def kept(self) -> frozenset[int]:
        return frozenset(s for s, _ in self.shards)


@dataclass(frozen=True)
class _Writer:
    count: int
    batches: list[list[Any]]
    firsts: dict[Batch, tuple[int, int]]  # (first place, records) of each batch
    total: int
    shards: dict[int, dict[str, Any]]
    edges: np.ndarray  # bounds(total, count)


def kept_placed(
    records: Iterable[dict[str, Any]],
    same_inputs: bool,
    counts: dict[str, int],
    intact: Callable[[dict[str, Any]], bool],
) -> dict[str, _Writer]:
    """Per placed writer of this run (`counts`: its shard count), the killed run's layout and
    the shards a rerun keeps (see the module); `same_inputs`: the inputs are listed as that run
    listed them, every file unchanged and none new or gone (a file anywhere moves places);
    `intact(record)`: the shard's file is there and hashes as recorded. A writer with nothing
    to keep is left out."""
    if not same_inputs:
        return {}
    layouts: dict[str, list[dict[str, Any]]] = {}
    shards: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        if "layout" in r:
            layouts.setdefault(r["writer"], []).append(r)
        elif "shard" in r:
            shards.setdefault((r["writer"], r["shard"]), []).append(r)
    out: dict[str, _Writer] = {}
    for writer, found in layouts.items():
        count = counts.get(writer)
        batches = found[0]["layout"]
        if count is None or any(r["count"] != count or r["layout"] != batches for r in found):
            continue  # layouts that disagree: nothing of the writer is trusted
        firsts, total = {}, 0
        for f, first_row, n in batches:
            firsts[(f, first_row)] = (total, n)
            total += n
        kept: dict[int, dict[str, Any]] = {}
        for (w, shard), copies in shards.items():
            good = [c for c in copies if w == writer and c["count"] == count and intact(c)]
            if good and len({c["sha256"] for c in good}) == 1:
                kept[shard] = min(good, key=lambda c: c["tmp"])
        if kept:
            out[writer] = _Writer(count, batches, firsts, total, kept, bounds(total, count))
    return out


def _within(writer: _Writer | None, batch: Batch, n: int, shuffled: bool) -> bool:
    """The batch's `n` records of this writer all have places in its kept shards."""
    if writer is None or writer.firsts.get(batch, (0, -1))[1] != n:
        return False
    if shuffled:  # a permuted batch's records are spread over every shard
        return len(writer.shards) == writer.count
    first = writer.firsts[batch][0]
    ends = np.array([first, first + n - 1], dtype=np.uint64)
    lo, hi = np.searchsorted(writer.edges, ends, side="right")
    return all(s in writer.shards for s in range(int(lo), int(hi) + 1))


def placed_batches(
    ledger: dict[Batch, tuple[int, dict[str, int]]],
    writers: dict[str, _Writer],
    *,
    shuffled: bool,
    published: frozenset[str] = frozenset(),
) -> tuple[set[Batch], dict[str, PlacedKeep]]:
    """The recorded batches whose records, in every split, all lie in kept shards (or in the
    shards of a writer that `published` them: it did so once every batch was placed), and what
    each writer keeps: its shards, and the counts of the skipped batches for its placing step."""
    done: set[Batch] = set()
    for batch, (_, records) in ledger.items():
        placed = (
            not n
            or (split or "data") in published
            or _within(writers.get(split or "data"), batch, n, shuffled)
            for split, n in records.items()
        )
        if all(placed):
            done.add(batch)
    keeps = {}
    for name, w in writers.items():
        skipped = tuple((f, r, n) for f, r, n in w.batches if (f, r) in done)
        keeps[name] = PlacedKeep(w.count, layout_digest(w.batches), tuple(sorted(w.shards.items())), skipped)
    return done, keeps
