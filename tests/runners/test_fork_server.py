"""ForkServer: a stopped server ends the workers nobody closed; a worker whose driver died ends
quietly. Each case runs in a fresh interpreter (the only kind of process a fork server is made
in: pytest's own may run threads)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # subprocesses that fork

_PRELUDE = """
import os, signal, sys, threading, time
from recordforge.runners.fork_server import ForkServer, request_worker
"""


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_worker_left_running_is_ended_when_the_server_stops(tmp_path: Path) -> None:
    """A worker that nothing will ever stop (its runner's close was cut short): the server's exit
    ends it after a moment instead of waiting for it forever."""
    pidfile = tmp_path / "worker.pid"
    proc = _python(
        f"""
        def work(env):
            with open({str(pidfile)!r} + ".tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
            threading.Event().wait()  # for work that never comes

        with ForkServer(work) as server:
            conn = request_worker(server.path, {{}})
            while not os.path.exists({str(pidfile)!r}):
                time.sleep(0.01)
            start = time.monotonic()
        print(round(time.monotonic() - start, 1), list(conn.recv(1)))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout.split()[0]) < 10, proc.stdout
    assert proc.stdout.split()[1] == "[]", proc.stdout  # ended without a status: it never finished
    assert not _alive(int(pidfile.read_text()))


def test_a_finished_worker_reports_its_status_and_the_exit_does_not_wait() -> None:
    proc = _python(
        """
        with ForkServer(lambda env: None) as server:
            conn = request_worker(server.path, {})
            status = list(conn.recv(1))
            start = time.monotonic()
        print(status, round(time.monotonic() - start, 1))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "[0]" and float(proc.stdout.split()[1]) < 1.0, proc.stdout


_SIGTERM_AT_MANY_POINTS = """
import ctypes, random

PR_SET_CHILD_SUBREAPER = 36
# Every process the fork server leaves (a worker orphaned by its exit) becomes this one's child.
ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def hung(signum, frame):
    os.write(2, f"round {round_} hung: the fork server did not exit\\n".encode())
    os._exit(3)


signal.signal(signal.SIGALRM, hung)
rng = random.Random(int(sys.argv[2]))
slowest = 0.0
for round_ in range(int(sys.argv[1])):
    signal.alarm(20)
    with ForkServer(lambda env: None) as server:
        # SIGTERM (the exit) lands while the server waits, accepts, forks a worker or reaps it.
        conns = [request_worker(server.path, {}) for _ in range(rng.randrange(3))]
        time.sleep(rng.choice([0.0, 0.0, rng.uniform(0, 0.003)]))
        start = time.monotonic()
    slowest = max(slowest, time.monotonic() - start)
    signal.alarm(0)
    for conn in conns:
        conn.close()
left = []
try:
    while True:
        pid, _ = os.waitpid(-1, os.WNOHANG)  # a worker orphaned and ended: reaped here
        if pid == 0:
            left = open(f"/proc/self/task/{os.getpid()}/children").read().split()  # still running
            break
except ChildProcessError:
    pass
print("slowest", round(slowest, 2), "left", left)
"""


def test_sigterm_at_any_point_of_a_serving_fork_server_ends_it_promptly() -> None:
    """Hundreds of fork servers stopped (SIGTERM, as the runner's exit stops them) at random
    points: waiting, accepting, forking a worker, reaping one, with both cores kept busy by other
    processes. Each must exit within its grace, and leave no process behind.
    Mutation this catches: the SIGTERM handler raising (`def _stop(...): raise _Stop`, as it did):
    a signal landing during the fork of a worker ran the handler inside logging's at-fork hook
    (`Exception ignored in: <function _releaseLock>`), the stop was lost, the server served on and
    the exit waited for it forever ("round N hung"). Put the flag and the wake-up pipe back to pass."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PRELUDE + _SIGTERM_AT_MANY_POINTS, "300", "56"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[0] == "slowest" and float(words[1]) < 5.0 and words[2:] == ["left", "[]"], proc.stdout


_DRIVER_DIES = """
def work(env):
    def fail():
        raise RuntimeError("thread: the driver's stream is gone")

    os.kill(int(env["DRIVER"]), int(env["SIGNAL"]))  # the driver dies (or not) now
    time.sleep(0.2)
    t = threading.Thread(target=fail, name="reader")
    t.start()
    t.join()
    raise RuntimeError("main: the driver's stream is gone")

with ForkServer(work) as server:
    conn = request_worker(server.path, {"DRIVER": str(os.getpid()), "SIGNAL": sys.argv[1]})
    print("status", list(conn.recv(1)), flush=True)
"""


def test_a_worker_whose_driver_died_ends_quietly() -> None:
    """Killed outright, the driver leaves its workers' connections broken; what fails in them
    then (in Beam's threads and in its harness) is not printed: the driver's death says it."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + _DRIVER_DIES, str(signal.SIGKILL.value)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -9
    assert "Traceback" not in proc.stderr and "stream is gone" not in proc.stderr, proc.stderr


def test_a_worker_failing_while_its_driver_lives_prints_why() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + _DRIVER_DIES, "0"],  # signal 0: the driver lives on
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "status [1]" in proc.stdout
    assert "thread: the driver's stream is gone" in proc.stderr  # Exception in thread reader
    assert "main: the driver's stream is gone" in proc.stderr


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_the_sweep_removes_only_folders_it_named_for_processes_gone(tmp_path: Path) -> None:
    from recordforge.runners.fork_server import TEMP_KINDS, sweep_temp_folders

    dead, live, hexes = _dead_pid(), os.getpid(), "0123456789abcdef" * 2
    gone = [f"{kind}{dead}-{hexes}" for kind in TEMP_KINDS]
    kept = [
        f"recordforge-claims-{live}-{hexes}",  # its process runs
        f"recordforge-claims-{dead}-{hexes[:-1]}",  # not a name RecordForge makes
        f"recordforge-claims-{dead}-{hexes.upper()}",
        f"recordforge-other-{dead}-{hexes}",
        f"someone-claims-{dead}-{hexes}",
    ]
    for name in gone + kept:
        (tmp_path / name).mkdir()
        (tmp_path / name / "inside").write_text("x")
    (tmp_path / f"recordforge-progress-{dead}-{hexes}x").write_text("a file, not ours")
    assert sorted(sweep_temp_folders(str(tmp_path))) == sorted(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*kept, f"recordforge-progress-{dead}-{hexes}x"]
    )


def test_a_process_looks_through_the_temporary_folder_at_most_once_a_minute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from recordforge.runners import fork_server

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    now = [1000.0]
    monkeypatch.setattr(fork_server.time, "monotonic", lambda: now[0])
    leftover = tmp_path / f"recordforge-progress-{_dead_pid()}-{'ab' * 16}"
    leftover.mkdir()
    name = fork_server.private_temp_name("recordforge-claims-")
    assert os.path.dirname(name) == str(tmp_path) and not leftover.exists()
    leftover.mkdir()
    fork_server.private_temp_name("recordforge-progress-")
    now[0] += 30
    fork_server.private_temp_name("recordforge-workers-")
    assert leftover.exists()  # looked through less than a minute ago
    now[0] += 31
    fork_server.private_temp_name("recordforge-claims-")
    assert not leftover.exists()
    with pytest.raises(ValueError, match="not a kind"):
        fork_server.private_temp_name("elsewhere-")
