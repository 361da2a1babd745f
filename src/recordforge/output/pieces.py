"""The run's record of finished pieces, and which of a killed run's pieces a rerun may keep.

A piece is a source batch, `(file, first_row)`: the unit every reader yields. Two kinds of small
JSON files, each written whole (`write_atomically`) in the version folder's `_pieces/` by the
worker that made it, so that no file is shared or modified (format: docs/architecture.md):

- `batches-<hex>.json` (the encoder: a batch each on a local disk, a few seconds' batches at a
  time on an object store): each batch's rows and its records per split; only batches with no
  rejected row are recorded;
- `part-<hex>.json` (the rolling writer, once a part is closed): the temporary part (path, records,
  bytes, sha256, segments, its record index if any) and, per batch key, the range of that
  batch's records it holds;
- `published-<hex>.json` (either writer, before it moves its shards to their final names): each
  shard's final name, records, bytes, sha256 and index: the writer is finished.

A rerun keeps a part when the file of every batch it holds is as the killed run listed it, its
bytes still hash to its sha256, and no other part holds any of the same records (a retried step
wrote them twice: neither is kept). It skips a batch when it is recorded and the kept parts hold
each of its splits' records; a batch the kept parts hold only some records of (its part was cut
while the rest was still being written) is converted again, and the writers drop the records
already held (`Reuse.held`): encoding is deterministic, so a record's place in its batch is too.
Placed writers record whole shards instead, and keep them by their own rules (placed_pieces.py).
A writer that published keeps its shards as they are, where the inputs are listed exactly as the
killed run listed them (its shards hold records of every file), every shard is there with its
size and sha256 and its records agree; its records are then never written again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from recordforge.files import layout
from recordforge.files.storage import exists, list_files, open_read, read_bytes, stat, write_atomically
from recordforge.output.finished import finished_resumed
from recordforge.output.placed_pieces import PlacedKeep, kept_placed, placed_batches

__all__ = ["BatchLedger", "Reuse", "part_record", "reusable", "write_part_record", "write_published_record"]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the name users see
# A ledger file every this many seconds of a worker's batches, at its end, and before a part's
# record (write_part_record), not synced: a file per batch would cost more than the batch on an
# object store, and on a local disk it was two file creations per batch with the claims. A batch
# is skipped only where kept parts hold its records, and a part's record is written after its
# batches', so a later ledger file loses a rerun nothing; a record a power cut loses or garbles
# is not read (its batch is converted again).
_FLUSH_S = 2.0

Batch = tuple[str, int]  # (file, first_row)
BatchKey = tuple[str, str, int]  # (split, file, first_row)


class BatchLedger:
    """The encoder's side: batches recorded as they are encoded, written a few seconds' worth at
    a time (one file per flush: on an object store a write per batch would cost more than the
    batch). A batch not yet flushed when the run dies is simply converted again."""

    def __init__(self, folder: str) -> None:
        self._folder = folder
        self._pending: list[list[Any]] = []
        self._lock = threading.Lock()  # a part closed in another thread flushes it (below)
        self._since = time.monotonic()
        _LEDGERS.add(self)

    def add(self, file: str, first_row: int, rows: int, records: dict[str, int]) -> None:
        with self._lock:
            self._pending.append([file, first_row, rows, records])
        if time.monotonic() - self._since >= _FLUSH_S:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._since = time.monotonic()
        if pending:
            path = layout.temp_file(self._folder, "batches", ".json")
            write_atomically(path, json.dumps({"batches": pending}).encode(), sync=False)


# The ledgers of this process: a part's record is written after theirs, so that the batches a
# closed part holds are recorded with it (the encoder and the writer share a worker's process
# where the runner fuses them), not up to _FLUSH_S later.
_LEDGERS: weakref.WeakSet[BatchLedger] = weakref.WeakSet()


def part_record(writer: str, part: dict[str, Any], keys: Iterable[list[Any]]) -> dict[str, Any]:
    """A closed part's record: `part` as the writer describes it, and per batch key (split, file,
    first_row) the range [start, end) of that batch's records it holds."""
    return {"writer": writer, **part, "keys": [[*key, start, end] for key, start, end in keys]}


def write_part_record(folder: str, record: dict[str, Any]) -> None:
    from recordforge.output import crashpoints

    for ledger in list(_LEDGERS):
        ledger.flush()
    write_atomically(layout.temp_file(folder, "part", ".json"), json.dumps(record).encode())
    crashpoints.reached("piece_written")


def write_published_record(folder: str, writer: str, shards: list[dict[str, Any]]) -> None:
    """Records, before a writer moves its shards into place, what each final name will hold
    (`file`, records, bytes, sha256, `index`): synced, so that it is there whenever they are."""
    record = {"writer": writer, "published": shards}
    write_atomically(layout.temp_file(folder, "published", ".json"), json.dumps(record).encode())


@dataclass(frozen=True)
class Reuse:
    """What a rerun keeps of a killed run's version folder."""

    version: str
    parts: dict[str, tuple[dict[str, Any], ...]]  # by writer: the part records kept
    batches: frozenset[Batch]  # source batches not to convert again
    rows: int  # the rows of those batches
    # By writer, the batches converted again of which kept parts hold some records: per batch key
    # (split, file, first_row), the ranges [start, end) of its records not to write again.
    held: dict[str, dict[BatchKey, tuple[tuple[int, int], ...]]] = field(default_factory=dict)
    batch_rows: dict[Batch, int] = field(default_factory=dict)  # the rows of each of `batches`
    placed: dict[str, PlacedKeep] = field(default_factory=dict)  # by placed writer (placed_pieces.py)
    # By writer, the shards of a writer that published them, at their final names: kept as they are.
    published: dict[str, tuple[dict[str, Any], ...]] = field(default_factory=dict)
    # The killed run's own manifest, where its version was finished: committed as it is (finished.py).
    finished: dict[str, Any] | None = None

    @property
    def _temporary(self) -> list[dict[str, Any]]:
        kept = [p for parts in self.parts.values() for p in parts]
        return kept + [r for keep in self.placed.values() for _, r in keep.shards]

    @property
    def files(self) -> frozenset[str]:
        """The kept parts' and shards' files, their record indexes among them."""
        tmp = [(p["tmp"], p.get("index")) for p in self._temporary]
        final = [(s["file"], s.get("index")) for shards in self.published.values() for s in shards]
        return frozenset(f for pair in [*tmp, *final] for f in pair if f)

    @property
    def temp_dirs(self) -> frozenset[str]:
        """The killed run's writer folders the kept temporary files lie in, deleted at the commit
        (published shards lie in the version folder itself, which is not a temporary)."""
        return frozenset(p["tmp"].rsplit("/", 1)[0] for p in self._temporary)

    @property
    def empty(self) -> bool:
        """Nothing kept: the rerun may as well start clean."""
        return not self.batches and not self.placed and not self.published and self.finished is None

    def describe(self) -> dict[str, Any]:
        """metadata.json's `resumed`: a rolling writer's kept files are parts (joined into shards
        by this run), a placed writer's are whole shards, so they are counted apart."""
        if self.finished is not None:
            return finished_resumed(self.version, self.finished)
        return {
            "version": self.version,
            "pieces": len(self.batches),
            "rows": self.rows,
            "parts": sum(len(p) for p in self.parts.values()),
            "shards": sum(len(keep.shards) for keep in self.placed.values())
            + sum(len(shards) for shards in self.published.values()),
        }


def _records(folder: str) -> Iterator[dict[str, Any]]:
    for path in list_files(folder):
        if path.endswith(".json"):
            try:
                yield json.loads(read_bytes(path))
            except ValueError:  # never written in part (atomic writes); not ours to trust
                continue


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open_read(path) as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _intact(part: dict[str, Any], path: str = "tmp") -> bool:
    """The part's (or a published shard's, `path="file"`) size and bytes are as recorded, and
    its record index (if it has one) is there."""
    index = part.get("index")
    if index is not None and not exists(index):
        return False
    if not exists(part[path]):
        return False
    if path == "file" and stat(part[path]).size != part["bytes"]:  # a published shard: cheap first
        return False
    return _sha256(part[path]) == part["sha256"]


def _published(records: list[dict[str, Any]], same_inputs: bool) -> dict[str, tuple[dict[str, Any], ...]]:
    """By writer, the shards it published, each checked against the record written before they
    were moved; a writer recorded twice with different shards (which is not known) keeps none."""
    found: dict[str, list[list[dict[str, Any]]]] = {}
    for record in records:
        if "published" in record:
            found.setdefault(record["writer"], []).append(record["published"])
    if not same_inputs:  # a new, gone or changed file has records in every one of its shards
        return {}
    kept = {}
    for writer, copies in found.items():
        shards = copies[0]
        if all(c == shards for c in copies) and all(_intact(s, "file") for s in shards):
            kept[writer] = tuple(shards)
    return kept


def reusable(
    output: str,
    version: str,
    listed_then: dict[str, list[Any]],
    listed_now: dict[str, list[Any]],
    *,
    placed: dict[str, int] | None = None,
    shuffled: bool = False,
) -> Reuse:
    """The pieces of the killed run `version` that a rerun keeps (see the module). `listed_then`
    and `listed_now`: {path: [size, modified]} of the inputs as that run and this one listed them.
    `placed`: the shard count of each writer, where the writers are placed (placed_pieces.py;
    `shuffled`: their places permuted)."""
    folder = layout.pieces_dir(layout.version_root(output, version))
    ledger: dict[Batch, tuple[int, dict[str, int]]] = {}
    parts: list[dict[str, Any]] = []
    records = list(_records(folder))  # none when there is no folder (an object store has none)
    for record in records:
        for file, first_row, rows, counts in record.get("batches", []):
            if listed_then.get(file) is not None and listed_then.get(file) == listed_now.get(file):
                ledger[(file, first_row)] = (rows, counts)
        if "tmp" in record and "keys" in record:
            parts.append(record)
    unchanged = {f for f, listed in listed_then.items() if listed is not None and listed == listed_now.get(f)}
    published = _published(records, listed_then == listed_now)
    if placed is not None:
        writers = kept_placed(records, listed_then == listed_now, placed, _intact)
        writers = {w: kept for w, kept in writers.items() if w not in published}
        done, keeps = placed_batches(ledger, writers, shuffled=shuffled, published=frozenset(published))
        rows = {b: ledger[b][0] for b in done}
        return Reuse(version, {}, frozenset(done), sum(rows.values()), {}, rows, keeps, published)
    parts = [p for p in parts if all(k[1] in unchanged for k in p["keys"]) and p["writer"] not in published]
    parts = [p for p in _without_overlaps(parts) if _intact(p)]
    batches = _covered(ledger, parts, frozenset(published))
    held: dict[str, dict[BatchKey, list[tuple[int, int]]]] = {}
    for p in parts:
        for split, file, first_row, start, end in p["keys"]:
            if (file, first_row) not in batches:
                held.setdefault(p["writer"], {}).setdefault((split, file, first_row), []).append((start, end))
    by_writer: dict[str, list[dict[str, Any]]] = {}
    for p in parts:
        by_writer.setdefault(p["writer"], []).append(p)
    rows = sum(ledger[b][0] for b in batches)
    return Reuse(
        version,
        {w: tuple(ps) for w, ps in by_writer.items()},
        frozenset(batches),
        rows,
        {w: {k: tuple(sorted(r)) for k, r in keys.items()} for w, keys in held.items()},
        {b: ledger[b][0] for b in batches},
        published=published,
    )


def _without_overlaps(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parts less those holding a record another part holds too (a step retried after it
    wrote: which copy the killed run would have published is not known)."""
    ranges: dict[tuple[str, str, int], list[tuple[int, int, int]]] = {}
    for i, p in enumerate(parts):
        for split, file, first_row, start, end in p["keys"]:
            ranges.setdefault((split, file, first_row), []).append((start, end, i))
    bad: set[int] = set()
    for spans in ranges.values():
        spans.sort()
        reach, owner = -1, -1
        for start, end, i in spans:
            if start < reach:
                bad |= {i, owner}
            if end > reach:
                reach, owner = end, i
    return [p for i, p in enumerate(parts) if i not in bad]


def _covered(
    ledger: dict[Batch, tuple[int, dict[str, int]]], parts: list[dict[str, Any]], published: frozenset[str]
) -> set[Batch]:
    """The recorded batches whose every split's records the `parts` hold exactly once (a retried
    step may have written a batch twice: then neither copy counts) or a `published` writer holds
    (it published after every batch was written to it)."""
    ranges: dict[tuple[str, str, int], list[tuple[int, int]]] = {}
    for p in parts:
        for split, file, first_row, start, end in p["keys"]:
            ranges.setdefault((split, file, first_row), []).append((start, end))
    done = set()
    for (file, first_row), (_, records) in ledger.items():
        whole = True
        for split, n in records.items():
            if (split or "data") in published:
                continue
            at = 0
            for start, end in sorted(ranges.get((split, file, first_row), [])):
                if start != at:
                    whole = False
                at = end
            whole = whole and at == n
        if whole:
            done.add((file, first_row))
    return done
