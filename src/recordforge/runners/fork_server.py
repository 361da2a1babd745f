"""A fork server: a forked copy of this process that forks workers on request over a Unix socket."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator

from recordforge.output.lease import quiet_heartbeats
from recordforge.progress.live import quiet_watches

__all__ = [
    "TEMP_KINDS",
    "ForkServer",
    "private_temp_dir",
    "private_temp_name",
    "request_worker",
    "sweep_temp_folders",
]

# What a worker runs: given its environment, it returns normally (status 0) or raises (status 1).
Work = Callable[[dict[str, str]], None]


def private_temp_dir(prefix: str) -> str:
    """A fresh temporary folder named after this process (`private_temp_name`), made now."""
    path = private_temp_name(prefix)
    os.mkdir(path, 0o700)
    return path


# The kinds of temporary folder RecordForge's processes make, as `private_temp_name` names them.
TEMP_KINDS = ("recordforge-claims-", "recordforge-progress-", "recordforge-workers-")
# A temporary folder may hold thousands of entries; it is looked through at most this often.
_SWEEP_EVERY_S = 60.0
_swept: dict[str, float] = {}  # temporary folder -> when this process last looked through it
_TEMP_NAME = re.compile("(?:" + "|".join(map(re.escape, TEMP_KINDS)) + r")(\d+)-[0-9a-f]{32}")


def private_temp_name(prefix: str) -> str:
    """A fresh name for a temporary folder of this process, not made yet: {tmp}/{prefix}{pid}-
    {random}, `prefix` one of TEMP_KINDS; first, the folders of these kinds that a process killed
    outright (kill -9 runs no cleanup) left behind are removed (`sweep_temp_folders`)."""
    if prefix not in TEMP_KINDS:
        raise ValueError(f"{prefix!r} is not a kind of RecordForge's temporary folders")
    base = tempfile.gettempdir()
    last = _swept.get(base)
    if last is None or time.monotonic() - last >= _SWEEP_EVERY_S:
        sweep_temp_folders(base)
        _swept[base] = time.monotonic()
    return os.path.join(base, f"{prefix}{os.getpid()}-{uuid.uuid4().hex}")


def sweep_temp_folders(base: str) -> list[str]:
    """Removes the folders under `base` that `private_temp_name` named for a process no longer
    running, of every kind, in one listing; returns their names. Nothing else is touched."""
    removed = []
    for name in os.listdir(base):
        found = _TEMP_NAME.fullmatch(name)
        if found and not _alive(int(found.group(1))):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
            removed.append(name)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def request_worker(socket_path: str, env: dict[str, str]) -> socket.socket:
    """Asks the fork server at `socket_path` for a worker with environment `env`; the returned
    socket yields the worker's exit status (one byte) when it ends."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(socket_path)
    body = json.dumps(env).encode()
    conn.sendall(struct.pack(">I", len(body)) + body)
    return conn


class ForkServer:
    """A forked copy of this process, made on entry (before the caller starts threads that a
    child could inherit mid-lock), that forks a worker running `work` for each request, in a
    private temporary folder; stopped on exit, its workers waited for, and those still running
    then ended: a runner that stopped without closing them (its close cut short by a second
    Ctrl-C, say) would otherwise leave them waiting for work forever, and the exit with them.
    A worker whose driver died (killed outright) ends quietly: its broken connections say
    nothing the driver's death did not."""

    def __init__(self, work: Work) -> None:
        self._work = work

    def __enter__(self) -> ForkServer:
        self._dir = private_temp_dir("recordforge-workers-")
        path = os.path.join(self._dir, "fork.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        parent = os.getpid()
        # Held open by this process alone: the workers' end reads end-of-file once it is gone.
        alive, self._alive = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        # Blocked until the server has its own handler: a SIGTERM in between waits for it,
        # instead of running this process's handler in the server.
        with _sigterm_blocked():
            with quiet_heartbeats(), quiet_watches():
                pid = os.fork()
            if pid == 0:  # the fork server
                code = 0
                os.close(self._alive)
                try:
                    _serve(listener, parent, self._work, alive)
                except BaseException:  # noqa: BLE001 - a child must never return into the parent
                    traceback.print_exc()
                    code = 1
                finally:
                    os._exit(code)
        listener.close()
        os.close(alive)
        self._pid = pid
        self.path = path
        return self

    def end_workers(self) -> None:
        """Stops the fork server and its workers at once, with no grace period: an interrupted
        run's driver, whose workers did not get the signal (sent to the driver alone), ends
        them so. Its signal (SIGUSR1) is recorded by the server's handler, never raised."""
        try:
            os.kill(self._pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass

    def __exit__(self, *exc: object) -> None:
        try:
            os.kill(self._pid, signal.SIGTERM)
            os.waitpid(self._pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        finally:
            os.close(self._alive)
        shutil.rmtree(self._dir, ignore_errors=True)


# The signals that stop a fork server: SIGTERM (its workers get a grace period), SIGUSR1 (ended
# at once: `ForkServer.end_workers`).
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}


@contextlib.contextmanager
def _sigterm_blocked() -> Iterator[None]:
    """SIGTERM and SIGUSR1 held pending in this thread (delivered on leaving) around a fork: the
    child installs its own disposition first."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)


class _StopRequest:
    """SIGTERM recorded, never raised: a handler's exception lands wherever the interpreter
    happens to be (inside logging's at-fork hook once, which swallowed it: the stop was lost
    and the runner waited forever). The handler sets `requested` and writes to a pipe the
    server's select watches, so that the wait ends at once."""

    def __init__(self) -> None:
        self.requested = False
        self.now = False  # SIGUSR1: the workers are ended at once, not after a grace period
        self.wake, self._poke = os.pipe()
        os.set_blocking(self._poke, False)

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True
        self.now = self.now or signum == signal.SIGUSR1
        try:
            os.write(self._poke, b"\0")
        except BlockingIOError:  # the pipe is full: a wake-up is already pending
            pass

    def close(self) -> None:
        os.close(self.wake)
        os.close(self._poke)


# How long a stopped fork server waits for its workers to end before it ends them: a worker
# the runner closed has reported its status by then and is only leaving; one still running
# after this was never closed, and nothing will ever give it work again.
_GRACE_S = 1.0


def _serve(listener: socket.socket, parent: int, work: Work, alive: int) -> None:
    stop = _StopRequest()
    for sig in _STOP_SIGNALS:
        signal.signal(sig, stop)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by the fork (above)
    workers: set[int] = set()
    _accept_loop(listener, parent, work, alive, workers, stop)
    # Wait for the workers (they end when their work does), so that none is left a zombie and
    # their resource usage counts towards the parent's children; end those left running.
    for sig in _STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    deadline = time.monotonic() + (0.0 if stop.now else _GRACE_S)
    while workers and time.monotonic() < deadline:
        _reap(workers)
        time.sleep(0.01)
    for pid in workers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        while True:
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass


def _accept_loop(
    listener: socket.socket, parent: int, work: Work, alive: int, workers: set[int], stop: _StopRequest
) -> None:
    # Ends on SIGTERM, or with the parent, whatever way it ended.
    while not stop.requested and os.getppid() == parent:
        ready, _, _ = select.select([listener.fileno(), stop.wake], [], [], 0.5)
        _reap(workers)
        if listener.fileno() not in ready or stop.requested:
            continue
        conn, _ = listener.accept()
        # A driver sends its request as it connects; one that does not is not waited for long.
        conn.settimeout(10.0)
        try:
            env = _receive_env(conn)
        except OSError:
            env = None
        if env is None:
            conn.close()
            continue
        with _sigterm_blocked():  # the worker sets its own disposition first (_run)
            pid = os.fork()
            if pid == 0:
                listener.close()
                stop.close()
                _run(conn, env, work, alive)  # never returns
            workers.add(pid)
        conn.close()


def _reap(workers: set[int]) -> None:
    try:
        while True:
            pid, _ = os.waitpid(-1, os.WNOHANG)
            if not pid:
                return
            workers.discard(pid)
    except ChildProcessError:
        workers.clear()


def _receive_env(conn: socket.socket) -> dict[str, str] | None:
    head = _recv_exactly(conn, 4)
    if head is None:
        return None
    body = _recv_exactly(conn, struct.unpack(">I", head)[0])
    return None if body is None else json.loads(body)


def _recv_exactly(conn: socket.socket, n: int) -> bytes | None:
    chunks, got = [], 0
    while got < n:
        chunk = conn.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _run(conn: socket.socket, env: dict[str, str], work: Work, alive: int) -> None:
    """Runs `work` in this forked worker, reports its status, and leaves without interpreter
    teardown (the parent's atexit hooks are not this process's). Quiet once the driver is gone
    (`alive`: the read end of a pipe only the driver writes to)."""
    status = 1
    for sig in _STOP_SIGNALS:  # the fork server's handler is not ours
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # blocked by the fork
    conn.settimeout(None)
    threading.excepthook = functools.partial(_thread_failed, alive, threading.excepthook)
    try:
        work(env)
        status = 0
    except BaseException:  # noqa: BLE001
        if not _driver_gone(alive):
            traceback.print_exc()
    finally:
        # Flushed before the status is sent: once the runner has it, the fork server may end
        # this process (above).
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            conn.sendall(bytes([status]))
        except OSError:
            pass
        os._exit(status)


def _driver_gone(alive: int) -> bool:
    """Whether the driver has died, given what just failed in this worker: its connections
    break as the kernel closes its files, the pipe among them, so a moment is allowed."""
    return bool(select.select([alive], [], [], 0.5)[0])


def _thread_failed(
    alive: int, hook: Callable[[threading.ExceptHookArgs], object], args: threading.ExceptHookArgs
) -> None:
    """A worker thread's uncaught exception (Beam's data and state threads reading a broken
    connection), printed unless the driver is gone."""
    if not _driver_gone(alive):
        hook(args)
