"""Feature names of a batch of map entries, found by their bytes; 64-bit hashes of short values (stats)."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["BYTE_MASKS", "HashIndex", "KeyTable", "key_hash", "words_at"]

_C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
# BYTEBYTE_MASKS[k] keeps the first k bytes of a little-endian word.
BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)


def words_at(buf: np.ndarray) -> np.ndarray:
    """Every 8 bytes of `buf` as a little-endian uint64, one word per byte offset (no copy):
    words_at(buf)[p] holds buf[p : p + 8]. `buf` must end with at least 7 bytes of padding."""
    return np.ndarray((len(buf) - 7,), np.dtype("<u8"), buffer=buf, strides=(1,))


class KeyTable:
    """Feature names seen so far, each with its id (its place in `names`), found by their
    bytes: the table grows by one entry per new name, so its time and memory stay linear in the
    total size of the names (a crafted file may hold one name of megabytes beside thousands of
    short ones), and two names share an id only where their bytes are equal."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: list[str] = []
        self._ids: dict[bytes, int] = {}
        for name in names:
            self._id(name.encode())

    def _id(self, raw: bytes) -> int:
        found = self._ids.get(raw)
        if found is None:
            found = self._ids[raw] = len(self.names)
            self.names.append(raw.decode("utf-8", "replace"))
        return found

    def lookup(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The name index of every key buf[starts[i]:ends[i]] (names met the first time are
        added). A batch asks once per name it holds, not per entry: a dict lookup each."""
        ids = [self._id(buf[s:e].tobytes()) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
        return np.array(ids, np.int32)


def _key_words(w: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """The words of every key, bytes past its end zeroed: one array per 8 bytes of the longest."""
    out = []
    longest = int(lengths.max(initial=0))
    for j in range(max(1, -(-longest // 8))):
        word = w[np.minimum(starts + 8 * j, len(w) - 1)]
        rest = lengths - 8 * j
        if j or int(lengths.min()) < 8:
            word &= BYTE_MASKS[np.clip(rest, 0, 8)]
        out.append(word)
    return out


def _hash(lengths: np.ndarray, words: list[np.ndarray]) -> np.ndarray:
    """A key's hash mixes its length and its own words only (a word past its end is not
    mixed), so that a name hashes alike in every batch, whatever the batch's longest key."""
    h = lengths.astype(np.uint64) * _C1
    with np.errstate(over="ignore"):
        for j, word in enumerate(words):
            mixed = (h ^ word) * _C2
            mixed ^= mixed >> np.uint64(31)
            h = mixed if j == 0 else np.where(lengths > 8 * j, mixed, h)
    return h


def key_hash(words: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The hash KeyTable gives the bytes words[starts[i]] onwards, lengths[i] of them (for any
    short bytes values: strings counted by stats)."""
    return _hash(lengths, _key_words(words, starts, lengths))


class HashIndex:
    """Positions of known 64-bit hashes, found for a whole array at once: an open-addressing
    table (linear probing, a quarter full) built once for a set that stops changing, such as
    the values of a categorical string feature."""

    def __init__(self, hashes: np.ndarray) -> None:
        self.hashes = hashes
        n = len(hashes)
        bits = max(4, (4 * n - 1).bit_length())
        self._mask = (1 << bits) - 1
        self._shift = np.uint64(64 - bits)
        self._slots = np.full(1 << bits, -1, np.int64)
        pos = (hashes >> self._shift).astype(np.int64)
        pending = np.arange(n)
        self._probes = 0
        while len(pending):
            at = (pos[pending] + self._probes) & self._mask
            free = self._slots[at] == -1
            # Of several hashes claiming one free slot, the first takes it; the rest probe on.
            _, first = np.unique(at[free], return_index=True)
            won = np.flatnonzero(free)[first]
            self._slots[at[won]] = pending[won]
            left = np.ones(len(pending), bool)
            left[won] = False
            pending = pending[left]
            self._probes += 1 if len(pending) else 0

    def find(self, h: np.ndarray) -> np.ndarray:
        """The index in `hashes` of every value of h, -1 where it is not there."""
        out = np.full(len(h), -1, np.int64)
        pos = (h >> self._shift).astype(np.int64)
        todo = np.arange(len(h))
        for probe in range(self._probes + 1):
            ids = self._slots[(pos[todo] + probe) & self._mask]
            known = ids >= 0
            match = known & (self.hashes[np.where(known, ids, 0)] == h[todo])
            out[todo[match]] = ids[match]
            todo = todo[known & ~match]  # an empty slot ends the probe sequence: not there
            if not len(todo):
                break
        return out
