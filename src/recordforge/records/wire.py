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
    for r in np.flatnonzero(slow).tolist():
        _merge_slow(batch, r, bytes(data[int(starts[r]) : int(ends[r])]), buf)
    return batch


def _merge_slow(batch: Batch, r: int, raw: bytes, buf: np.ndarray) -> None:
    """One record through protobuf, appended to the batch's columns."""
    from recordforge.records.example_pb import parse_example

    try:
        record = parse_example(raw)
    except Exception as exn:  # protobuf's DecodeError and friends
        batch.not_examples.append(r)
        batch.errors[r] = f"not a tf.train.Example ({exn})"
        return
    codes = {"none": NONE, "bytes": BYTES, "float": FLOAT, "int64": INT64}
    for name, (kind, values) in record.items():
        col = batch.columns.get(name) or _empty_column(buf)
        code = codes[kind]
        blob, starts, ends = col.blob, col.starts, col.ends
        ints, floats = col.ints, col.floats
        if code == BYTES and values:
            joined = b"".join(values)
            lengths = np.array([len(v) for v in values], np.int64)
            base = len(blob)
            blob = np.concatenate([blob, np.frombuffer(joined, np.uint8)])
            new_starts = base + np.cumsum(lengths) - lengths
            starts, ends = np.append(starts, new_starts), np.append(ends, new_starts + lengths)
        elif code == INT64:
            ints = np.append(ints, np.asarray(values, np.int64))
        elif code == FLOAT:
            floats = np.append(floats, np.asarray(values, np.float32))
        batch.columns[name] = Column(
            np.append(col.rec, r),
            np.append(col.kind, np.int8(code)),
            np.append(col.count, len(values)),
            ints,
            floats,
            blob,
            starts,
            ends,
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
