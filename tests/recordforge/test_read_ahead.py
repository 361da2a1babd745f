"""ReadAhead: items made on one thread of its own, with the consumer's semantics unchanged."""

from __future__ import annotations

import gc
import inspect
import os
import pickle
import threading
from collections.abc import Iterator

import pytest
from waiting import wait_until

from recordforge.read_ahead import THREAD_NAME, ReadAhead


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def _gone(threads: list[threading.Thread]) -> bool:
    for t in threads:
        t.join(timeout=10)
    return not any(t.is_alive() for t in threads)


def test_items_arrive_in_order_and_all_of_them_on_one_thread_for_every_iterator() -> None:
    before = set(_threads())
    ahead = ReadAhead(depth=3)
    made_on: set[int] = set()

    def items(n: int) -> Iterator[int]:
        for i in range(n):
            made_on.add(threading.get_ident())
            yield i

    assert list(ahead(items(1000))) == list(range(1000))
    assert list(ahead(iter([]))) == []
    assert list(ahead(items(10))) == list(range(10))
    assert len(made_on) == 1 and threading.get_ident() not in made_on
    mine = [t for t in _threads() if t not in before]
    assert len(mine) == 1
    ahead.close()
    assert _gone(mine)


def test_an_exception_comes_after_the_items_made_before_it() -> None:
    def items() -> Iterator[int]:
        yield from range(5)
        raise ValueError("bad block")

    ahead = ReadAhead()
    got = []
    with pytest.raises(ValueError, match="bad block"):
        for item in ahead(items()):
            got.append(item)
    assert got == [0, 1, 2, 3, 4]
    assert list(ahead(iter("ab"))) == ["a", "b"]  # the thread still serves the next iterator
    ahead.close()


@pytest.mark.parametrize("depth", [1, 2])
def test_a_consumer_that_stops_early_stops_and_closes_the_producer(depth: int) -> None:
    made, closed = [], threading.Event()

    def items() -> Iterator[int]:
        try:
            for i in range(10_000):
                made.append(i)
                yield i
        finally:
            closed.set()

    ahead = ReadAhead(depth=depth)
    reader = ahead(items())
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    reader.close()
    assert closed.is_set()
    assert len(made) == 3 + depth  # never more than `depth` ahead

    made.clear()
    closed.clear()
    reader = ahead(items())
    with pytest.raises(KeyError):  # a consumer failing: the producer stops once it is dropped
        for _ in reader:
            raise KeyError("downstream")
    del reader
    gc.collect()
    assert closed.is_set() and len(made) <= 1 + depth


def test_the_thread_ends_with_its_owner() -> None:
    before = set(_threads())
    ahead = ReadAhead()
    assert list(ahead(iter(range(3)))) == [0, 1, 2]
    mine = [t for t in _threads() if t not in before]
    assert len(mine) == 1
    del ahead
    gc.collect()
    assert _gone(mine)


def test_a_pickled_or_forked_copy_starts_a_thread_of_its_own() -> None:
    ahead = ReadAhead(depth=2)
    assert list(ahead(iter(range(3)))) == [0, 1, 2]
    copy = pickle.loads(pickle.dumps(ahead))
    assert list(copy(iter(range(4)))) == [0, 1, 2, 3]
    copy.close()

    # A forked child inherits the object but not its thread: it must not wait on a thread that
    # does not exist there.
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = False
        try:
            ok = list(ahead(iter(range(5)))) == [0, 1, 2, 3, 4]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    ahead.close()


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        ReadAhead(depth=0)


def _named(made: list[str], name: str, n: int, closed: list[str] | None = None) -> Iterator[str]:
    """n items named after `name`; `made` records each as it is made, `closed` a close."""
    try:
        for i in range(n):
            made.append(f"{name}{i}")
            yield f"{name}{i}"
    finally:
        if closed is not None:
            closed.append(name)


def test_the_next_iterator_named_starts_as_soon_as_the_one_before_ends() -> None:
    made: list[str] = []
    closed: list[str] = []
    ahead = ReadAhead()
    assert list(ahead(_named(made, "a", 3), key="a", then=("b", _named(made, "b", 2)))) == ["a0", "a1", "a2"]
    # b's first item is made on the thread while the consumer is still between the two.
    assert wait_until(lambda: "b0" in made)
    assert made == ["a0", "a1", "a2", "b0"]
    # The consumer asks for b: it reads the iterator started for it, the one it gives goes unread.
    unread = _named(made, "b-unread", 2, closed)
    assert list(ahead(unread, key="b")) == ["b0", "b1"]
    assert closed == [] and "b-unread0" not in made  # closed before it ever started
    assert made == ["a0", "a1", "a2", "b0", "b1"]
    ahead.close()


def test_a_next_iterator_not_read_next_is_closed_and_never_given() -> None:
    made: list[str] = []
    closed: list[str] = []
    ahead = ReadAhead(depth=2)
    assert list(ahead(iter("xy"), key="x", then=("b", _named(made, "b", 5, closed)))) == ["x", "y"]
    assert wait_until(lambda: "b0" in made)
    # Another item comes instead: b, one item made, is closed unread; c is read.
    assert list(ahead(_named(made, "c", 2), key="c")) == ["c0", "c1"]
    assert closed == ["b"] and made.count("b0") == 1 and "b1" not in made

    # A consumer that stops early never starts what it named next; close() drops a named one.
    made.clear()
    e = _named(made, "e", 2)
    reader = ahead(_named(made, "d", 10), key="d", then=("e", e))
    assert next(reader) == "d0"
    reader.close()
    assert inspect.getgeneratorstate(e) == inspect.GEN_CLOSED and "e0" not in made
    g = _named(made, "g", 2)
    assert list(ahead(_named(made, "f", 1), key="f", then=("g", g))) == ["f0"]
    assert wait_until(lambda: "g0" in made)
    ahead.close()
    assert inspect.getgeneratorstate(g) == inspect.GEN_CLOSED and "g1" not in made


def test_an_error_in_the_next_iterators_first_step_comes_when_it_is_read() -> None:
    def failing() -> Iterator[int]:
        raise ValueError("bad footer")
        yield 0  # pragma: no cover - a generator that fails on its first step

    ahead = ReadAhead()
    assert list(ahead(iter([1, 2]), key=1, then=(2, failing()))) == [1, 2]  # not raised here
    with pytest.raises(ValueError, match="bad footer"):
        list(ahead(iter([]), key=2))
    assert list(ahead(iter([3]), key=3)) == [3]  # the thread still serves the next iterator
    ahead.close()


def test_a_forked_child_does_not_wait_on_its_parents_next_iterator() -> None:
    ahead = ReadAhead()
    made: list[str] = []
    assert list(ahead(iter([0]), key=0, then=(1, _named(made, "p", 3)))) == [0]
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = False
        try:
            ok = list(ahead(iter(["own"]), key=1)) == ["own"]
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert list(ahead(iter(["unused"]), key=1)) == ["p0", "p1", "p2"]
    ahead.close()
