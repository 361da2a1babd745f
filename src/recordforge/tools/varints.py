"""Protobuf varints decoded with numpy over a whole batch of packed spans."""

from __future__ import annotations

import numpy as np

from recordforge.tools.wire_keys import BYTE_MASKS, words_at

__all__ = ["packed_varints"]


def _ranges(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The indices of every position of every [start, end) range, range after range."""
    lengths = ends - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    before = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) + np.repeat(starts - before, lengths)


_HIGH = np.uint64(0x8080808080808080)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_LAST_STOP = np.array([0] + [0x80 << (8 * (k - 1)) for k in range(1, 9)], dtype=np.uint64)


def packed_varints(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 values, values per span, ok per span) of packed varint spans. Spans holding one
    varint (a scalar feature) are read as 8-byte words, their 7-bit groups packed together by
    shifts over the whole batch; the others byte by byte (_varint_bytes)."""
    size = ends - starts
    n = len(starts)
    short = np.flatnonzero((size >= 1) & (size <= 8))
    w = words_at(buf)[starts[short]] & BYTE_MASKS[size[short]]
    # One varint: the only byte without a continuation bit is the span's last.
    single = (~w & _HIGH & BYTE_MASKS[size[short]]) == _LAST_STOP[size[short]]
    one, w = short[single], w[single]
    if len(one) == n:
        return _pack7(w), np.ones(n, np.int64), np.ones(n, bool)
    rest = np.ones(n, bool)
    rest[one] = False
    rest = np.flatnonzero(rest)
    values, counts, ok = _varint_bytes(buf, starts[rest], ends[rest])
    count = np.ones(n, np.int64)
    count[rest] = counts
    offset = np.cumsum(count) - count
    out = np.empty(int(count.sum()), np.int64)
    out[offset[one]] = _pack7(w)
    out[_ranges(offset[rest], offset[rest] + counts)] = values
    all_ok = np.ones(n, bool)
    all_ok[rest] = ok
    return out, count, all_ok


def _pack7(w: np.ndarray) -> np.ndarray:
    """The value of varints of at most 8 bytes, each in a word (bytes past it zero)."""
    x = w & _LOW7
    x = (x & np.uint64(0x007F007F007F007F)) | ((x & np.uint64(0x7F007F007F007F00)) >> np.uint64(1))
    x = (x & np.uint64(0x00003FFF00003FFF)) | ((x & np.uint64(0x3FFF00003FFF0000)) >> np.uint64(2))
    x = (x & np.uint64(0x000000000FFFFFFF)) | ((x & np.uint64(0x0FFFFFFF00000000)) >> np.uint64(4))
    return x.view(np.int64)


def _varint_bytes(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int64 values, values per span, ok per span) of packed varint spans, byte by byte. A
    value begins after a varint's last byte and at every span's start, so that a span cut
    inside a varint (not ok) never shifts the values of the spans after it."""
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
