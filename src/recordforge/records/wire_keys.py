"""Feature names of a batch of map entries, found by hash and checked word for word against those met."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["BYTE_MASKS", "HashIndex", "KeyTable", "key_hash", "words_at"]

_C1, _C2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)
# BYTEBYTE_MASKS[k] keeps the first k bytes of a little-endian word.
BYTE_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
_MAX_SLOT_BITS = 16


def words_at(buf: np.ndarray) -> np.ndarray:
    """Every 8 bytes of `buf` as a little-endian uint64, one word per byte offset (no copy):
    words_at(buf)[p] holds buf[p : p + 8]. `buf` must end with at least 7 bytes of padding."""
    return np.ndarray((len(buf) - 7,), np.dtype("<u8"), buffer=buf, strides=(1,))


class KeyTable:
    """Feature names seen so far. A key is read as 8-byte words (bytes past its end zeroed); the
    words and length give a hash, the hash a slot in a small table (sized so that no two known
    names share a slot), and the slot's name is then compared word for word and by length."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self.names: list[str] = []
        self._raw: set[bytes] = set()
        self._lens = np.zeros(0, np.int64)
        self._words = np.zeros((0, 1), np.uint64)
        self._hashes = np.zeros(0, np.uint64)
        self._slots = np.zeros(1, np.int32) - 1
        self._shift = np.uint64(63)
        for name in names:
            self._add(name.encode())
        self._build()

    def _add(self, raw: bytes) -> None:
        width = max(1, -(-len(raw) // 8))
        padded = np.frombuffer(raw + b"\0" * (8 * width - len(raw)), "<u8")
        if width > self._words.shape[1]:
            grown = np.zeros((len(self._words), width), np.uint64)
            grown[:, : self._words.shape[1]] = self._words
            self._words = grown
        row = np.zeros((1, self._words.shape[1]), np.uint64)
        row[0, :width] = padded
        self._words = np.concatenate([self._words, row])
        self._lens = np.append(self._lens, len(raw))
        self._hashes = np.append(self._hashes, _hash(self._lens[-1:], [w[None] for w in padded])[0])
        self.names.append(raw.decode("utf-8", "replace"))
        self._raw.add(raw)

    def _build(self) -> None:
        """The smallest table (at least twice the names) in which every known name has a slot
        of its own; past 2**16 slots (names sharing their top bits that often: never seen), the
        hashes are searched instead."""
        n = len(self.names)
        bits = max(1, (2 * n - 1).bit_length())
        while bits <= _MAX_SLOT_BITS:
            slots = (self._hashes >> np.uint64(64 - bits)).astype(np.int64)
            if len(np.unique(slots)) == n:
                self._slots = np.full(1 << bits, -1, np.int32)
                self._slots[slots] = np.arange(n, dtype=np.int32)
                self._shift = np.uint64(64 - bits)
                return
            bits += 1
        self._slots = None  # type: ignore[assignment]

    def _find(self, h: np.ndarray) -> np.ndarray:
        if self._slots is not None:
            return self._slots[(h >> self._shift).astype(np.intp)]
        order = np.argsort(self._hashes)
        pos = np.minimum(np.searchsorted(self._hashes[order], h), len(order) - 1)
        found = order[pos]
        return np.where(self._hashes[found] == h, found, -1).astype(np.int32)

    def lookup(self, buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The name index of every key buf[starts[i]:ends[i]] (names met the first time are
        added). `buf` ends with at least 8 bytes of padding."""
        if not len(starts):
            return np.zeros(0, np.int32)
        lengths = ends - starts
        words = _key_words(words_at(buf), starts, lengths)
        h = _hash(lengths, words)
        ids, ok = self._check(h, lengths, words)
        if not ok.all():
            miss = np.flatnonzero(~ok)
            _, first = np.unique(h[miss], return_index=True)
            for i in miss[first].tolist():
                raw = buf[starts[i] : ends[i]].tobytes()
                if raw not in self._raw:
                    self._add(raw)
            self._build()
            ids, ok = self._check(h, lengths, words)
            if not ok.all():
                raise ValueError("two feature names share a hash")  # refuse to merge them
        return ids

    def _check(
        self, h: np.ndarray, lengths: np.ndarray, words: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        if not self.names:
            return np.zeros(len(h), np.int32), np.zeros(len(h), bool)
        ids = self._find(h)
        ok = ids >= 0
        safe = np.where(ok, ids, 0) if not ok.all() else ids
        ok &= self._lens[safe] == lengths
        for j in range(min(len(words), self._words.shape[1])):
            ok &= self._words[safe, j] == words[j]
        return safe, ok


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
