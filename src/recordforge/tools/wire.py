"""tf.train.Example decoded for a whole batch of records at once, with numpy.

The wire format is walked one nesting level at a time (Example, Features, map entry, Feature,
list), and at each level every message of the batch advances by one field per round: a round
costs a few array operations over all records, and there are as many rounds as a record has
fields at that level (its features), not as many as there are records. Records laid out in a way
this path does not take (unknown or repeated fields, unpacked numbers, duplicate keys) are
decoded by protobuf, one by one, and merged into the same columns; a record protobuf refuses is
reported as not a tf.train.Example.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["BYTES", "FLOAT", "INT64", "NONE", "Batch", "Column", "KeyTable", "decode_batch"]

NONE, BYTES, FLOAT, INT64 = 0, 1, 2, 3
_KIND_NAMES = {NONE: "none", BYTES: "bytes", FLOAT: "float", INT64: "int64"}
_PAD = 16  # zero bytes after the data, so that a varint read past a span never leaves the array


def _varint(buf: np.ndarray, pos: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, position after it, ok) of the varint at each position; one round per byte of the
    longest varint, over only the varints still going (most are one byte: one round)."""
    b = buf[pos]
    going = np.flatnonzero(b >= 0x80)
    if not len(going):
        after = pos + 1
        return b.astype(np.int64), after, after <= end
    value = (b & 0x7F).astype(np.uint64)
    size = np.ones(len(pos), np.int64)
    ok = np.ones(len(pos), bool)
    shift = 7
    while len(going):
        if shift > 63:
            ok[going] = False
            break
        b = buf[pos[going] + size[going]]
        value[going] |= (b & 0x7F).astype(np.uint64) << np.uint64(shift)
        size[going] += 1
        going = going[b >= 0x80]
        shift += 7
    after = pos + size
    ok &= value < np.uint64(1 << 62)
    return value.astype(np.int64), after, ok & (after <= end)


def _one_field(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(field number, value start, value end, ok) of the length-delimited field at each start;
    ok when the tag is one byte (field numbers below 16) and the value fits in its span."""
    tag = buf[starts]
    ok = ((tag & 7) == 2) & (tag < 0x80) & (starts < ends)
    length, vstart, ok2 = _varint(buf, starts + 1, ends)
    vend = vstart + length
    return (tag >> 3).astype(np.int8), vstart, vend, ok & ok2 & (vend <= ends)


def _len_fields(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every length-delimited field of every span: (owner span, field number, value start,
    value end), in rounds (the first field of every span, then the second...), and a flag per
    span that holds anything else (another wire type, or a field running past its span)."""
    owners, numbers, vstarts, vends = [], [], [], []
    odd = np.zeros(len(starts), bool)
    pos = starts.astype(np.int64, copy=True)
    active = np.flatnonzero(pos < ends)
    while len(active):
        p, e = pos[active], ends[active]
        tag, p, ok = _varint(buf, p, e)
        ok &= (tag & 7) == 2
        length, p, ok2 = _varint(buf, np.minimum(p, len(buf) - 11), e)
        vend = p + length
        ok &= ok2 & (vend <= e)
        bad = active[~ok]
        odd[bad] = True
        good = ok
        owners.append(active[good])
        numbers.append(tag[good] >> 3)
        vstarts.append(p[good])
        vends.append(vend[good])
        pos[active[good]] = vend[good]
        keep = good & (vend < e)
        active = active[keep]
    if not owners:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, empty, odd
    return (
        np.concatenate(owners),
        np.concatenate(numbers),
        np.concatenate(vstarts),
        np.concatenate(vends),
        odd,
    )


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices of every position of every [start, end) range, range after range."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    before = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lengths)


def _packed_varints(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 values, values per span, ok per span) of packed varint spans. A value begins
    after a varint's last byte and at every span's start, so that a span cut inside a varint
    (not ok) never shifts the values of the spans after it."""
    lengths = ends - starts
    ok = np.ones(len(starts), bool)
    idx = _ranges(starts, ends)
    if not len(idx):
        return np.zeros(0, np.int64), np.zeros(len(starts), np.int64), ok
    b = buf[idx]
    last = b < 0x80
    nonempty = lengths > 0
    ends_at = np.cumsum(lengths)
    begins_at = ends_at - lengths
    ok[nonempty] = last[ends_at[nonempty] - 1]  # a span must end on a varint's last byte
    first = np.concatenate([[True], last[:-1]])
    first[begins_at[nonempty]] = True
    marks = np.concatenate([[0], np.cumsum(first)])
    counts = marks[ends_at] - marks[begins_at]
    if last.all():
        return b.astype(np.int64), counts, ok
    begin = np.flatnonzero(first)
    within = np.arange(len(b)) - np.repeat(begin, np.diff(np.append(begin, len(b))))
    too_long = within >= 10
    if too_long.any():
        owner = np.repeat(np.arange(len(starts)), lengths)
        ok[np.unique(owner[too_long])] = False
        within = np.minimum(within, 9)
    parts = (b & 0x7F).astype(np.uint64) << (7 * within).astype(np.uint64)
    return np.bitwise_or.reduceat(parts, begin).view(np.int64), counts, ok


class KeyTable:
    """Feature names seen so far, found for a batch of keys by a hash, then checked byte for byte."""

    _C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)

    def __init__(self) -> None:
        self.names: list[str] = []
        self._hashes = np.zeros(0, np.uint64)  # sorted
        self._ids = np.zeros(0, np.int64)  # name index of each sorted hash
        self._rows: list[bytes] = []

    def _hash(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        lengths = ends - starts
        width = max(8, int(-(-int(lengths.max(initial=0)) // 8) * 8))
        if int(starts.max()) + width > len(buf):
            buf = np.concatenate([buf, np.zeros(width, np.uint8)])
        rows = np.lib.stride_tricks.sliding_window_view(buf, width)[starts]
        rows = rows * (np.arange(width) < lengths[:, None])
        words = rows.view(np.uint64)
        h = lengths.astype(np.uint64) * self._C1
        with np.errstate(over="ignore"):
            for k in range(words.shape[1]):
                h = (h ^ words[:, k]) * self._C2
                h ^= h >> np.uint64(31)
        return h, rows

    def lookup(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The name index of every key span (names met for the first time are added)."""
        if not len(starts):
            return np.zeros(0, np.int64)
        h, rows = self._hash(buf, starts, ends)
        pos = np.searchsorted(self._hashes, h)
        if len(self._hashes):
            hit = (pos < len(self._hashes)) & (self._hashes[np.minimum(pos, len(self._hashes) - 1)] == h)
        else:
            hit = np.zeros(len(h), bool)
        if not hit.all():
            new, first = np.unique(h[~hit], return_index=True)
            miss = np.flatnonzero(~hit)[first]
            for value, i in zip(new.tolist(), miss.tolist(), strict=True):
                raw = bytes(buf[starts[i] : ends[i]])
                self.names.append(raw.decode("utf-8", "replace"))
                self._rows.append(raw)
                self._hashes = np.append(self._hashes, np.uint64(value))
                self._ids = np.append(self._ids, len(self.names) - 1)
            order = np.argsort(self._hashes)
            self._hashes, self._ids = self._hashes[order], self._ids[order]
            pos = np.searchsorted(self._hashes, h)
        ids = self._ids[pos]
        # Byte for byte: a hash shared by two names would otherwise merge them.
        width = rows.shape[1]
        known = np.zeros((len(self._rows), width), np.uint8)
        for i, raw in enumerate(self._rows):
            known[i, : min(len(raw), width)] = np.frombuffer(raw[:width], np.uint8)
        same = (rows == known[ids]).all(axis=1) & (
            (ends - starts) == np.array([len(r) for r in self._rows])[ids]
        )
        if not same.all():
            raise ValueError("two feature names share a hash")  # never seen; refuse to merge them
        return ids


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

    def bytes_values(self, limit: int | None = None) -> list[bytes]:
        n = len(self.starts) if limit is None else min(limit, len(self.starts))
        data = self.blob
        return [
            data[s:e].tobytes() for s, e in zip(self.starts[:n].tolist(), self.ends[:n].tolist(), strict=True)
        ]

    def counts_of(self, kind: int) -> np.ndarray:
        return self.count[self.kind == kind]


@dataclass
class Batch:
    size: int
    columns: dict[str, Column]
    not_examples: list[int] = field(default_factory=list)  # records protobuf refuses too
    errors: dict[int, str] = field(default_factory=dict)


def _empty_column(blob: np.ndarray) -> Column:
    z = np.zeros(0, np.int64)
    return Column(z, np.zeros(0, np.int8), z, z, np.zeros(0, np.float32), blob, z, z)


def decode_batch(data: bytes, starts: np.ndarray, ends: np.ndarray, keys: KeyTable) -> Batch:
    """Columns of every feature of the records data[starts[i]:ends[i]]."""
    n = len(starts)
    buf = np.frombuffer(data + b"\0" * _PAD, np.uint8)
    starts = starts.astype(np.int64)
    ends = ends.astype(np.int64)
    slow = np.zeros(n, bool)
    # Example: one `features` field (an empty record is an Example without features).
    filled = np.flatnonzero(starts < ends)
    num, s1, e1, ok = _one_field(buf, starts[filled], ends[filled])
    slow[filled[~ok | (num != 1)]] = True
    rec1 = filled[ok]
    s1, e1 = s1[ok], e1[ok]
    # Features: map entries, one round per feature.
    own, num, s2, e2, odd = _len_fields(buf, s1, e1)
    rec2 = rec1[own]
    slow[rec1[odd]] = True
    slow[rec2[num != 1]] = True
    # Entry: the key (1), then the Feature (2), ending the entry.
    num_k, key_s, key_e, ok = _one_field(buf, s2, e2)
    num_v, val_s, val_e, ok2 = _one_field(buf, np.minimum(key_e, e2), e2)
    ok &= ok2 & (num_k == 1) & (num_v == 2) & (val_e == e2)
    slow[rec2[~ok]] = True
    if slow.any():
        keep = ~slow[rec2]
        rec2, key_s, key_e, val_s, val_e = rec2[keep], key_s[keep], key_e[keep], val_s[keep], val_e[keep]
    ids = keys.lookup(buf, key_s, key_e)
    nk = len(keys.names)
    dup = np.bincount(rec2 * nk + ids, minlength=n * nk) > 1
    slow[np.flatnonzero(dup) // nk] = True
    # Feature: empty (no kind), or one list whose field number is its kind.
    kind = np.zeros(len(val_s), np.int8)
    list_s = val_s.copy()
    list_e = val_s.copy()
    has = val_s < val_e
    if has.all():
        num, list_s, list_e, ok = _one_field(buf, val_s, val_e)
        ok &= (num >= 1) & (num <= 3) & (list_e == val_e)
        slow[rec2[~ok]] = True
        kind = num
    else:
        has = np.flatnonzero(has)
        num, s4, e4, ok = _one_field(buf, val_s[has], val_e[has])
        ok &= (num >= 1) & (num <= 3) & (e4 == val_e[has])
        slow[rec2[has[~ok]]] = True
        kind[has], list_s[has], list_e[has] = num, s4, e4
    # Numeric lists: one packed field (or none: an empty list).
    numeric = np.flatnonzero((kind > BYTES) & (list_s < list_e))
    num, s5, e5, ok = _one_field(buf, list_s[numeric], list_e[numeric])
    ok &= (num == 1) & (e5 == list_e[numeric])
    slow[rec2[numeric[~ok]]] = True
    packed_s = list_s.copy()
    packed_e = list_s.copy()
    packed_s[numeric], packed_e[numeric] = s5, e5
    # Bytes lists: one field per value.
    blists = np.flatnonzero(kind == BYTES)
    owner, num, s6, e6, odd = _len_fields(buf, list_s[blists], list_e[blists])
    slow[rec2[blists[odd]]] = True
    slow[rec2[blists[owner[num != 1]]]] = True
    # Entries grouped by feature (a stable radix sort of small ids).
    order = np.argsort(ids.astype(np.int16 if nk < 32000 else np.int64), kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    rec_k, ids_k, kind_k = rec2[order], ids[order], kind[order]
    packed_s, packed_e = packed_s[order], packed_e[order]
    count = np.zeros(len(order), np.int64)
    b_entry = rank[blists[owner]]
    b_sort = np.argsort(b_entry, kind="stable")  # rounds interleave entries; values keep their order
    b_entry, b_starts, b_ends = b_entry[b_sort], s6[b_sort], e6[b_sort]
    count += np.bincount(b_entry, minlength=len(order))
    f_entries = np.flatnonzero(kind_k == FLOAT)
    f_s, f_e = packed_s[f_entries], packed_e[f_entries]
    bad_len = (f_e - f_s) % 4 != 0
    if bad_len.any():
        slow[rec_k[f_entries[bad_len]]] = True
        f_e = np.where(bad_len, f_s, f_e)
    count[f_entries] = (f_e - f_s) // 4
    floats = buf[_ranges(f_s, f_e)].view("<f4")
    i_entries = np.flatnonzero(kind_k == INT64)
    ints, i_counts, i_ok = _packed_varints(buf, packed_s[i_entries], packed_e[i_entries])
    count[i_entries] = i_counts
    slow[rec_k[i_entries[~i_ok]]] = True
    columns = _split_columns(
        keys, ids_k, rec_k, kind_k, count, floats, ints, buf, b_entry, b_starts, b_ends, slow
    )
    batch = Batch(n, columns)
    for r in np.flatnonzero(slow).tolist():
        _merge_slow(batch, r, data[int(starts[r]) : int(ends[r])], buf)
    return batch


def _split_columns(
    keys: KeyTable,
    ids: np.ndarray,
    rec: np.ndarray,
    kind: np.ndarray,
    count: np.ndarray,
    floats: np.ndarray,
    ints: np.ndarray,
    buf: np.ndarray,
    b_entry: np.ndarray,
    b_starts: np.ndarray,
    b_ends: np.ndarray,
    slow: np.ndarray,
) -> dict[str, Column]:
    """Entries are grouped by feature; so are their values: each feature takes one slice.
    Entries of records decoded slowly after all (a late finding) are left out here."""
    drop = slow[rec]
    columns: dict[str, Column] = {}
    bounds = np.searchsorted(ids, np.arange(len(keys.names) + 1))
    f_cum = np.concatenate([[0], np.cumsum(np.where(kind == FLOAT, count, 0))])
    i_cum = np.concatenate([[0], np.cumsum(np.where(kind == INT64, count, 0))])
    b_bounds = np.searchsorted(b_entry, bounds)
    for k, name in enumerate(keys.names):
        a, b = int(bounds[k]), int(bounds[k + 1])
        if a == b:
            continue
        d = drop[a:b]
        col = Column(
            rec=rec[a:b],
            kind=kind[a:b],
            count=count[a:b],
            ints=ints[i_cum[a] : i_cum[b]],
            floats=floats[f_cum[a] : f_cum[b]],
            blob=buf,
            starts=b_starts[b_bounds[k] : b_bounds[k + 1]],
            ends=b_ends[b_bounds[k] : b_bounds[k + 1]],
        )
        if d.any():
            col = _without(col, ~d)
        columns[name] = col
    return columns


def _without(col: Column, keep: np.ndarray) -> Column:
    """The column with only the entries `keep` marks (and their values)."""

    def values(kind: int, arr: np.ndarray) -> np.ndarray:
        sel = col.kind == kind
        return arr[np.repeat(keep[sel], col.count[sel])]

    return Column(
        col.rec[keep],
        col.kind[keep],
        col.count[keep],
        values(INT64, col.ints),
        values(FLOAT, col.floats),
        col.blob,
        values(BYTES, col.starts),
        values(BYTES, col.ends),
    )


def _merge_slow(batch: Batch, r: int, raw: bytes, buf: np.ndarray) -> None:
    """One record through protobuf, appended to the batch's columns."""
    from recordforge.tools.records import parse_example

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
