"""The Beam internals RecordForge's runners rely on, as one table the assumption tests check."""

from __future__ import annotations

from dataclasses import dataclass

from recordforge.runners.startup import BEAM_VERSION

__all__ = [
    "ASSUMPTIONS",
    "BEAM_VERSION",
    "DASK",
    "BEAM_MEMOS",
    "DRY_RUNS",
    "FORKING",
    "LEAN_IMPORT",
    "PIPELINE_TEMP",
    "PROMPT_ENDS",
    "SHARING",
    "TRAITS",
    "Assumption",
    "needs",
]

# What rests on the assumptions: the local runner's features, and the other users of Beam's insides.
SHARING, FORKING, PROMPT_ENDS = "work sharing", "forked workers", "prompt bundle ends"
DRY_RUNS = "Dataflow dry runs"  # runners/dryrun.py: built, never run, so nothing falls back
LEAN_IMPORT = "lean Beam import"  # startup.py; off on any other Beam version
TRAITS = "runner traits"  # runners/session.py
DASK = "Dask runner"  # runners/dask_runner.py: refuses to start on any other Beam version
PIPELINE_TEMP = "no temporary folder left"  # runners/session.discard, from convert.py
BEAM_MEMOS = "Beam's answers kept"  # runners/beam_memos.py, from startup.py; off on any other Beam version


@dataclass(frozen=True)
class Assumption:
    """One thing Beam does, as found in the Beam version `BEAM_VERSION` names, and what rests on it."""

    number: int
    statement: str
    rests_on: tuple[str, ...]


ASSUMPTIONS: tuple[Assumption, ...] = (
    Assumption(
        1,
        "The version. On any other Beam minor version the local run is Beam's FnApiRunner unchanged "
        "(no claims, Beam's workers and sampler), with one log line, and the Dask runner refuses to "
        "start: re-check each item, run tests/e2e/test_beam_assumptions.py and test_dask_runner.py, "
        "then change BEAM_VERSION (in startup.py).",
        (SHARING, FORKING, PROMPT_ENDS, DASK),
    ),
    Assumption(
        2,
        "FnApiRunner.run_pipeline(pipeline, options) hands the pipeline proto to "
        "run_via_runner_api(proto, options), which makes the stages from the proto it is given; with "
        "direct_running_mode=multi_processing the proto's default environment has urn "
        "python_urns.SUBPROCESS_SDK and payload exactly BEAM_WORKER_COMMAND (a multi_processing run "
        "in which no environment matches runs Beam's command, with a log line); the runner starts "
        "such a worker by running the payload as a shell command line with the worker's settings "
        "in its environment, so that a run whose workers cannot be forked swaps in "
        "runners/fresh_worker.py's command.",
        (FORKING,),
    ),
    Assumption(
        3,
        "WorkerHandler.register_environment(urn, payload_type) registers a handler class, which the "
        "runner constructs as cls(payload, state, provision_info, grpc_server); "
        "GrpcWorkerHandler.__init__(state, provision_info, grpc_server) sets control_address and "
        "worker_id; provision_info.provision_info.pipeline_options holds the options proto; the "
        "runner calls start_worker() once and stop_worker() at the end.",
        (FORKING,),
    ),
    Assumption(
        4,
        "sdk_worker_main.main(argv) runs a worker from its environment: CONTROL_API_SERVICE_DESCRIPTOR "
        "(a text-format ApiServiceDescriptor), PIPELINE_OPTIONS (JSON), WORKER_ID; without "
        "LOGGING_API_SERVICE_DESCRIPTOR it logs through the process's own logging handlers (having "
        "set the root logger's level to INFO); it returns once the runner closes the control channel; "
        "it warns 'No semi_persistent_directory found' (logger apache_beam.runners.worker."
        "sdk_worker_main) when there is no pickled main session, as in a forked worker, which needs "
        "none: that line is filtered. When an instruction fails, SdkWorker._execute (module "
        "apache_beam.runners.worker.sdk_worker) prints its traceback to sys.stderr, logs it at ERROR "
        "('Error processing instruction ...') and returns it to the runner as the instruction's "
        "error, which the driver raises: a forked worker drops the print and the log line unless "
        "the driver shows DEBUG.",
        (FORKING,),
    ),
    Assumption(
        5,
        "The bundle processor makes its sampler as statesampler.StateSampler(prefix, "
        "counter_factory), looking the class up in the module for every bundle processor, and "
        "StateSampler.__init__(prefix, counter_factory, sampling_period_ms).",
        (PROMPT_ENDS,),
    ),
    Assumption(
        6,
        "FnApiRunner runs every bundle once: a failing bundle fails the run, and no bundle is "
        "retried. --direct_runner_bundle_repeat replays each bundle (dry runs, outputs dropped) "
        "before it runs it: a run with it gets no claims folder, as a replay's claims would hide "
        "items from the real bundle. (Exactly once.)",
        (SHARING,),
    ),
    Assumption(
        7,
        "With several workers, a stage's stored input is dealt out to them round robin (an "
        "Impulse's one element to the first), and every worker runs a bundle for the stage, an "
        "empty one included, whose finish_bundle runs: a worker given no items takes its share "
        "through the claims at the end of its bundle. (Without it, one worker reads what a Create "
        "holds.)",
        (SHARING,),
    ),
    Assumption(
        8,
        "FnApiRunner's workers, in every running mode, run on the driver's machine and see its file "
        "system: a folder the driver makes before the run (claims) is theirs too, by its path.",
        (SHARING,),
    ),
    Assumption(
        9,
        "fn_api_runner.translations.create_and_optimize_stages(proto, phases, known_runner_urns) "
        "with the phases the FnApiRunner applies up to fusion (greedily_fuse and those before it) "
        "returns stages whose transforms name the pipeline's steps; it breaks fusion where Dataflow "
        "does, at every GroupByKey and side input. (The stages a dry run shows: fused_stages.)",
        (DRY_RUNS,),
    ),
    Assumption(
        10,
        "DataflowRunner.run_pipeline with TestOptions.dry_run returns before it makes an API "
        "client: a result whose job is the apiclient.Job it would submit, and the runner keeps the "
        "portable pipeline it would stage in proto_pipeline. (dry_run_job.)",
        (DRY_RUNS,),
    ),
    Assumption(
        11,
        "Importing apache_beam succeeds without apache_beam.io.gcp.bigquery and "
        "apache_beam.io.gcp.pubsub (startup.UNUSED_BY_CONVERSIONS): Beam imports them inside a "
        "try/except ImportError, and nothing a conversion runs (locally, on Dask or built for "
        "Dataflow) needs them from Beam's namespace.",
        (LEAN_IMPORT,),
    ),
    Assumption(
        12,
        "apache_beam.runners.runner._RUNNER_MAP maps a runner's short name as --runner takes it, "
        "lower case (with or without 'runner'), to its class path, as create_runner reads it: "
        "runner_traits finds the class of a runner named either way.",
        (TRAITS,),
    ),
    Assumption(
        13,
        "apache_beam.runners.dask.dask_runner: DaskRunner (run_pipeline(pipeline, options)), "
        "DaskOptions (dests address, timeout, scheduler_file, name, connection_limit, npartitions, "
        "partition_size; _extract_bag_kwargs pops the last two) and DaskRunnerResult(client, futures).",
        (DASK,),
    ),
    Assumption(
        14,
        "apache_beam.runners.dask.overrides: dask_overrides() replaces Create by _Create(values), "
        "Reshuffle by _Reshuffle, Read by _Read(source), GroupByKey by ReifyWindows (a ParDo), "
        "_GroupByKeyOnly and _GroupAlsoByWindow (a ParDo), Flatten by _Flatten; ReifyWindows emits "
        "(key, WindowedValue).",
        (DASK,),
    ),
    Assumption(
        15,
        "apache_beam.runners.common.DoFnRunner(fn, args, kwargs, side_inputs, windowing, "
        "tagged_receivers, step_name=...) with setup, start, process(windowed_value), finish, "
        "teardown; it asks tagged_receivers[None] for the main output and tagged_receivers[tag] for "
        "others, and calls receive(windowed_value) on them.",
        (DASK,),
    ),
    Assumption(
        16,
        "A ParDo's fn, args and kwargs hold placeholders for its side inputs, filled in the order of "
        "AppliedPTransform.side_inputs; AsSideInput._view_options() and SideInputMap(view_class, "
        "view_options, windowed_values) make a side input's value; AppliedPTransform.outputs maps "
        "tags (None for the main output) to PCollections; Pipeline.visit visits producers (side "
        "inputs included) before consumers.",
        (DASK,),
    ),
    Assumption(
        17,
        "apache_beam.internal.pickler.desired_pickle_lib is the module (with dumps/loads) that the "
        "pipeline pickles with.",
        (DASK,),
    ),
    Assumption(
        18,
        "DoFnSignature(fn).is_splittable_dofn() / .is_stateful_dofn(); "
        "trivial_inference.key_value_types; iobase.BoundedSource.split and SourceBundle. Of Dask "
        "(dask[distributed]): Bag, dask.delayed and Client public APIs; and, only for the wait on "
        "failure, a worker's state.all_running_tasks.",
        (DASK,),
    ),
    Assumption(
        19,
        "Of Dask: a Bag can be made as dask.bag.Bag(HighLevelGraph(layers, dependencies), name, n) "
        "from MaterializedLayers of dask.task_spec Tasks (TaskRef, List) keyed (name, i); and a "
        "layer's annotations {'workers': callable(key) -> [address], 'allow_other_workers': True} "
        "reach distributed's scheduler per key as loose worker restrictions, which it honours "
        "(a shuffle's output partitions are spread over the cluster's worker threads so).",
        (DASK,),
    ),
    Assumption(
        20,
        "Of distributed: a task result whose type has functions registered with "
        "distributed.protocol.serialize's dask_serialize / dask_deserialize travels between "
        "workers (and spills) through them, as a header and frames, the receiver importing the "
        "type's module by its pickled type; dask.sizeof.sizeof.register(type) sizes an element "
        "for the scheduler and the workers' memory limits.",
        (DASK,),
    ),
    Assumption(
        21,
        "Pipeline.run rebuilds the pipeline from its proto before running it (a test of the proto) "
        "only when runner.is_fnapi_compatible() is False; when True, the runner's run_pipeline gets "
        "the pipeline run was called on, and Pipeline.__init__ adds the experiment beam_fn_api to "
        "the options, which no transform's expansion or Beam code outside the FnApiRunner reads.",
        (DASK,),
    ),
    Assumption(
        22,
        "userstate.get_dofn_specs(dofn) returns (state specs, timer specs), two sets found from the "
        "DoFn's methods alone; every caller a pipeline's build, translation and run reach looks it "
        "up in userstate's namespace at each call (userstate.is_stateful_dofn and "
        "validate_stateful_dofn by their module globals, core.py and runners/common.py as "
        "userstate.get_dofn_specs / userstate.is_stateful_dofn), so replacing that one name "
        "answers them all.",
        (BEAM_MEMOS,),
    ),
    Assumption(
        23,
        "Pipeline.__init__ makes a temporary folder, Pipeline.local_tempdir, under "
        "tempfile.gettempdir(); only Pipeline.run removes it (whatever the run's outcome), so a "
        "pipeline that is made and never run leaves it behind unless its maker removes it.",
        (PIPELINE_TEMP,),
    ),
    Assumption(
        24,
        "PipelineOptions.view_as(cls) returns cls(self._flags) with its _all_options set to the "
        "options' own dict (after adding the defaults of the options cls declares that the dict "
        "lacks); a view reads and writes its options through _all_options only, so two views of "
        "one class over the same flags and dict answer alike; no PipelineOptions subclass "
        "overrides view_as.",
        (BEAM_MEMOS,),
    ),
)


def needs(feature: str) -> tuple[int, ...]:
    """The numbers of the assumptions `feature` rests on."""
    return tuple(a.number for a in ASSUMPTIONS if feature in a.rests_on)
