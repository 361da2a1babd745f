"""A Ctrl-C reaches the local runner's forked workers too (the terminal signals the process
group): the driver's watch of a worker that it ended says nothing, as the CLI reports the
interrupt in one line (found by tests/e2e/test_interrupt_loop.py); a worker lost otherwise is
still reported."""

from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Iterator

import pytest

from recordforge import interrupts
from recordforge.runners import local_runner


@pytest.fixture(autouse=True)
def _cleared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(interrupts, "MOMENT_S", 0.05)  # a lost worker's report, not held 2 s here
    interrupts.clear()
    yield
    interrupts.clear()


def _ended_worker() -> socket.socket:
    """The driver's end of a worker's connection, the worker gone without sending its status."""
    driver, worker = socket.socketpair()
    worker.close()
    return driver


def test_a_worker_lost_without_an_interrupt_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger=local_runner.__name__):
        local_runner._watch(_ended_worker(), "worker_3")
    assert [r.getMessage() for r in caplog.records] == ["forked Beam worker worker_3 ended without a status"]


def test_a_worker_the_interrupt_ended_is_not_reported(caplog: pytest.LogCaptureFixture) -> None:
    interrupts.record(signal.SIGINT)
    with caplog.at_level(logging.ERROR, logger=local_runner.__name__):
        local_runner._watch(_ended_worker(), "worker_3")
    assert caplog.records == []


def test_the_watch_waits_a_moment_for_the_drivers_handler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's end can be seen before the driver's handler has run (both take the signal at
    once): the interrupt recorded while the watch waits still keeps it quiet."""
    monkeypatch.setattr(interrupts, "MOMENT_S", 60.0)
    with caplog.at_level(logging.ERROR, logger=local_runner.__name__):
        watch = threading.Thread(target=local_runner._watch, args=(_ended_worker(), "worker_0"))
        watch.start()
        interrupts.record(signal.SIGINT)
        watch.join(timeout=30)
    assert not watch.is_alive()
    assert caplog.records == []


def test_received_is_what_was_recorded() -> None:
    assert not interrupts.received() and not interrupts.received(within=0.01)
    interrupts.record(signal.SIGINT)
    assert interrupts.received() and interrupts.received(within=10)
    interrupts.clear()
    assert not interrupts.received()
