"""tf.train.Example decoded for a whole batch of records at once, with numpy."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recordforge.tools.varints import packed_varints
from recordforge.tools.wire_keys import KeyTable

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
_PAD = 64  # zero bytes after the data: a read a little past a span never leaves the array
_MAX_LEN_BYTES = 5  # a length takes at most 5 varint bytes here (below 2**35)


def _lengths(buf: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, Any, np.ndarray | None]:
    """(value, size in bytes, ok or None for all ok) of the varint length at each position.
    One gather when every length is below 128 (the common case); longer ones take a round per
    further byte, over only the lengths still going."""
    b = buf[pos]
    if not len(b) or int(b.max()) < 0x80:
        return b, 1, None
    going = np.flatnonzero(b >= 0x80)
    value = b.astype(np.int64)
    value[going] &= 0x7F
    size = np.ones(len(pos), np.int64)
    ok = np.ones(len(pos), bool)
    shift = 7
    while len(going):
        if shift >= 7 * _MAX_LEN_BYTES:
            ok[going] = False
            break
        more = buf[pos[going] + size[going]]
        value[going] |= (more & 0x7F).astype(np.int64) << shift
        size[going] += 1
        going = going[more >= 0x80]
        shift += 7
    return value, size, ok


def _field(
    buf: np.ndarray, pos: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(tag byte, value start, value end, ok or None) of the length-delimited field at each
    position; callers compare the tag (a one-byte tag of wire type 2 is the only layout taken)."""
    if len(pos) and int(pos.max()) > limit:
        pos = np.minimum(pos, limit)  # only where a bad length pointed past the data
    tag = buf[pos]
    value, size, ok = _lengths(buf, pos + 1)
    start = pos + 1 + size
    return tag, start, start + value, ok


def _all(mask: np.ndarray, ok: np.ndarray | None) -> np.ndarray:
    return mask if ok is None else mask & ok


def _fields(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, limit: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every field (tag 0x0A) of every span: (owner span, value start, value end), span after
    span, read in rounds (the first field of every span, then the second...); and a flag per
    span holding anything else (another field, or a field running past its span)."""
    owners, vstarts, vends = [], [], []
    odd = np.zeros(len(starts), bool)
    going = starts < ends
    active = np.flatnonzero(going) if not going.all() else np.arange(len(starts))
    pos, end = starts[active], ends[active]
    while len(active):
        tag, s, e, ok = _field(buf, pos, limit)
        good = _all((tag == 0x0A) & (e <= end), ok)
        if not good.all():
            odd[active[~good]] = True
            active, s, e, end = active[good], s[good], e[good], end[good]
        owners.append(active)
        vstarts.append(s)
        vends.append(e)
        going = e < end
        if not going.all():
            active, e, end = active[going], e[going], end[going]
        pos = e
    if not owners:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty, odd
    if len(owners) == 1:
        return owners[0], vstarts[0], vends[0], odd
    # Span after span, as the bytes lie: every later pass over the fields then reads the
    # buffer forwards instead of jumping across it once per round (a cache miss per field).
    owner = np.concatenate(owners)
    per = np.bincount(owner, minlength=len(starts))
    first = np.cumsum(per) - per
    nth = np.repeat(np.arange(len(owners)), [len(o) for o in owners])
    dest = first[owner] + nth
    out = [np.empty(len(owner), np.int64) for _ in range(3)]
    for arr, parts in zip(out, (owners, vstarts, vends), strict=True):
        arr[dest] = np.concatenate(parts)
    return out[0], out[1], out[2], odd


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


def decode_batch(data: bytes, starts: np.ndarray, ends: np.ndarray, keys: KeyTable) -> Batch:
    """Columns of every feature of the records data[starts[i]:ends[i]]."""
    n = len(starts)
    buf = np.frombuffer(data + b"\0" * _PAD, np.uint8)
    limit = len(data)
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    slow = np.zeros(n, bool)
    # Example: one `features` field (an empty record is an Example without features).
    rec = np.flatnonzero(starts < ends)
    tag, fs, fe, ok = _field(buf, starts[rec], limit)
    good = _all((tag == 0x0A) & (fe == ends[rec]), ok)
    if not good.all():
        slow[rec[~good]] = True
        rec, fs, fe = rec[good], fs[good], fe[good]
    # Features: map entries, one round per entry of the record with the most.
    own, es, ee, odd = _fields(buf, fs, fe, limit)
    slow[rec[odd]] = True
    erec = rec[own]
    # Entry: the key, then the Feature, ending the entry.
    t1, ks, ke, ok1 = _field(buf, es, limit)
    t2, vs, ve, ok2 = _field(buf, ke, limit)
    good = _all(_all((t1 == 0x0A) & (t2 == 0x12) & (ve == ee), ok1), ok2)
    # Feature: empty (kind none), or one list, its field number the kind, ending the Feature.
    t3, ls, le, ok3 = _field(buf, vs, limit)
    has = vs < ve
    listed = (t3 == 0x0A) | (t3 == 0x12) | (t3 == 0x1A)
    good &= _all(listed & (le == ve), ok3) | ~has
    kind = t3 >> 3
    if not has.all():
        kind = np.where(has, kind, NONE).astype(np.uint8)
        ls, le = np.where(has, ls, vs), np.where(has, le, vs)
    # A list's first field: a float or int64 list's one packed field (none: an empty list), or a
    # bytes list's first value.
    t4, ps, pe, ok4 = _field(buf, ls, limit)
    full = ls < le
    numeric = kind >= FLOAT
    good &= _all((t4 == 0x0A) & np.where(numeric, pe == le, pe <= le), ok4) | ~full
    if not full.all():
        ps, pe = np.where(full, ps, ls), np.where(full, pe, ls)
    slow[erec[~good]] = True
    keep = ~slow[erec]
    if not keep.all():
        erec, ks, ke, kind, ps, pe, le, full = (a[keep] for a in (erec, ks, ke, kind, ps, pe, le, full))
    ids = keys.lookup(buf, ks, ke)
    nk = len(keys.names)
    if len(erec):  # two entries of one record under one key (protobuf keeps the last)
        dup = np.bincount(erec * nk + ids, minlength=n * nk) > 1
        if dup.any():
            slow[np.flatnonzero(dup) // nk] = True
    # Bytes values: the first of every list read above, then one round per further value.
    blists = np.flatnonzero((kind == BYTES) & full)
    more = blists[pe[blists] < le[blists]]
    owner, s6, e6, odd = _fields(buf, pe[more], le[more], limit)
    slow[erec[more[odd]]] = True
    # Entries grouped by feature (a stable radix sort of small ids).
    order = np.argsort(ids.astype(np.int16 if nk < 32000 else np.int64), kind="stable")
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    rec_k, ids_k, kind_k = erec[order], ids[order], kind[order]
    ps_k, pe_k = ps[order], pe[order]
    b_entry = rank[np.concatenate([blists, more[owner]])]
    b_sort = np.argsort(b_entry, kind="stable")  # rounds interleave entries; values keep their order
    b_entry = b_entry[b_sort]
    b_starts = np.concatenate([ps[blists], s6])[b_sort]
    b_ends = np.concatenate([pe[blists], e6])[b_sort]
    count = np.bincount(b_entry, minlength=len(order))
    floats = _floats(buf, kind_k, ps_k, pe_k, count, rec_k, slow)
    i_entries = np.flatnonzero(kind_k == INT64)
    ints, i_counts, i_ok = packed_varints(buf, ps_k[i_entries], pe_k[i_entries])
    count[i_entries] = i_counts
    slow[rec_k[i_entries[~i_ok]]] = True
    columns = _split_columns(
        keys, ids_k, rec_k, kind_k, count, floats, ints, buf, b_entry, b_starts, b_ends, slow
    )
    batch = Batch(n, columns)
    for r in np.flatnonzero(slow).tolist():
        _merge_slow(batch, r, data[int(starts[r]) : int(ends[r])], buf)
    return batch


def _floats(
    buf: np.ndarray,
    kind: np.ndarray,
    ps: np.ndarray,
    pe: np.ndarray,
    count: np.ndarray,
    rec: np.ndarray,
    slow: np.ndarray,
) -> np.ndarray:
    """The values of the packed float spans, entry after entry (their counts set in `count`)."""
    entries = np.flatnonzero(kind == FLOAT)
    s, e = ps[entries], pe[entries]
    size = e - s
    bad = (size & 3) != 0
    if bad.any():
        slow[rec[entries[bad]]] = True
        size = np.where(bad, 0, size)
    per = size >> 2
    count[entries] = per
    words = np.ndarray((len(buf) - 3,), np.dtype("<f4"), buffer=buf, strides=(1,))
    if len(per) and int(per.min()) == int(per.max()):
        if int(per[0]) == 1:
            return words[s]  # one value per entry: one gather
        return words[(s[:, None] + 4 * np.arange(int(per[0]))).ravel()]
    before = np.cumsum(per) - per
    return words[np.repeat(s - 4 * before, per) + 4 * np.arange(int(per.sum()))]


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
