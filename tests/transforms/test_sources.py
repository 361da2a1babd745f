"""read_ahead: a source's items produced on a thread, with the consumer's semantics unchanged."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from recordforge.transforms.sources import read_ahead


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "recordforge-read-ahead"]


def test_items_arrive_in_order_and_all_of_them() -> None:
    assert list(read_ahead(iter(range(1000)), depth=3)) == list(range(1000))
    assert list(read_ahead(iter([]))) == []
    assert _threads() == []


def test_an_exception_comes_after_the_items_made_before_it() -> None:
    def items() -> Iterator[int]:
        yield from range(5)
        raise ValueError("bad block")

    got = []
    with pytest.raises(ValueError, match="bad block"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]
    assert _threads() == []


def test_a_consumer_that_stops_early_stops_and_closes_the_producer() -> None:
    made, closed = [], threading.Event()

    def items() -> Iterator[int]:
        try:
            for i in range(10_000):
                made.append(i)
                yield i
        finally:
            closed.set()

    reader = read_ahead(items(), depth=2)
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()
    assert closed.is_set() and _threads() == []
    assert len(made) <= 3 + 2 + 1  # never more than `depth` ahead (plus the one being put)

    reader = read_ahead(items(), depth=2)
    with pytest.raises(KeyError):  # a consumer failing: the producer stops once it is dropped
        for _ in reader:
            raise KeyError("downstream")
    del reader
    gc.collect()
    assert _threads() == []
