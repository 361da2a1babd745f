"""ReadAhead: items made on one thread of its own, with the consumer's semantics unchanged."""

from __future__ import annotations

import gc
import os
import pickle
import threading
from collections.abc import Iterator

import pytest

from recordforge.sources.read_ahead import THREAD_NAME, ReadAhead


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


class _HeldStep:
    """An iterator whose second step runs until released; it records when it was closed."""

    def __init__(self) -> None:
        self.running, self.release, self.closed = threading.Event(), threading.Event(), threading.Event()
        self.n = 0

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        self.n += 1
        if self.n == 2:
            self.running.set()
            assert self.release.wait(30)
        return self.n

    def close(self) -> None:
        self.closed.set()


def test_an_interrupt_while_a_step_runs_stays_an_interrupt_and_closes_after_the_step() -> None:
    """Ctrl-C ending the consumer while a step still runs on the read-ahead thread: the
    interrupt is what the consumer raises, and the iterator is closed only once the step has
    returned (a generator closed while it runs raises "ValueError: generator already
    executing", which the Parquet source wrapped as a SourceError: the run was then treated as
    failed and its finished pieces deleted). The interrupt is thrown in, not signalled, so that
    the test does not depend on when a signal is delivered.
    Mutation this catches: the cleanup as it was, `items.close()` on the consumer's thread at
    once. Put back `_close_after_steps` to pass."""
    items = _HeldStep()
    reader = ReadAhead()(items)
    assert next(reader) == 1  # step 2 is asked of the thread as item 1 is handed on
    assert items.running.wait(30)
    raised: list[BaseException] = []

    def interrupt() -> None:
        try:
            reader.throw(KeyboardInterrupt)
        except BaseException as exn:  # noqa: BLE001 - what the consumer would see
            raised.append(exn)

    consumer = threading.Thread(target=interrupt)
    consumer.start()
    # While step 2 runs the consumer's cleanup waits for it: the iterator is not closed.
    assert not items.closed.wait(0.5)
    items.release.set()
    consumer.join(30)
    assert not consumer.is_alive() and items.closed.is_set()
    assert len(raised) == 1 and isinstance(raised[0], KeyboardInterrupt)


def test_an_interrupt_is_not_replaced_by_a_failure_to_close() -> None:
    """A generator whose close fails (its own cleanup raising) while an interrupt ends the
    consumer: the interrupt is raised, not the close's failure."""

    def items() -> Iterator[int]:
        try:
            yield 1
            yield 2
        finally:
            raise OSError("cleanup failed")

    reader = ReadAhead()(items())
    assert next(reader) == 1
    with pytest.raises(KeyboardInterrupt):
        reader.throw(KeyboardInterrupt)
    reader = ReadAhead()(items())
    assert next(reader) == 1
    with pytest.raises(OSError, match="cleanup failed"):  # without an interrupt it is raised
        reader.throw(ValueError("downstream"))


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
