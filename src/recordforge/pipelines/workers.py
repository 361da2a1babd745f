"""Local multi-process workers that start in milliseconds instead of seconds.

`--direct_running_mode=multi_processing` makes Beam's FnApiRunner launch every worker as
`python -m apache_beam.runners.worker.sdk_worker_main`: a fresh interpreter that spends ~1.5 s
importing Beam (and pandas, pymongo, the GCP clients... that Beam's package pulls in) before it
can take work, and ~0.4 s tearing down after. On a 2-core machine converting 1M rows in ~5 s,
that start-up alone cancels what the second core gains.

`LocalRunner` keeps Beam's runner and protocol as they are and changes only how a worker
process comes to exist: just before the job runs, the driver forks a small fork server (Beam,
Arrow and RecordForge are already imported in it), and the run's worker environment is swapped
for one whose handler (`_ForkedWorkerHandler`) hands the worker's environment (control endpoint,
pipeline options, worker id) to the fork server over a Unix socket. The fork server forks a
worker that runs Beam's own `sdk_worker_main` with it and reports its exit status back on the
same socket. No shell, no client interpreter and no logging server stand between the runner and
its workers: a forked worker logs through the handlers it inherited from the driver.

Two more things LocalRunner does for every run. It names a fresh claims folder in the environment
of multi-process runs, through which the workers share their input as they go
(transforms/sharing.py). And its bundles sample their state every 20 ms instead of 200 ms, so
that a long bundle does not wait ~0.1 s at its end for the sampler's thread to wake up.

Forking is only safe while no other thread could hold a lock the child inherits: the fork
server is made only when the driver runs no other Python thread and has not loaded TensorFlow
(whose native thread pools do not survive a fork). Otherwise, for instance a second pipeline in
the same test process or a tensorflow-transform run, Beam's own worker command is used unchanged.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from apache_beam.portability import python_urns
from apache_beam.portability.api import endpoints_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.portability.fn_api_runner.worker_handlers import GrpcWorkerHandler, WorkerHandler
from apache_beam.runners.worker import statesampler
from google.protobuf import json_format, text_format

from recordforge.pipelines.lease import heartbeat_threads, quiet_heartbeats
from recordforge.pipelines.progress import quiet_watches, watch_threads
from recordforge.transforms.sharing import SHARED_WORK_ENV

__all__ = ["LocalRunner", "BEAM_WORKER_COMMAND", "FORKED_WORKER_URN"]

_LOGGER = logging.getLogger(__name__)

# What FnApiRunner puts in the pipeline for multi_processing (fn_runner.py); matched exactly, so
# that any other subprocess environment is left alone.
BEAM_WORKER_COMMAND = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"
# The environment LocalRunner swaps in: its payload is the fork server's socket path.
FORKED_WORKER_URN = "recordforge:env:forked_python:v1"


class LocalRunner(FnApiRunner):
    """Beam's FnApiRunner (what DirectRunner uses for batch), with fork-started workers in
    multi_processing mode. In-process runs are FnApiRunner's, untouched."""

    def run_via_runner_api(self, pipeline_proto: Any, options: Any) -> Any:
        with _prompt_bundle_ends():
            return self._run(pipeline_proto, options)

    def _run(self, pipeline_proto: Any, options: Any) -> Any:
        envs = [
            env
            for env in pipeline_proto.components.environments.values()
            if env.urn == python_urns.SUBPROCESS_SDK and env.payload == BEAM_WORKER_COMMAND.encode()
        ]
        if not envs:
            return super().run_via_runner_api(pipeline_proto, options)
        with _shared_work():
            unsafe = _fork_unsafe()
            if unsafe:
                _LOGGER.info("multi_processing workers start as fresh processes: %s", unsafe)
                return super().run_via_runner_api(pipeline_proto, options)
            _LOGGER.info("multi_processing workers are forked from the driver")
            with _ForkServer() as server:
                for env in envs:
                    env.urn = FORKED_WORKER_URN
                    env.payload = server.path.encode()
                return super().run_via_runner_api(pipeline_proto, options)


class _PromptStateSampler(statesampler.StateSampler):
    """Beam's per-bundle state sampler, sampling every 20 ms at most rather than 200 ms. Ending a
    bundle joins the sampler's thread, which first finishes its current sleep: ~0.1 s at the end
    of every long bundle (the conversion stage is one per worker), 2-4% of a 1M-row run. Finer
    sampling costs ~50 wake-ups a second of a thread that holds no GIL."""

    def __init__(self, prefix: str, counter_factory: Any, sampling_period_ms: int = 20) -> None:
        super().__init__(prefix, counter_factory, min(sampling_period_ms, 20))


@contextlib.contextmanager
def _prompt_bundle_ends() -> Iterator[None]:
    # Beam's bundle processor looks the class up in the module each time it makes a sampler;
    # forked workers inherit the swap.
    original = statesampler.StateSampler
    statesampler.StateSampler = _PromptStateSampler
    try:
        yield
    finally:
        statesampler.StateSampler = original


def _private_temp_dir(prefix: str) -> str:
    """A fresh temporary folder named after this process; first, the folders of this kind that a
    process killed outright (kill -9 runs no cleanup) left behind are removed."""
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        pid = name[len(prefix) :].split("-", 1)[0]
        if name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def _shared_work() -> Iterator[None]:
    """A claims folder for the run's workers (transforms/sharing.py), named in the environment
    that they inherit, removed with its claims when the run ends."""
    folder = _private_temp_dir("recordforge-claims-")
    previous = os.environ.get(SHARED_WORK_ENV)
    os.environ[SHARED_WORK_ENV] = folder
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SHARED_WORK_ENV, None)
        else:
            os.environ[SHARED_WORK_ENV] = previous
        shutil.rmtree(folder, ignore_errors=True)


def _fork_unsafe() -> str | None:
    """Why forking this process now could hang a worker, or None when it is safe."""
    others = set(threading.enumerate()) - {threading.current_thread()} - heartbeat_threads() - watch_threads()
    if others:
        # Another thread may hold a lock (gRPC's, logging's) that the child would inherit held.
        # An output lease's heartbeat and the progress line are the exceptions: the fork is made
        # in quiet_heartbeats() and quiet_watches().
        return "this process already runs other threads"
    if "tensorflow" in sys.modules:
        # TensorFlow starts native thread pools that a forked child cannot use (TFT pipelines).
        return "TensorFlow is loaded in this process"
    return None


@WorkerHandler.register_environment(FORKED_WORKER_URN, bytes)
class _ForkedWorkerHandler(GrpcWorkerHandler):
    """Beam's handler for one worker of the forked environment: what Beam's subprocess handler
    does (the worker's environment, its exit status watched on a thread), with the fork server
    in place of a shell and a client interpreter, and no logging server: a forked worker logs
    through the driver's own handlers."""

    def __init__(self, socket_path: bytes, state: Any, provision_info: Any, grpc_server: Any) -> None:
        super().__init__(state, provision_info, grpc_server)
        self._socket_path = socket_path.decode()
        self._watcher: threading.Thread | None = None

    def start_worker(self) -> None:
        env = dict(
            os.environ,
            CONTROL_API_SERVICE_DESCRIPTOR=text_format.MessageToString(
                endpoints_pb2.ApiServiceDescriptor(url=self.control_address)
            ),
            PIPELINE_OPTIONS=json_format.MessageToJson(self.provision_info.provision_info.pipeline_options),
            WORKER_ID=self.worker_id,
        )
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self._socket_path)
        body = json.dumps(env).encode()
        conn.sendall(struct.pack(">I", len(body)) + body)
        self._watcher = threading.Thread(target=self._watch, args=(conn,), name=f"forked_{self.worker_id}")
        self._watcher.start()

    def _watch(self, conn: socket.socket) -> None:
        with conn:
            status = conn.recv(1)  # blocks while the worker runs
        if not status or status[0]:
            # As Beam's subprocess handler: the runner learns of a lost worker from its control
            # channel; this names the process side of it.
            _LOGGER.error(
                "forked Beam worker %s ended %s",
                self.worker_id,
                "without a status" if not status else f"with status {status[0]}",
            )

    def stop_worker(self) -> None:
        if self._watcher is not None:
            self._watcher.join()


class _ForkServer:
    """A forked copy of the driver, before any gRPC thread exists, that forks workers on request
    over a Unix socket in a private temporary folder."""

    def __enter__(self) -> _ForkServer:
        self._dir = _private_temp_dir("recordforge-workers-")
        path = os.path.join(self._dir, "fork.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)
        driver = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        with quiet_heartbeats(), quiet_watches():
            pid = os.fork()
        if pid == 0:  # the fork server
            code = 0
            try:
                _serve(listener, driver)
            except BaseException:  # noqa: BLE001 - a child must never return into the driver
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        listener.close()
        self._pid = pid
        self.path = path
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            os.kill(self._pid, signal.SIGTERM)
            os.waitpid(self._pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        shutil.rmtree(self._dir, ignore_errors=True)


class _Stop(Exception):
    pass


def _stop(signum: int, frame: object) -> None:
    raise _Stop


def _serve(listener: socket.socket, driver: int) -> None:
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        _accept_loop(listener, driver)
    except _Stop:
        pass
    # Wait for the workers (they end when the runner closes their control channel), so that
    # none is left a zombie and their resource usage counts towards the driver's children.
    try:
        while True:
            os.waitpid(-1, 0)
    except ChildProcessError:
        pass


def _accept_loop(listener: socket.socket, driver: int) -> None:
    while os.getppid() == driver:  # gone with the driver, whatever way it ended
        ready, _, _ = select.select([listener], [], [], 0.5)
        _reap()
        if not ready:
            continue
        conn, _ = listener.accept()
        env = _receive_env(conn)
        if env is None:
            conn.close()
            continue
        if os.fork() == 0:
            listener.close()
            _work(conn, env)  # never returns
        conn.close()


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


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


class _NoMainSession(logging.Filter):
    """Drops Beam's warning that a worker found no pickled main session to load: a forked worker
    has the driver's whole memory, so there is none to load, and the warning would come on every
    run from every worker."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No semi_persistent_directory found")


def _work(conn: socket.socket, env: dict[str, str]) -> None:
    """Runs Beam's SDK harness with the runner's environment for this worker, reports its status,
    and leaves without interpreter teardown (the driver's atexit hooks are not this process's)."""
    status = 1
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the fork server's handler is not ours
    try:
        # The worker logs through the driver's handlers, at what the driver shows (RecordForge's
        # own INFO lines with --debug): Beam's harness lowers the root logger's level to its own
        # default (INFO) while it starts.
        root = logging.getLogger()
        driver = root.getEffectiveLevel()
        shown = min(driver, logging.getLogger("recordforge").getEffectiveLevel())
        for handler in root.handlers:
            handler.setLevel(max(handler.level, shown))
        beam_logger = logging.getLogger("apache_beam")
        beam_logger.setLevel(beam_logger.getEffectiveLevel() if beam_logger.level else driver)
        logging.getLogger("apache_beam.runners.worker.sdk_worker_main").addFilter(_NoMainSession())
        os.environ.clear()
        os.environ.update(env)
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main([])
        status = 0
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        try:
            conn.sendall(bytes([status]))
        except OSError:
            pass
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
