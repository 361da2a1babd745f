"""KeyTable: names found by their bytes, in time and memory linear in their total size."""

from __future__ import annotations

import tracemalloc

import numpy as np

from recordforge.records.wire_keys import KeyTable


def _buffer(names: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(n) for n in names], np.int64)
    starts = np.cumsum(lengths) - lengths
    buf = np.zeros(int(lengths.sum()) + 8, np.uint8)
    buf[: len(buf) - 8] = np.frombuffer(b"".join(names), np.uint8)
    return buf, starts, starts + lengths


def test_one_long_name_beside_thousands_of_short_ones() -> None:
    """A 64 KiB name then 4,000 short ones, in one batch and then one by one: each its own
    id, in a few MB (before: a table 64 KiB wide for every name, copied for each new one)."""
    names = [b"n" * (64 << 10)] + [b"f%d" % i for i in range(4000)]
    keys = KeyTable(["known"])
    tracemalloc.start()
    try:
        ids = keys.lookup(*_buffer(names))
        for name in names[:50]:
            assert keys.lookup(*_buffer([name]))[0] == ids[names.index(name)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert ids.tolist() == list(range(1, len(names) + 1))
    assert keys.names == ["known", *(n.decode() for n in names)]
    assert peak < 16 << 20


def test_names_that_differ_anywhere_stay_apart() -> None:
    """Names alike but for one byte (first, middle, last), and prefixes of each other."""
    base = b"feature_name_of_some_length_" * 3
    names = [base, base[:-1], base + b"x", b"y" + base[1:], base[:40] + b"?" + base[41:], b"", b"f"]
    keys = KeyTable()
    first = keys.lookup(*_buffer(names))
    again = keys.lookup(*_buffer(names[::-1]))
    assert len(set(first.tolist())) == len(names)
    assert again.tolist() == first.tolist()[::-1]
