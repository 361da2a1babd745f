"""The output lease: one writer at a time, stale locks reclaimed, on local disk and on gs:// (emulator)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from apache_beam.io.filesystems import FileSystems

from recordforge.output.lease import Lease, OutputLocked
from recordforge.output.lock_files import GcsLockFile, LocalLockFile

_STARTED = "2026-11-22T23:59:01Z"


@pytest.fixture(params=["local", "gcs"])
def lock_path(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The lock of an output folder ``.../out``, on local disk or in a fresh emulator bucket."""
    root = str(tmp_path) if request.param == "local" else request.getfixturevalue("gcs_bucket")
    return f"{root}/out/_recordforge/lock"


def _owner(run_id: str, *, host: str | None = None, pid: int | None = None) -> dict[str, object]:
    return {
        "run_id": run_id,
        "host": socket.gethostname() if host is None else host,
        "pid": os.getpid() if pid is None else pid,
        "started": _STARTED,
        "command": "recordforge convert --output out",
    }


def _read(path: str) -> dict[str, Any] | None:
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as f:
        return json.loads(f.read())


def _write_by_hand(path: str, record: dict[str, object]) -> None:
    if "://" not in path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with FileSystems.create(path) as f:
        f.write(json.dumps(record).encode())


def _lock_file(path: str) -> LocalLockFile | GcsLockFile:
    return GcsLockFile(path) if path.startswith("gs://") else LocalLockFile(path)


def _age(path: str) -> float:
    """Seconds since the lock's last heartbeat, as a contender reads them."""
    seen = _lock_file(path).read()
    assert seen is not None, f"no lock at {path}"
    return seen.age


def _make_older_than(path: str, seconds: float) -> None:
    """Makes the lock's last heartbeat more than `seconds` old: on a local disk by dating its mtime
    an hour back; on gs://, where an object's update time is the server's, by waiting until it is
    (an event on the lock's own clock, with a deadline)."""
    if not path.startswith("gs://"):
        then = time.time() - 3600
        os.utime(path, (then, then))
        assert _age(path) > seconds
        return
    deadline = time.monotonic() + 30
    while _age(path) <= seconds:
        assert time.monotonic() < deadline, f"the lock at {path} never grew {seconds} s old"
        time.sleep(0.05)


def _reaped_pid() -> int:
    """The pid of a process that has exited and been reaped: not running on this host."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _message(path: str, run_id: str, pid: int, host: str | None = None) -> str:
    return (
        f"{path.removesuffix('/_recordforge/lock')} is being written by run {run_id} "
        f"(host {host or socket.gethostname()}, pid {pid}, since {_STARTED}); "
        f"wait for it, or if that run is dead remove {path}"
    )


def test_second_acquire_is_refused_naming_the_holder(lock_path: str) -> None:
    with Lease.acquire(lock_path, _owner("v-first-ab12")) as lease:
        with pytest.raises(OutputLocked) as caught:
            Lease.acquire(lock_path, _owner("v-second-cd34"))
        assert str(caught.value) == _message(lock_path, "v-first-ab12", os.getpid())
        assert caught.value.holder["run_id"] == "v-first-ab12"
        record = _read(lock_path) or {}
        assert record == {**_owner("v-first-ab12"), "lease": record.get("lease")}
        assert len(record["lease"]) == 32
        assert lease.owner == record
    assert _read(lock_path) is None


def test_release_is_idempotent_and_frees_the_output(lock_path: str) -> None:
    first = Lease.acquire(lock_path, _owner("v-1"))
    first.release()
    first.release()
    assert _read(lock_path) is None
    with Lease.acquire(lock_path, _owner("v-2")):
        assert (_read(lock_path) or {})["run_id"] == "v-2"
        first.release()  # released long ago: must not touch the new holder's lock
        assert (_read(lock_path) or {})["run_id"] == "v-2"


def test_lock_of_a_dead_pid_on_this_host_is_reclaimed(
    lock_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    pid = _reaped_pid()
    _write_by_hand(lock_path, _owner("v-dead-ef56", pid=pid))
    with caplog.at_level(logging.WARNING, logger="recordforge.output.lease"):
        with Lease.acquire(lock_path, _owner("v-new")):
            assert (_read(lock_path) or {})["run_id"] == "v-new"
    warnings = [r.getMessage() for r in caplog.records if r.name == "recordforge.output.lease"]
    assert warnings == [
        f"Reclaimed the stale lock {lock_path} of run v-dead-ef56 (host {socket.gethostname()}, pid {pid}, "
        f"since {_STARTED}): pid {pid} is not running on this host"
    ]


def test_lock_with_an_old_heartbeat_is_reclaimed(lock_path: str, caplog: pytest.LogCaptureFixture) -> None:
    # Another host: only the heartbeat can tell whether it is alive.
    _write_by_hand(lock_path, _owner("v-quiet", host="other-host", pid=1))
    with pytest.raises(OutputLocked, match="run v-quiet"):
        Lease.acquire(lock_path, _owner("v-new"), stale_after=60)
    _make_older_than(lock_path, 0.4)
    with caplog.at_level(logging.WARNING, logger="recordforge.output.lease"):
        with Lease.acquire(lock_path, _owner("v-new"), stale_after=0.4, heartbeat=0.1):
            assert (_read(lock_path) or {})["run_id"] == "v-new"
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "recordforge.output.lease"]
    assert warning.startswith(
        f"Reclaimed the stale lock {lock_path} of run v-quiet (host other-host, pid 1, "
    )
    assert "its last heartbeat was " in warning and "(stale after 0.4 s)" in warning


def test_heartbeat_keeps_a_held_lock_fresh(lock_path: str) -> None:
    """Held "from another host", so that only its heartbeat keeps it. Events, not a wait past the
    staleness bound (2.3 s against 2.0 s once, which a loaded machine can miss): on a local disk
    the lock is dated an hour back by hand and its heartbeat must make it fresh again; on gs://,
    whose objects cannot be dated back, its heartbeat must rewrite it. Then a contender that
    judges a lock stale after 2 s is refused. A heartbeat that does not refresh fails both."""
    with Lease.acquire(lock_path, _owner("v-alive", host="other-host"), stale_after=60, heartbeat=0.05):
        lock = _lock_file(lock_path)
        first = lock.read()
        assert first is not None
        if not lock_path.startswith("gs://"):
            then = time.time() - 3600
            os.utime(lock_path, (then, then))

        def refreshed() -> bool:
            seen = lock.read()
            assert seen is not None, "the held lock is gone"
            return seen.age < 60 if not lock_path.startswith("gs://") else seen.version != first.version

        deadline = time.monotonic() + 30
        while not refreshed():
            assert time.monotonic() < deadline, "the heartbeat never refreshed the held lock"
            time.sleep(0.02)
        with pytest.raises(OutputLocked, match="run v-alive"):
            Lease.acquire(lock_path, _owner("v-new"), stale_after=2.0)
    assert _read(lock_path) is None


def test_release_after_a_takeover_keeps_the_new_holders_lock(
    lock_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    old = Lease.acquire(lock_path, _owner("v-old"), heartbeat=0.05)
    FileSystems.delete([lock_path])  # as if judged stale and reclaimed
    new = Lease.acquire(lock_path, _owner("v-taker"))
    taken = _read(lock_path)
    with caplog.at_level(logging.INFO, logger="recordforge.output.lease"):
        # Until the old heartbeat has seen the takeover (an event, not a guessed delay).
        deadline = time.monotonic() + 30
        while not any("Lost the lock" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the old run's heartbeat never saw the takeover"
            time.sleep(0.02)
        old.release()
    assert _read(lock_path) == taken  # neither rewritten by the old heartbeat nor removed
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "recordforge.output.lease"]
    assert messages == [
        ("ERROR", f"Lost the lock {lock_path}: another run took it over; heartbeat stopped"),
        ("WARNING", f"Did not remove {lock_path}: it is no longer this run's lock"),
    ]
    new.release()
    assert _read(lock_path) is None


def _race(path: str, index: int, barrier: Any, results: Any, done: Any) -> None:
    barrier.wait(timeout=30)
    try:
        lease = Lease.acquire(path, _owner(f"v-racer-{index}", pid=os.getpid()))
    except OutputLocked as exn:
        results.put((index, "locked", str(exn)))
        return
    results.put((index, "won", ""))
    done.wait(timeout=30)
    lease.release()


@pytest.mark.parametrize("start", ["free", "stale"])
def test_racing_acquirers_exactly_one_wins(lock_path: str, start: str) -> None:
    if start == "stale":  # everyone sees a dead holder's lock and tries to reclaim it
        _write_by_hand(lock_path, _owner("v-dead", pid=_reaped_pid()))
    # fork: the children start at once, with Beam imported and the emulator's environment inherited.
    ctx = multiprocessing.get_context("fork")
    racers = 8
    barrier, results, done = ctx.Barrier(racers), ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_race, args=(lock_path, i, barrier, results, done)) for i in range(racers)]
    for proc in procs:
        proc.start()
    try:
        outcomes = [results.get(timeout=30) for _ in procs]
        winners = [index for index, outcome, _ in outcomes if outcome == "won"]
        assert len(winners) == 1, outcomes
        assert (_read(lock_path) or {})["run_id"] == f"v-racer-{winners[0]}"
        for _, outcome, message in outcomes:
            if outcome == "locked":
                assert f"run v-racer-{winners[0]} " in message, message
    finally:
        done.set()
        for proc in procs:
            proc.join(timeout=30)
    assert [proc.exitcode for proc in procs] == [0] * racers
    assert _read(lock_path) is None


def test_a_lock_being_created_is_never_read_half_written(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that finds the lock taken names its holder: a lock file is never seen before its
    content is in it (the holder would read as unknown)."""
    path = str(tmp_path / "out" / "_recordforge" / "lock")
    writing, go_on = _paused_in("first", monkeypatch, "fdopen")  # the first run, about to write
    result: list[Any] = []

    def first() -> None:
        try:
            result.append(Lease.acquire(path, {"run_id": "v-first"}))
        except OutputLocked as exn:
            result.append(exn)

    thread = threading.Thread(target=first, name="first")
    thread.start()
    assert writing.wait(10)
    try:
        with Lease.acquire(path, {"run_id": "v-second"}):
            go_on.set()
            thread.join(10)
    except OutputLocked as exn:
        go_on.set()
        thread.join(10)
        pytest.fail(f"the second run did not take the lock and did not name the first: {exn}")
    assert isinstance(result[0], OutputLocked) and result[0].holder["run_id"] == "v-second"


def _paused_in(thread_name: str, monkeypatch: pytest.MonkeyPatch, name: str) -> tuple[Any, Any]:
    """Pauses the thread `thread_name` at its first call of os.`name`: (reached, go_on) events."""
    reached, go_on = threading.Event(), threading.Event()
    original = getattr(os, name)

    def paused(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == thread_name and not reached.is_set():
            reached.set()
            go_on.wait(10)
        return original(*args, **kwargs)

    monkeypatch.setattr(os, name, paused)
    return reached, go_on


def test_reclaiming_a_lock_already_reclaimed_never_lets_a_third_run_in(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run X judged a dead run's lock stale; meanwhile run Y reclaimed it and holds it. X's removal
    finds Y's lock, not the one it judged, and leaves it; while X looks at it, a third run Z must
    find the lock held by Y (were it moved aside to be looked at, Z would take it too)."""
    from recordforge.output.lock_files import LocalLockFile

    path = str(tmp_path / "out" / "_recordforge" / "lock")
    _write_by_hand(path, _owner("v-dead", pid=_reaped_pid()))
    local = LocalLockFile(path)
    stale = local.read()
    assert stale is not None
    holder = Lease.acquire(path, _owner("v-y"))  # reclaims the dead run's lock
    reached, go_on = _paused_in("x", monkeypatch, "fstat")
    removed: list[bool] = []
    x = threading.Thread(target=lambda: removed.append(local.remove_if(stale)), name="x")
    x.start()
    try:
        assert reached.wait(10)
        with pytest.raises(OutputLocked, match="is being written by run v-y "):
            Lease.acquire(path, _owner("v-z"))
    finally:
        go_on.set()
        x.join(10)
    assert removed == [False] and (_read(path) or {})["run_id"] == "v-y"
    holder.release()
    assert _read(path) is None


def test_without_hard_links_the_lock_is_created_in_place(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    def no_links(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # as on exFAT and some FUSE mounts

    monkeypatch.setattr(os, "link", no_links)
    path = f"{tmp_path}/out/_recordforge/lock"
    with Lease.acquire(path, _owner("v-first-ab12")):
        with pytest.raises(OutputLocked) as caught:
            Lease.acquire(path, _owner("v-second-cd34"))
        assert str(caught.value) == _message(path, "v-first-ab12", os.getpid())
    assert _read(path) is None
    assert sorted(p.name for p in (tmp_path / "out" / "_recordforge").iterdir()) == ["lock.guard"]
