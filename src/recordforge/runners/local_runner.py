"""RecordForge's local runner: Beam's FnApiRunner with forked workers and prompt bundle ends."""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from recordforge import interrupts
from recordforge.output import crashpoints
from recordforge.output.lease import heartbeat_threads
from recordforge.progress.live import watch_threads
from recordforge.runners.assumptions import (
    DRY_RUNS,
    FORKING,
    LEAN_IMPORT,
    PROMPT_ENDS,
    SHARING,
    needs,
)
from recordforge.runners.fork_server import ForkServer, request_worker
from recordforge.runners.startup import BEAM_VERSION
from recordforge.runners.worker_logs import quiet_worker

__all__ = [
    "BEAM_VERSION",
    "BEAM_WORKER_COMMAND",
    "FORKED_WORKER_URN",
    "LocalRunner",
    "dry_run_job",
    "fused_stages",
    "shares_work",
    "unmet_assumptions",
]

_LOGGER = logging.getLogger(__name__)

# What FnApiRunner puts in the pipeline for multi_processing (assumption 2); matched exactly, so
# that any other subprocess environment is left alone.
BEAM_WORKER_COMMAND = f"{sys.executable} -m apache_beam.runners.worker.sdk_worker_main"
# The environment LocalRunner swaps in: its payload is the fork server's socket path.
FORKED_WORKER_URN = "recordforge:env:forked_python:v1"
_SAMPLING_PERIOD_MS = 20

# The features, and the assumptions (assumptions.py) each rests on.
_NEEDS = {feature: needs(feature) for feature in (SHARING, FORKING, PROMPT_ENDS)}
DRY_RUN_NEEDS = needs(DRY_RUNS)
STARTUP_NEEDS = needs(LEAN_IMPORT)


class LocalRunner(FnApiRunner):
    """Beam's FnApiRunner with forked workers in multi_processing mode and prompt bundle ends, on
    which pipelines built for it share their work items (RunnerTraits.claims): each where the Beam
    internals it rests on hold (docs/architecture.md, assumptions.py)."""

    def run_via_runner_api(self, pipeline_proto: Any, options: Any) -> Any:
        envs = _beam_worker_envs(pipeline_proto)
        features, reasons = _features(options, bool(envs))
        _log_left_to_beam(features, reasons)
        with contextlib.ExitStack() as stack:
            if PROMPT_ENDS in features:
                stack.enter_context(_prompt_bundle_ends())
            if FORKING in features and envs:
                unsafe = _fork_unsafe()
                if unsafe:
                    _LOGGER.info("multi_processing workers start as fresh processes: %s", unsafe)
                    for env in envs:
                        env.payload = _fresh_worker_command().encode()
                else:
                    _LOGGER.info("multi_processing workers are forked from the driver")
                    _forked_handler()  # registered for FORKED_WORKER_URN
                    workers = options.view_as(DirectOptions).direct_num_workers
                    work = functools.partial(_run_beam_worker, arrow_threads=_arrow_threads(workers))
                    server = stack.enter_context(ForkServer(work))
                    stack.enter_context(_stopped_on_interrupt(server))
                    for env in envs:
                        env.urn = FORKED_WORKER_URN
                        env.payload = server.path.encode()
            return super().run_via_runner_api(pipeline_proto, options)


def unmet_assumptions() -> dict[int, str]:
    """The assumptions that a check made when a run starts finds broken, with why."""
    broken: dict[int, str] = {}
    if not beam.__version__.startswith(BEAM_VERSION + "."):
        broken[1] = f"Beam {beam.__version__} is installed, the checks were made on {BEAM_VERSION}"
    for number, check in _RUN_TIME_CHECKS.items():
        try:
            why = check()
        except Exception as exn:  # noqa: BLE001 - a missing module or name is a broken assumption
            why = f"{type(exn).__name__}: {exn}"
        if why:
            broken[number] = why
    return broken


def shares_work(options: Any) -> bool:
    """Whether a run with these options may share work items through claims (assumptions 1, 6,
    7, 8, and no bundle replays): `runners.session.runner_traits` names a claims folder if so."""
    return SHARING in _features(options, False)[0]


def _log_left_to_beam(features: set[str], reasons: list[str]) -> None:
    if reasons:
        left = ", ".join(sorted(set(_NEEDS) - features))
        _LOGGER.warning(
            "local runner: %s left to Beam (%s); see %s's assumptions in recordforge.runners.assumptions",
            left,
            "; ".join(reasons),
            __name__,
        )


def _features(options: Any, beam_worker_envs: bool) -> tuple[set[str], list[str]]:
    """The features this run gets (`beam_worker_envs`: whether its proto holds environments that
    run Beam's worker command), and why the others are left to Beam."""
    broken = unmet_assumptions()
    features = {f for f, needs in _NEEDS.items() if not broken.keys() & set(needs)}
    reasons = [f"assumption {n}: {why}" for n, why in sorted(broken.items())]
    repeat = options.view_as(DirectOptions).direct_runner_bundle_repeat
    if SHARING in features and repeat:
        features.discard(SHARING)
        reasons.append(f"assumption 6: --direct_runner_bundle_repeat={repeat} replays bundles")
    multi_processing = options.view_as(DirectOptions).direct_running_mode == "multi_processing"
    if multi_processing and FORKING in features and not beam_worker_envs:
        features.discard(FORKING)
        reasons.append(f"assumption 2: no worker environment runs {BEAM_WORKER_COMMAND!r}")
    return features, reasons


def _beam_worker_envs(pipeline_proto: Any) -> list[Any]:
    """The environments that run Beam's worker command (assumption 2)."""
    try:
        from apache_beam.portability import python_urns
    except ImportError:
        return []

    return [
        env
        for env in pipeline_proto.components.environments.values()
        if env.urn == python_urns.SUBPROCESS_SDK and env.payload == BEAM_WORKER_COMMAND.encode()
    ]


def _check_worker_handlers() -> str:
    from apache_beam.runners.portability.fn_api_runner.worker_handlers import GrpcWorkerHandler, WorkerHandler

    if not callable(getattr(WorkerHandler, "register_environment", None)):
        return "WorkerHandler.register_environment is gone"
    params = list(inspect.signature(GrpcWorkerHandler.__init__).parameters)
    if params != ["self", "state", "provision_info", "grpc_server"]:
        return f"GrpcWorkerHandler.__init__ takes {params}"
    return ""


def _check_worker_main() -> str:
    from apache_beam.runners.worker import sdk_worker_main

    return "" if callable(getattr(sdk_worker_main, "main", None)) else "sdk_worker_main.main is gone"


def _check_sampler() -> str:
    from apache_beam.runners.worker import statesampler

    params = list(inspect.signature(statesampler.StateSampler.__init__).parameters)
    if params[:4] != ["self", "prefix", "counter_factory", "sampling_period_ms"]:
        return f"StateSampler.__init__ takes {params}"
    return ""


def _check_runner() -> str:
    # Looked up on Beam's class: LocalRunner's own override would always be found.
    if not callable(vars(FnApiRunner).get("run_via_runner_api")):
        return "FnApiRunner.run_via_runner_api is gone"
    return ""


_RUN_TIME_CHECKS: dict[int, Callable[[], str]] = {
    2: _check_runner,
    3: _check_worker_handlers,
    4: _check_worker_main,
    5: _check_sampler,
}


@contextlib.contextmanager
def _prompt_bundle_ends() -> Iterator[None]:
    # Beam's bundle processor looks the class up in the module each time it makes a sampler
    # (assumption 5); forked workers inherit the swap.
    from apache_beam.runners.worker import statesampler

    original = statesampler.StateSampler

    class _PromptStateSampler(original):  # type: ignore[misc, valid-type]
        """Beam's state sampler, sampling every 20 ms at most rather than 200 ms. Ending a bundle
        joins the sampler's thread, which first finishes its current sleep, at the end of every
        long bundle (the conversion stage is one per worker). Finer sampling costs a few dozen
        wake-ups a second of a thread that holds no GIL."""

        def __init__(self, prefix: str, counter_factory: Any, sampling_period_ms: int = 200) -> None:
            super().__init__(prefix, counter_factory, min(sampling_period_ms, _SAMPLING_PERIOD_MS))

    statesampler.StateSampler = _PromptStateSampler  # type: ignore[misc]  # Beam's class, replaced while a run needs it
    try:
        yield
    finally:
        statesampler.StateSampler = original  # type: ignore[misc]


# How often the driver looks for a recorded interrupt while Beam's runner waits for its workers.
_INTERRUPT_POLL_S = 0.1


@contextlib.contextmanager
def _stopped_on_interrupt(server: ForkServer) -> Iterator[None]:
    """While the run's forked workers run: an interrupt recorded in the driver ends them (and the
    fork server) at once. A terminal's Ctrl-C reaches the workers itself; a SIGTERM (or
    SIGINT) sent to the driver alone does not, and the driver's main thread is waiting inside
    Beam's runner, where no safe point of ours runs: without this the run would go on to its end.
    Their connections then break, Beam's wait fails, and the failure is the interrupt
    (interrupts.py). A thread of ordinary code, not the signal handler, acts: it starts after
    the fork server is made, so no worker is forked from a process running it."""
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if interrupts.received(within=_INTERRUPT_POLL_S):
                server.end_workers()
                return

    watcher = threading.Thread(target=watch, name="recordforge-interrupt-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


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


_handler_class: Any = None  # the registered handler class (Beam's decorator returns it untyped)


def _forked_handler() -> type:
    """Beam's handler for one worker of the forked environment (assumption 3), registered on
    first use: what Beam's subprocess handler does (the worker's environment, its exit status
    watched on a thread), with the fork server in place of a shell and a client interpreter, and
    no logging server."""
    global _handler_class
    if _handler_class is not None:
        return _handler_class
    from apache_beam.portability.api import endpoints_pb2
    from apache_beam.runners.portability.fn_api_runner.worker_handlers import GrpcWorkerHandler, WorkerHandler
    from google.protobuf import json_format, text_format

    class _ForkedWorkerHandler(GrpcWorkerHandler):  # type: ignore[misc, valid-type]
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
                PIPELINE_OPTIONS=json_format.MessageToJson(
                    self.provision_info.provision_info.pipeline_options
                ),
                WORKER_ID=self.worker_id,
            )
            conn = request_worker(self._socket_path, env)
            self._watcher = threading.Thread(
                target=_watch,
                args=(conn, self.worker_id, self.control_conn.abort),
                name=f"forked_{self.worker_id}",
            )
            self._watcher.start()

        def stop_worker(self) -> None:
            crashpoints.reached("workers_closing")
            if self._watcher is not None:
                self._watcher.join()

    _handler_class = WorkerHandler.register_environment(FORKED_WORKER_URN, bytes)(_ForkedWorkerHandler)
    return _handler_class


def _watch(conn: Any, worker_id: str, lost: Callable[[Exception], None] | None = None) -> None:
    with conn:
        status = conn.recv(1)  # blocks while the worker runs
    if not status or status[0]:
        if lost is not None:
            # As Beam's Docker handler does: the runner's waits for this worker's answers end
            # (a stage with no outputs waits on its control channel alone, forever otherwise,
            # now that no signal handler raises into the waiting thread).
            _abort(lost, RuntimeError(f"forked Beam worker {worker_id} ended"))
        if interrupts.received(within=interrupts.MOMENT_S):
            return  # ended by the Ctrl-C that stops the run, which the CLI reports
        # As Beam's subprocess handler: the runner learns of a lost worker from its control
        # channel; this names the process side of it.
        _LOGGER.error(
            "forked Beam worker %s ended %s",
            worker_id,
            "without a status" if not status else f"with status {status[0]}",
        )


def _abort(lost: Callable[[Exception], None], exn: Exception) -> None:
    """Beam's abort of a connection's pending answers, which iterates a dict the runner's thread
    may change meanwhile: tried again then."""
    for _ in range(10):
        try:
            lost(exn)
            return
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


def _fresh_worker_command() -> str:
    """The command a worker started afresh runs (assumption 2): Beam's worker, made as quiet as
    a forked one (fresh_worker.py), and as verbose where the driver shows DEBUG."""
    debug = min(logging.getLogger().getEffectiveLevel(), logging.getLogger("recordforge").getEffectiveLevel())
    return f"{sys.executable} -m recordforge.runners.fresh_worker" + (
        " --debug" if debug <= logging.DEBUG else ""
    )


def _arrow_threads(workers: int) -> int:
    """Threads for Arrow's CPU pool in each of `workers` forked workers: the cores shared out, so
    that N workers do not each start a pool as wide as the machine (which costs memory and CPU
    time switching between threads). `OMP_NUM_THREADS`, which Arrow reads, still decides if set."""
    if "OMP_NUM_THREADS" in os.environ:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    # Beam reads --direct_num_workers=0 as one worker per core.
    return max(1, cores // (workers or os.cpu_count() or 1))


def _run_beam_worker(env: dict[str, str], arrow_threads: int = 0) -> None:
    """In a forked worker: Beam's SDK harness with the runner's environment for this worker, and
    Arrow's CPU pool `arrow_threads` wide (0: as inherited)."""
    # The worker logs through the driver's handlers, at what the driver shows (RecordForge's own
    # INFO lines with --debug): Beam's harness lowers the root logger's level to its own default
    # (INFO) while it starts.
    root = logging.getLogger()
    driver = root.getEffectiveLevel()
    shown = min(driver, logging.getLogger("recordforge").getEffectiveLevel())
    for handler in root.handlers:
        handler.setLevel(max(handler.level, shown))
    beam_logger = logging.getLogger("apache_beam")
    beam_logger.setLevel(beam_logger.getEffectiveLevel() if beam_logger.level else driver)
    quiet_worker(debug=shown <= logging.DEBUG)
    import pyarrow as pa

    if arrow_threads:
        pa.set_cpu_count(arrow_threads)
    _LOGGER.info("forked worker: Arrow's CPU pool is %d threads wide", pa.cpu_count())
    os.environ.clear()
    os.environ.update(env)
    from apache_beam.runners.worker import sdk_worker_main

    sdk_worker_main.main([])


def fused_stages(pipeline_proto: Any) -> list[list[str]]:
    """The unique names of the transforms in each stage that Beam's own fuser makes of a portable
    pipeline (assumption 9): Dataflow fuses on its service and Beam does not expose that fusion,
    but it breaks fusion at the same places."""
    from apache_beam.portability import common_urns
    from apache_beam.runners.portability.fn_api_runner import translations

    _, stages = translations.create_and_optimize_stages(
        copy.deepcopy(pipeline_proto),
        phases=[
            translations.annotate_downstream_side_inputs,
            translations.fix_side_input_pcoll_coders,
            translations.pack_combiners,
            translations.lift_combiners,
            translations.expand_sdf,
            translations.expand_gbk,
            translations.sink_flattens,
            translations.greedily_fuse,
            translations.read_to_impulse,
            translations.impulse_to_input,
            translations.sort_stages,
        ],
        known_runner_urns=frozenset(
            [common_urns.primitives.FLATTEN.urn, common_urns.primitives.GROUP_BY_KEY.urn]
        ),
    )
    return [[t.unique_name for t in stage.transforms] for stage in stages]


def dry_run_job(pipeline: beam.Pipeline, result: Any) -> tuple[Any, str | None]:
    """The portable pipeline a Dataflow dry run (`--dry_run=True`) would have staged, and the name
    of the job it would have submitted (assumption 10)."""
    job = getattr(result, "job", None)
    runner: Any = pipeline.runner  # Dataflow's runner keeps the proto it built (assumption 10)
    return runner.proto_pipeline, (job.proto.name if job is not None else None)
