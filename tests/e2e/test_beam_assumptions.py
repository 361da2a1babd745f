"""Each Beam internal that RecordForge's runners rely on still holds (runners/assumptions.py lists
them, numbered as the tests here; the Dask runner's are probed by test_dask_runner.py): after a
Beam upgrade, the test that fails names the assumption that no longer holds, and the feature that
rests on it."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from recordforge.runners import local_runner
from recordforge.runners.assumptions import ASSUMPTIONS, DASK
from recordforge.runners.local_runner import BEAM_VERSION, BEAM_WORKER_COMMAND, unmet_assumptions


def _assumption(number: int) -> str:
    """Assumption `number` as the table states it."""
    found = [a.statement for a in ASSUMPTIONS if a.number == number]
    assert found, f"runners/assumptions.py lists no assumption {number}"
    return found[0]


def _check(number: int, holds: bool, detail: object = "") -> None:
    assert holds, (
        f"Beam {beam.__version__}: assumption {number} of recordforge/runners/assumptions.py no "
        f"longer holds ({detail}): {_assumption(number)}"
    )


def test_every_assumption_is_listed_with_the_features_resting_on_it() -> None:
    numbers = sorted({n for needs in local_runner._NEEDS.values() for n in needs})
    numbers = sorted({*numbers, *local_runner.DRY_RUN_NEEDS, *local_runner.STARTUP_NEEDS})
    assert numbers == list(range(1, 12))
    for number in numbers:
        assert _assumption(number)


@pytest.mark.parametrize("assumption", ASSUMPTIONS, ids=lambda a: str(a.number))
def test_each_assumption_in_the_table_is_tested_and_rests_something(assumption: Any) -> None:
    assert [a.number for a in ASSUMPTIONS] == list(range(1, len(ASSUMPTIONS) + 1))
    assert assumption.statement and assumption.rests_on
    if DASK in assumption.rests_on and assumption.number != 1:
        return  # probed on a cluster, runner against runner, by test_dask_runner.py
    tests = [name for name in globals() if name.startswith(f"test_{assumption.number}_")]
    assert tests, f"no test_{assumption.number}_... checks assumption {assumption.number}"


def test_1_the_beam_version_is_the_one_checked() -> None:
    _check(1, beam.__version__.startswith(BEAM_VERSION + "."), f"BEAM_VERSION is {BEAM_VERSION}")


def test_the_checks_made_when_a_run_starts_pass() -> None:
    for number, why in unmet_assumptions().items():
        _check(number, False, why)


class _Captured(Exception):
    pass


class _ProtoCatcher(FnApiRunner):
    """Beam's runner, stopped where the local runner takes over: at run_via_runner_api."""

    proto: Any = None

    def run_via_runner_api(self, pipeline_proto: Any, options: Any) -> Any:
        type(self).proto = pipeline_proto
        raise _Captured


def test_2_the_runner_hands_over_the_proto_with_beams_worker_command() -> None:
    from apache_beam.portability import python_urns

    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    p = beam.Pipeline(runner=_ProtoCatcher(), options=options)
    _ = p | beam.Create([1, 2]) | beam.Map(str)
    try:
        p.run()
    except _Captured:
        pass
    proto = _ProtoCatcher.proto
    _check(2, proto is not None, "FnApiRunner.run_pipeline did not call run_via_runner_api")
    envs = [(e.urn, e.payload) for e in proto.components.environments.values()]
    _check(2, (python_urns.SUBPROCESS_SDK, BEAM_WORKER_COMMAND.encode()) in envs, envs)


# A fresh interpreter (the only kind in which the runner forks) runs a two-worker pipeline on the
# local runner; its workers write which process handled each element and log a warning.
_FORKED_RUN = textwrap.dedent(
    """
    import json, logging, os, sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from recordforge.runners.local_runner import LocalRunner

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("recordforge").setLevel(logging.INFO)
    folder = sys.argv[1]

    def mark(x):
        if x == 0:
            logging.getLogger("recordforge.probe").warning("a worker's warning")
        with open(os.path.join(folder, str(x)), "w") as f:
            f.write(str(os.getpid()))
        return x

    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    with beam.Pipeline(runner=LocalRunner(), options=options) as p:
        _ = p | beam.Create(list(range(20))) | beam.Reshuffle() | beam.Map(mark)
    print(json.dumps({"driver": os.getpid()}))
    """
)


@pytest.fixture(scope="module")
def forked_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("forked")
    proc = subprocess.run(
        [sys.executable, "-c", _FORKED_RUN, str(folder)], capture_output=True, text=True, timeout=300
    )
    pids = {int(p.name): int(p.read_text()) for p in folder.iterdir()}
    driver = json.loads(proc.stdout.splitlines()[-1])["driver"] if proc.returncode == 0 else None
    return {"returncode": proc.returncode, "stderr": proc.stderr, "pids": pids, "driver": driver}


def test_3_forked_workers_run_through_beams_worker_handlers(forked_run: dict[str, Any]) -> None:
    from apache_beam.runners.portability.fn_api_runner.worker_handlers import GrpcWorkerHandler, WorkerHandler

    _check(3, callable(getattr(WorkerHandler, "register_environment", None)), "no register_environment")
    params = list(inspect.signature(GrpcWorkerHandler.__init__).parameters)
    _check(3, params == ["self", "state", "provision_info", "grpc_server"], params)
    stderr = forked_run["stderr"]
    _check(3, forked_run["returncode"] == 0, stderr[-3000:])
    _check(3, "workers are forked from the driver" in stderr, stderr[-3000:])
    pids = forked_run["pids"]
    _check(3, sorted(pids) == list(range(20)), f"elements handled: {sorted(pids)}")
    _check(3, forked_run["driver"] not in pids.values(), "an element was handled in the driver")


def test_4_a_forked_worker_runs_beams_worker_main_and_logs_through_the_drivers_handlers(
    forked_run: dict[str, Any],
) -> None:
    from apache_beam.runners.worker import sdk_worker_main

    source = inspect.getsource(sdk_worker_main)
    for name in (
        "CONTROL_API_SERVICE_DESCRIPTOR",
        "PIPELINE_OPTIONS",
        "WORKER_ID",
        "LOGGING_API_SERVICE_DESCRIPTOR",
    ):
        _check(4, name in source, f"sdk_worker_main reads no {name}")
    _check(4, "No semi_persistent_directory found" in source, "the no-main-session warning changed")
    stderr = forked_run["stderr"]
    _check(4, forked_run["returncode"] == 0, stderr[-3000:])
    warning = "WARNING recordforge.probe: a worker's warning"
    _check(4, stderr.count(warning) == 1, f"the worker's warning came {stderr.count(warning)} times")
    for noise in ("semi_persistent", "sdk harness starting", "Worker: severity"):
        _check(4, noise not in stderr, f"{noise!r} in the driver's log")


# As _FORKED_RUN, logging as the CLI does, with an element that fails in a worker: the driver
# prints whether it raised it.
_FAILING_FORKED_RUN = textwrap.dedent(
    """
    import logging, sys, threading, time
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from recordforge.runners.local_runner import LocalRunner

    from recordforge.cli.errors import configure_logging

    configure_logging(debug=False)  # as the CLI: Beam's error logs dropped, the driver reports
    logging.getLogger("recordforge").setLevel(logging.INFO)
    if sys.argv[1:] == ["fresh"]:  # another thread: the runner starts its workers afresh
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()

    def fail(x):
        if x == 7:
            raise ValueError("element seven fails")
        return x

    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    try:
        with beam.Pipeline(runner=LocalRunner(), options=options) as p:
            _ = p | beam.Create(list(range(20))) | beam.Reshuffle() | beam.Map(fail)
    except Exception as exn:
        print("driver raised:", "element seven fails" in str(exn))
    """
)


@pytest.mark.parametrize("workers", ["forked", "fresh"])
def test_4_a_failing_instruction_reaches_the_driver_without_the_workers_traceback(workers: str) -> None:
    from apache_beam.runners.worker import sdk_worker

    source = inspect.getsource(sdk_worker)
    _check(4, "print(traceback_string, file=sys.stderr)" in source, "the worker no longer prints it")
    _check(4, "Error processing instruction" in source, "the worker's log line changed")
    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_FORKED_RUN, workers], capture_output=True, text=True, timeout=300
    )
    _check(4, proc.stdout.strip() == "driver raised: True", proc.stdout + proc.stderr[-3000:])
    started = "workers start as fresh processes" if workers == "fresh" else "workers are forked"
    _check(2 if workers == "fresh" else 4, started in proc.stderr, proc.stderr[-3000:])
    for noise in ("Traceback", "Error processing instruction", "semi_persistent"):
        _check(4, noise not in proc.stderr, f"{noise!r} in the driver's log: {proc.stderr[-3000:]}")


def test_5_bundle_processors_make_their_sampler_by_looking_the_class_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from apache_beam.runners.worker import statesampler

    params = list(inspect.signature(statesampler.StateSampler.__init__).parameters)
    _check(5, params[:4] == ["self", "prefix", "counter_factory", "sampling_period_ms"], params)
    made: list[tuple] = []

    class Recording(statesampler.StateSampler):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append((args, kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(statesampler, "StateSampler", Recording)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        assert_that(p | beam.Create([1]) | beam.Map(str), equal_to(["1"]))
    _check(5, bool(made), "no bundle processor made its sampler through statesampler.StateSampler")
    _check(5, all(len(args) == 2 and not kwargs for args, kwargs in made), made[:2])


class _Attempts(beam.DoFn):
    """Appends each element it is given to a file; fails on `fail`."""

    def __init__(self, path: str, fail: int | None) -> None:
        self._path = path
        self._fail = fail

    def process(self, x: int) -> Any:
        with open(self._path, "a") as f:
            f.write(f"{x}\n")
        if x == self._fail:
            raise ValueError(f"element {x} fails")
        yield x


def _attempts(path: Path) -> list[int]:
    return sorted(int(line) for line in path.read_text().split()) if path.exists() else []


@pytest.mark.parametrize("workers", [1, 2])
def test_6_every_bundle_runs_once_and_a_failing_one_fails_the_run(tmp_path: Path, workers: int) -> None:
    options = PipelineOptions([f"--direct_num_workers={workers}"])
    ok = tmp_path / "ok"
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        _ = p | beam.Create(list(range(10))) | beam.ParDo(_Attempts(str(ok), None))
    _check(6, _attempts(ok) == list(range(10)), f"elements processed: {_attempts(ok)}")
    failing = tmp_path / "failing"
    with pytest.raises(Exception, match="element 3 fails"):
        with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
            _ = p | beam.Create([3]) | beam.ParDo(_Attempts(str(failing), 3))
    _check(6, _attempts(failing) == [3], f"the failing element was processed {len(_attempts(failing))} times")


def test_6_a_bundle_repeat_replays_bundles(tmp_path: Path) -> None:
    """What the local runner refuses claims for: each bundle is run more than once."""
    path = tmp_path / "repeat"
    options = PipelineOptions(["--direct_runner_bundle_repeat=1"])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        _ = p | beam.Create([1, 2]) | beam.ParDo(_Attempts(str(path), None))
    _check(6, _attempts(path) == [1, 1, 2, 2], f"elements processed: {_attempts(path)}")


class _CountBundle(beam.DoFn):
    """Writes, at the end of each bundle, how many elements it held (a file per bundle)."""

    def __init__(self, folder: str, stage: str) -> None:
        self._folder = folder
        self._stage = stage

    def start_bundle(self) -> None:
        self._n = 0

    def process(self, x: Any, all_items: Any = None) -> Iterator[Any]:
        self._n += 1
        yield x

    def finish_bundle(self) -> None:
        name = f"{self._stage}-{os.getpid()}-{id(self)}-{os.urandom(4).hex()}"
        Path(self._folder, name).write_text(str(self._n))


def test_7_every_worker_runs_a_bundle_of_each_stage_its_input_dealt_round_robin(tmp_path: Path) -> None:
    options = PipelineOptions(["--direct_num_workers=2"])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        items = (
            p
            | beam.Create(list(range(10)), reshuffle=False)
            | "A" >> beam.ParDo(_CountBundle(str(tmp_path), "a"))
        )
        _ = items | "B" >> beam.ParDo(_CountBundle(str(tmp_path), "b"), beam.pvalue.AsList(items))
    counts = {stage: sorted(int(f.read_text()) for f in tmp_path.glob(f"{stage}-*")) for stage in ("a", "b")}
    # A Create's one impulse goes to one worker; the other runs an empty bundle all the same.
    _check(7, counts["a"] == [0, 10], f"bundles of the Create's stage: {counts['a']}")
    # A stage that starts from stored input (after a side input) gets it dealt out.
    _check(7, counts["b"] == [5, 5], f"bundles of the stage after it: {counts['b']}")


def test_8_workers_see_the_drivers_file_system(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "made by the driver").write_text("inherited")
    options = PipelineOptions(["--direct_running_mode=multi_processing", "--direct_num_workers=2"])
    folder = str(tmp_path)
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        # Lambdas: pickled whole, for workers that cannot import this test module.
        _ = (
            p
            | beam.Create([0, 1], reshuffle=False)
            | beam.Map(
                lambda x: open(f"{folder}/{x}", "w").write(open(f"{folder}/claims/made by the driver").read())
            )
        )
    seen = sorted(f.read_text() for f in tmp_path.iterdir() if f.is_file())
    _check(8, seen == ["inherited", "inherited"], f"workers saw {seen}")


def test_9_beams_fuser_breaks_fusion_at_a_group_by_key() -> None:
    p = beam.Pipeline()
    _ = (
        p
        | "Make" >> beam.Create([("a", 1), ("b", 2)])
        | "Before" >> beam.Map(lambda kv: kv)
        | "Group" >> beam.GroupByKey()
        | "After" >> beam.Map(lambda kv: kv)
    )
    try:
        stages = local_runner.fused_stages(p.to_runner_api())
    except Exception as exn:  # any failure is the assumption failing
        _check(9, False, repr(exn))
    where = {
        step: i
        for i, names in enumerate(stages)
        for name in names
        for step in ("Before", "After")
        if name.startswith(step)
    }
    _check(9, {"Before", "After"} <= set(where), stages)
    _check(9, where["Before"] != where["After"], stages)


def test_10_a_dataflow_dry_run_keeps_its_job_and_pipeline() -> None:
    options = PipelineOptions(
        [
            "--runner=DataflowRunner",
            "--project=my-project",
            "--region=us-central1",
            "--temp_location=gs://bucket/tmp",
            "--dry_run=True",
        ]
    )
    p = beam.Pipeline(options=options)
    _ = p | "Make" >> beam.Create([1, 2]) | "Double" >> beam.Map(lambda x: 2 * x)
    result = p.run()
    try:
        proto, job_name = local_runner.dry_run_job(p, result)
    except Exception as exn:  # any failure is the assumption failing
        _check(10, False, repr(exn))
    _check(10, job_name is not None, "the result has no job")
    names = {t.unique_name for t in proto.components.transforms.values()}
    _check(10, "Double" in names, sorted(names)[:5])


_LEAN_PROBE = """
import json, sys
from recordforge.runners import startup
startup.own_process()
try:
    with startup.heavy_imports():
        import apache_beam as beam
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
        from recordforge.pipelines import convert
        from recordforge.runners import dask_runner, dryrun, local_runner
    loaded = [m for m in startup.UNUSED_BY_CONVERSIONS if m in sys.modules]
    with beam.Pipeline(runner=local_runner.LocalRunner()) as p:
        _ = p | beam.Create([1, 2]) | beam.Map(lambda x: 2 * x)
    print(json.dumps({"loaded": loaded}))
except Exception as exn:
    print(json.dumps({"error": repr(exn)}))
"""


def test_11_beam_imports_without_the_integrations_conversions_never_use() -> None:
    proc = subprocess.run([sys.executable, "-c", _LEAN_PROBE], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    _check(11, proc.returncode == 0 and bool(lines), proc.stderr[-1500:])
    got = json.loads(lines[-1])
    _check(11, "error" not in got, got.get("error"))
    _check(11, got["loaded"] == [], f"imported anyway: {got['loaded']}")


@pytest.mark.parametrize("name", ["DirectRunner", "direct", "FnApiRunner", "DataflowRunner", "dataflow"])
def test_12_beams_runner_lookup_maps_short_names_to_class_paths(name: str) -> None:
    from apache_beam.runners.runner import _RUNNER_MAP

    path = _RUNNER_MAP.get(name.lower(), _RUNNER_MAP.get(name.lower() + "runner"))
    _check(12, path is not None and "." in path, f"{name!r} maps to {path!r}")
    _check(12, path.rsplit(".", 1)[1].lower().startswith(name.lower()), f"{name!r} maps to {path!r}")


class _Counted(beam.DoFn):
    def process(self, element: int) -> Iterator[int]:
        yield element


def test_22_beam_searches_a_dofn_for_specs_through_userstates_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from apache_beam.transforms import userstate

    search = userstate.get_dofn_specs
    specs = search(beam.DoFn())
    _check(22, isinstance(specs, tuple) and [type(s) for s in specs] == [set, set], specs)
    searched: dict[str, int] = {}
    phase = ["build"]

    def counted(dofn: Any) -> Any:
        if isinstance(dofn, _Counted):
            searched[phase[0]] = searched.get(phase[0], 0) + 1
        return search(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counted)
    for caller in (userstate.is_stateful_dofn, userstate.validate_stateful_dofn):
        _check(22, "get_dofn_specs" in caller.__code__.co_names, f"{caller.__name__} calls it otherwise")
    p = beam.Pipeline(runner=FnApiRunner())
    _ = p | beam.Create([1, 2]) | beam.ParDo(_Counted())  # core.py's ParDo
    phase[0] = "proto"
    proto = p.to_runner_api()  # core.py's to_runner_api_parameter
    phase[0] = "run"
    beam.Pipeline.from_runner_api(proto, FnApiRunner(), p._options).run().wait_until_finish()  # common.py
    _check(22, set(searched) == {"build", "proto", "run"}, f"searches seen by phase: {searched}")


def test_23_a_pipeline_makes_a_temporary_folder_that_only_its_run_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    from recordforge.runners.session import discard

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ran, unrun = beam.Pipeline(runner=FnApiRunner()), beam.Pipeline(runner=FnApiRunner())
    for p in (ran, unrun):
        folder = getattr(p, "local_tempdir", None)
        _check(23, isinstance(folder, str) and os.path.dirname(folder) == str(tmp_path), folder)
        _check(23, os.path.isdir(folder), f"{folder} not made")
    _ = ran | beam.Create([1]) | beam.Map(lambda x: x)
    ran.run().wait_until_finish()
    _check(23, not os.path.exists(ran.local_tempdir), "a run left its folder")
    _check(23, os.path.isdir(unrun.local_tempdir), "a pipeline never run has no folder left to remove")
    discard(unrun)
    assert list(tmp_path.iterdir()) == []


def test_24_an_options_view_is_a_window_on_the_options_own_dict() -> None:
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    def subclasses(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    own = [c.__name__ for c in subclasses(PipelineOptions) if "view_as" in vars(c)]
    _check(24, own == [], f"view_as overridden by {own}")
    options = PipelineOptions(["--direct_num_workers=3"])
    view = options.view_as(DirectOptions)
    _check(24, type(view) is DirectOptions and view.direct_num_workers == 3, view)
    _check(24, view._all_options is options._all_options, "a view has a dict of its own")
    _check(24, view._flags is options._flags, "a view has flags of its own")
    view.direct_num_workers = 4
    options.view_as(StandardOptions).runner = "FnApiRunner"
    _check(24, options._all_options["direct_num_workers"] == 4, "a view's write missed the dict")
    _check(24, options._all_options["runner"] == "FnApiRunner", "a view's write missed the dict")
    _check(24, vars(view).keys() == {"_flags", "_visible_options", "_all_options"}, vars(view).keys())
