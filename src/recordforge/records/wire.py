"""tf.train.Example decoded for a whole batch of records at once: entries in C, grouped with numpy."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recordforge.records import _native
from recordforge.records.wire_keys import KeyTable

__all__ = [
    "as_python",
    "Batch",
    "BYTES",
    "Column",
    "decode_batch",
    "FLOAT",
    "INT64",
    "kind_name",
    "NONE",
]

NONE, BYTES, FLOAT, INT64 = 0, 1, 2, 3
_KIND_NAMES = {NONE: "none", BYTES: "bytes", FLOAT: "float", INT64: "int64"}
# Zero bytes after the data: a read a little past a span never leaves the array (stats reads
# short strings as words up to 96 bytes past a value's start, and then need not copy the chunk).
_PAD = PAD = 128


@dataclass
class Column:
    """One feature over a batch: one entry per record that has it."""

    rec: np.ndarray  # record index of each entry
    kind: np.ndarray  # NONE, BYTES, FLOAT or INT64 per entry
    count: np.ndarray  # values per entry
    ints: np.ndarray  # values of the INT64 entries, entry after entry
    floats: np.ndarray  # values of the FLOAT entries
    blob: np.ndarray  # the bytes values of BYTES entries lie in blob[starts[i]:ends[i]]
    starts: np.ndarray
    ends: np.ndarray


@dataclass
class Batch:
    size: int
    columns: dict[str, Column]
    not_examples: list[int] = field(default_factory=list)  # records protobuf refuses too
    errors: dict[int, str] = field(default_factory=dict)


def _empty_column(blob: np.ndarray) -> Column:
    z = np.zeros(0, np.int64)
    return Column(z, np.zeros(0, np.int8), z, z, np.zeros(0, np.float32), blob, z, z)


def decode_batch(
    data: bytes | memoryview,
    starts: np.ndarray,
    ends: np.ndarray,
    keys: KeyTable,
    *,
    padded: np.ndarray | None = None,
) -> Batch:
    """Columns of every feature of the records data[starts[i]:ends[i]]; `padded`, where the
    caller has it: `data` followed by at least PAD zero bytes, as one uint8 array."""
    n = len(starts)
    if padded is not None and len(padded) >= len(data) + PAD:
        buf = padded
    else:
        buf = np.zeros(len(data) + _PAD, np.uint8)
        buf[: len(data)] = np.frombuffer(data, np.uint8)
    # One C pass over the records' map entries, grouped by name (_decode.c); a record outside
    # the canonical layout is `slow`, none of its entries kept, and goes to protobuf below.
    out = _native.decode_examples(
        data, np.ascontiguousarray(starts, np.int64), np.ascontiguousarray(ends, np.int64)
    )
    key_starts, key_lengths, rec, count, ints, b_starts, b_ends, bounds = (
        np.frombuffer(out[k], np.int64) for k in (0, 1, 2, 4, 5, 7, 8, 9)
    )
    kind = np.frombuffer(out[3], np.uint8)
    floats = np.frombuffer(out[6], np.dtype("<f4"))
    slow = np.frombuffer(out[10], bool)
    # Per name met: [entries, ints, floats, bytes values] before it, and after the last.
    at = bounds.reshape(-1, 4)
    met = np.flatnonzero(at[1:, 0] > at[:-1, 0])  # names of a slow record alone have no entry
    ids = keys.lookup(buf, key_starts[met], key_starts[met] + key_lengths[met])
    columns: dict[str, Column] = {}
    for local in met[np.argsort(ids, kind="stable")].tolist():
        (e0, i0, f0, b0), (e1, i1, f1, b1) = at[local].tolist(), at[local + 1].tolist()
        name = keys.names[int(ids[int(np.searchsorted(met, local))])]
        columns[name] = Column(
            rec=rec[e0:e1],
            kind=kind[e0:e1],
            count=count[e0:e1],
            ints=ints[i0:i1],
            floats=floats[f0:f1],
            blob=buf,
            starts=b_starts[b0:b1],
            ends=b_ends[b0:b1],
        )
    batch = Batch(n, columns)
    slow_records = np.flatnonzero(slow).tolist()
    if slow_records:
        _merge_slow(batch, [(r, bytes(data[int(starts[r]) : int(ends[r])])) for r in slow_records], buf)
    return batch


@dataclass
class _SlowEntries:
    """One feature's entries from the records protobuf parsed, gathered before they are added."""

    rec: list[int] = field(default_factory=list)
    kind: list[int] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    ints: list[int] = field(default_factory=list)
    floats: list[float] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # of bytes values, in the batch's new blob
    ends: list[int] = field(default_factory=list)


def _merge_slow(batch: Batch, records: list[tuple[int, bytes]], buf: np.ndarray) -> None:
    """(index, bytes) records through protobuf, appended to the batch's columns all at once:
    appended record by record, every column and the chunk's bytes were copied once a record."""
    from recordforge.records.example_pb import parse_example

    codes = {"none": NONE, "bytes": BYTES, "float": FLOAT, "int64": INT64}
    gathered: dict[str, _SlowEntries] = {}
    values_bytes: list[bytes] = []
    at = len(buf)  # where the next bytes value goes in the blob: after the chunk's own bytes
    for r, raw in records:
        try:
            record = parse_example(raw)
        except Exception as exn:  # protobuf's DecodeError and friends
            batch.not_examples.append(r)
            batch.errors[r] = f"not a tf.train.Example ({exn})"
            continue
        for name, (kind, values) in record.items():
            entries = gathered.setdefault(name, _SlowEntries())
            code = codes[kind]
            entries.rec.append(r)
            entries.kind.append(code)
            entries.count.append(len(values))
            if code == BYTES:
                for v in values:
                    entries.starts.append(at)
                    values_bytes.append(v)
                    at += len(v)
                    entries.ends.append(at)
            elif code == INT64:
                entries.ints.extend(values)
            elif code == FLOAT:
                entries.floats.extend(values)
    if not gathered:
        return
    blob = buf
    if values_bytes:
        blob = np.concatenate(
            [buf, np.frombuffer(b"".join(values_bytes), np.uint8), np.zeros(_PAD, np.uint8)]
        )
    for name, entries in gathered.items():
        col = batch.columns.get(name) or _empty_column(buf)
        batch.columns[name] = Column(
            np.concatenate([col.rec, np.array(entries.rec, np.int64)]),
            np.concatenate([col.kind, np.array(entries.kind, col.kind.dtype)]),
            np.concatenate([col.count, np.array(entries.count, np.int64)]),
            np.concatenate([col.ints, np.array(entries.ints, np.int64)]),
            np.concatenate([col.floats, np.array(entries.floats, np.float32)]),
            blob,
            np.concatenate([col.starts, np.array(entries.starts, np.int64)]),
            np.concatenate([col.ends, np.array(entries.ends, np.int64)]),
        )


def kind_name(code: int) -> str:
    return _KIND_NAMES[code]


def as_python(col: Column, i: int) -> tuple[str, list[Any]]:
    """Entry i as parse_example gives it (for tests and the odd record)."""
    kind = int(col.kind[i])
    sel = np.flatnonzero(col.kind == kind)
    j = int(np.searchsorted(sel, i))
    before = int(col.count[sel[:j]].sum())
    n = int(col.count[i])
    if kind == INT64:
        return "int64", col.ints[before : before + n].tolist()
    if kind == FLOAT:
        return "float", col.floats[before : before + n].tolist()
    if kind == BYTES:
        return "bytes", [
            col.blob[s:e].tobytes()
            for s, e in zip(
                col.starts[before : before + n].tolist(), col.ends[before : before + n].tolist(), strict=True
            )
        ]
    return "none", []
