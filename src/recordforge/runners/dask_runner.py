"""RecordForge's Dask runner: Beam's DaskRunner with its translation to Dask corrected."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from typing import Any

import apache_beam as beam
from apache_beam import coders, pvalue
from apache_beam.internal import pickler
from apache_beam.io import iobase
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pipeline import AppliedPTransform, Pipeline, PipelineVisitor
from apache_beam.runners.common import DoFnSignature
from apache_beam.runners.runner import PipelineState
from apache_beam.transforms.core import Impulse, ParDo, Windowing
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints import trivial_inference

from recordforge.errors import RecordForgeError
from recordforge.runners.startup import BEAM_VERSION

__all__ = ["BEAM_VERSION", "RUNNER", "DaskRunner", "resolve_runner"]

_LOGGER = logging.getLogger(__name__)

# The dotted path `--runner` takes for this runner.
RUNNER = "recordforge.runners.dask_runner.DaskRunner"
# How long a failed run waits for its tasks still executing on workers.
STRAGGLER_WAIT_S = 60.0

# The names Beam's own runner lookup would accept for a "DaskRunner" (lower case; "runner" may
# be left off), and Beam's class path: Beam's class cannot run RecordForge, so naming it is
# taken as asking for a Dask run.
_NAMES = frozenset({"daskrunner", "dask", "apache_beam.runners.dask.dask_runner.daskrunner"})


def resolve_runner(name: str | None) -> str | None:
    """`RUNNER` when `name` names the Dask runner as Beam would accept it ("DaskRunner", "dask",
    in any case, or Beam's class path); None for any other runner."""
    if name is None or not isinstance(name, str):
        return None
    return RUNNER if name.strip().lower() in _NAMES else None


def _check_beam_version() -> None:
    if not beam.__version__.startswith(BEAM_VERSION + "."):
        raise RecordForgeError(
            f"RecordForge's DaskRunner corrects Beam {BEAM_VERSION}'s Dask runner, but Beam "
            f"{beam.__version__} is installed: re-check the Dask runner's assumptions in "
            "recordforge/runners/assumptions.py against it, run tests/e2e/test_dask_runner.py, "
            "then change BEAM_VERSION"
        )


try:  # Beam's Dask runner imports dask.bag: without dask[distributed] there is none to correct.
    import dask
    import dask.bag as db
    import distributed
    from apache_beam.runners.dask import dask_runner as _beam_dask
    from apache_beam.runners.dask import overrides as _overrides
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from dask.task_spec import List, Task, TaskRef

    from recordforge.runners import dask_tasks
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None


def _key_name(label: str) -> str:
    """A step label as a dask key prefix (no '-', which dask uses to split key names)."""
    return re.sub(r"[^0-9A-Za-z_.]+", "_", label).strip("_")[:80] or "step"


def _windowing(pcoll: pvalue.PCollection) -> Windowing:
    try:
        return pcoll.windowing
    except Exception:  # a placeholder primitive (_Read) has no windowing of its own: global
        return Windowing(GlobalWindows())


class _Translator(PipelineVisitor):
    """Maps every PCollection of a pipeline (after Beam's Dask overrides) to a dask Bag."""

    def __init__(self, *, partitions: int, partition_size: int | None, slots: Sequence[str] = ()) -> None:
        self.bags: dict[pvalue.PValue, db.Bag] = {}
        self._slots = tuple(slots)
        self._read: set[pvalue.PCollection] = set()
        self._sides: dict[pvalue.PCollection, Any] = {}
        self._partitions = partitions
        self._partition_size = partition_size
        self._library = pickler.desired_pickle_lib.__name__
        self._run = uuid.uuid4().hex

    def unread(self) -> list[db.Bag]:
        """The Bags of the PCollections no step reads: computing them computes the pipeline."""
        return [bag for pcoll, bag in self.bags.items() if pcoll not in self._read]

    def visit_transform(self, node: AppliedPTransform) -> None:
        transform = node.transform
        inputs = [p for p in node.inputs if isinstance(p, pvalue.PCollection)]
        self._read.update(inputs)
        self._read.update(si.pvalue for si in node.side_inputs)
        bags = [self.bags[p] for p in inputs]
        name = _key_name(node.full_label)
        if isinstance(transform, beam.ParDo):
            self._pardo(node, bags[0], name)
            return
        if isinstance(transform, Impulse):
            bag = db.from_sequence([GlobalWindows.windowed_value(b"")], npartitions=1)
        elif isinstance(transform, _overrides._Create):
            bag = self._create(transform.values)
        elif isinstance(transform, _overrides._Read):
            bag = self._source(node, name)
        elif isinstance(transform, _overrides._Flatten):
            bag = db.concat(bags) if bags else db.from_sequence([], npartitions=1)
        elif isinstance(transform, _overrides._Reshuffle):
            bag = self._shuffle(bags[0], name, dask_tasks.deal, ())
        elif isinstance(transform, _overrides._GroupByKeyOnly):
            key_type, _ = trivial_inference.key_value_types(inputs[0].element_type)
            coder = coders.registry.get_coder(key_type).as_deterministic_coder(node.full_label)
            bag = self._shuffle(
                bags[0], name, dask_tasks.by_key, (self._library, pickler.dumps(coder)), dask_tasks.group
            )
        else:
            raise NotImplementedError(
                f"RecordForge's DaskRunner cannot run step {node.full_label!r}: "
                f"{type(transform).__name__} is not a primitive it translates"
            )
        (output,) = node.outputs.values()
        self.bags[output] = bag

    def _create(self, values: Sequence[Any]) -> db.Bag:
        items = [dask_tasks.windowed(v) for v in values]
        if self._partition_size:
            return db.from_sequence(items, partition_size=self._partition_size)
        return db.from_sequence(items, npartitions=max(1, min(len(items), self._partitions)))

    def _source(self, node: AppliedPTransform, name: str) -> db.Bag:
        source = getattr(node.transform, "source", None)  # a Read's; anything else is refused below
        if not isinstance(source, iobase.BoundedSource):
            raise NotImplementedError(
                f"RecordForge's DaskRunner reads bounded sources only; step {node.full_label!r} "
                f"reads a {type(source).__name__}"
            )
        size = source.estimate_size() or 0
        bundles = [pickler.dumps(b) for b in source.split(max(size // self._partitions, 1 << 20))]
        bag = db.from_sequence(bundles, partition_size=1) if bundles else db.from_sequence([], npartitions=1)
        return bag.map_partitions(dask_tasks.read_bundles, self._library, token=name)

    def _shuffle(
        self, bag: db.Bag, name: str, split: Any, args: tuple, merge: Any = dask_tasks.gather
    ) -> db.Bag:
        """Partition i is split `n` ways by `split(elements, i, n, *args)`; output partition j
        merges the j-th pieces of every split, on the j-th worker thread of the cluster."""
        n = self._partitions
        token = dask.base.tokenize(bag.name, name, n)
        split_name, piece_name, out_name = f"{name}.split-{token}", f"{name}.piece-{token}", f"{name}-{token}"
        inputs = [(bag.name, i) for i in range(bag.npartitions)]
        splits = {
            (split_name, i): Task((split_name, i), split, TaskRef(key), i, n, *args)
            for i, key in enumerate(inputs)
        }
        # (input i, worker w) -> the pieces of split i for the output partitions placed on w: a
        # task of its own, run where the split ran, so that only those pieces travel to w, and
        # a shuffle makes a task per input partition and worker, not per input and output.
        groups = self._groups(n)
        pieces = {
            (piece_name, i, g): Task((piece_name, i, g), dask_tasks.take, TaskRef((split_name, i)), outputs)
            for i in range(len(inputs))
            for g, outputs in enumerate(groups)
        }
        merged = {
            (out_name, j): Task(
                (out_name, j),
                dask_tasks.merge_at,
                merge,
                outputs.index(j),
                List(*(TaskRef((piece_name, i, g)) for i in range(len(inputs)))),
            )
            for g, outputs in enumerate(groups)
            for j in outputs
        }
        layers = dict(bag.dask.layers)
        dependencies = dict(bag.dask.dependencies)
        layers[split_name] = MaterializedLayer(splits)
        dependencies[split_name] = set(bag.__dask_layers__())
        layers[piece_name] = MaterializedLayer(pieces)
        dependencies[piece_name] = {split_name}
        layers[out_name] = MaterializedLayer(merged, annotations=self._placement())
        dependencies[out_name] = {piece_name}
        return db.Bag(HighLevelGraph(layers, dependencies), out_name, n)

    def _groups(self, n: int) -> list[tuple[int, ...]]:
        """The output partitions of a shuffle, grouped by the worker `_placement` puts them on
        (each alone when the cluster's workers are not known)."""
        if not self._slots:
            return [(j,) for j in range(n)]
        workers = sorted(set(self._slots))
        return [
            tuple(j for j in range(n) if self._slots[j % len(self._slots)] == worker) for worker in workers
        ]

    def _placement(self) -> dict[str, Any] | None:
        """Where a shuffle's output partition j runs: on the j-th worker thread of the cluster as
        the run found it, or anywhere once that worker is gone. Without it, every output
        partition of a shuffle whose pieces all lie on one worker (a Reshuffle after a step of
        one partition: the work items a source plans) runs there, and so does all that follows
        them: the scheduler puts a task where its inputs are, and steals too late to matter."""
        if not self._slots:
            return None
        slots = self._slots
        return {"workers": lambda key: [slots[key[1] % len(slots)]], "allow_other_workers": True}

    def _side_input(self, pcoll: pvalue.PCollection) -> Any:
        """A side input's elements, gathered by one task that every reader depends on."""
        if pcoll not in self._sides:
            bag = self.bags[pcoll]
            producer = pcoll.producer
            assert producer is not None  # a side input is some step's output
            name = f"side.{_key_name(producer.full_label)}-{dask.base.tokenize(bag.name)}"
            self._sides[pcoll] = dask.delayed(dask_tasks.gather)(
                bag.to_delayed(optimize_graph=False), dask_key_name=name
            )
        return self._sides[pcoll]

    def _pardo(self, node: AppliedPTransform, bag: db.Bag, name: str) -> None:
        transform = node.transform
        assert isinstance(transform, ParDo)  # called for ParDo nodes only
        signature = DoFnSignature(transform.fn)
        if signature.is_splittable_dofn() or signature.is_stateful_dofn():
            raise NotImplementedError(
                f"RecordForge's DaskRunner cannot run step {node.full_label!r}: "
                "stateful and splittable DoFns are not supported"
            )
        tags = tuple(node.outputs)
        views = [(type(si), si._view_options()) for si in node.side_inputs]
        payload = pickler.dumps(
            (transform.fn, transform.args, transform.kwargs, _windowing(node.inputs[0]), views)
        )
        spec = dask_tasks.ParDoSpec(self._run, node.full_label, tags, self._library, payload)
        sides = [self._side_input(si.pvalue) for si in node.side_inputs]
        out = bag.map_partitions(dask_tasks.run_bundle, spec, *sides, token=name)
        if len(tags) == 1:
            self.bags[node.outputs[tags[0]]] = out
            return
        for tag, pcoll in node.outputs.items():
            self.bags[pcoll] = out.map_partitions(
                dask_tasks.select, tag, token=f"{name}.{_key_name(str(tag))}"
            )


def _slots(nthreads: dict[str, int]) -> list[str]:
    """Worker addresses, each once per thread, dealt round robin: [a, b, a, b, a] for a with 3
    threads and b with 2, so that consecutive partitions go to different workers."""
    queues = [[address] * n for address, n in sorted(nthreads.items())]
    return [q[k] for k in range(max((len(q) for q in queues), default=0)) for q in queues if k < len(q)]


# ---------------------------------------------------------------------------------------------
# The runner and its result.

if _IMPORT_ERROR is None:

    class DaskRunnerResult(_beam_dask.DaskRunnerResult):
        """Beam's result, closing the run's client when the run ends; on failure, first cancels
        the run and waits for its tasks still executing on workers."""

        def __init__(self, client: distributed.Client, futures: Sequence[Any], keys: frozenset[Any]) -> None:
            super().__init__(client, list(futures))
            self._keys = keys

        def wait_until_finish(self, duration: int | None = None) -> str:
            if PipelineState.is_terminal(self._state):
                return self._state
            try:
                timeout = None if duration is None else duration / 1000
                for _ in distributed.as_completed(
                    self.futures, loop=self.client.loop, timeout=timeout, with_results=True
                ):
                    pass  # results are counts; iterating raises a task's error here
            except TimeoutError:
                if duration is None:
                    self._fail()
                    raise
                return self._state  # still running
            except BaseException:
                self._fail()
                raise
            self._state = PipelineState.DONE
            self.client.close()
            return self._state

        def cancel(self) -> str:
            self._fail()
            self._state = PipelineState.CANCELLED
            return self._state

        def _fail(self) -> None:
            self._state = PipelineState.FAILED
            try:
                self.client.cancel(self.futures)
                deadline = time.monotonic() + STRAGGLER_WAIT_S
                while time.monotonic() < deadline:
                    running = self.client.run(dask_tasks.running, self._keys)
                    if not any(running.values()):
                        break
                    time.sleep(0.1)
                else:
                    _LOGGER.warning("the failed run's tasks still execute after %.0f s", STRAGGLER_WAIT_S)
            except Exception as exc:  # the original error matters more than this wait's
                _LOGGER.warning("could not wait for the failed Dask run's tasks: %s", exc)
            finally:
                self.client.close()

    class DaskRunner(_beam_dask.DaskRunner):
        """Beam's DaskRunner with RecordForge's corrections (docs/architecture.md)."""

        def __init__(self) -> None:
            _check_beam_version()
            super().__init__()

        @staticmethod
        def is_fnapi_compatible() -> bool:
            # Beam's answer (False) makes Pipeline.run rebuild the whole pipeline from its proto
            # before running it, as a test of the proto: every DoFn pickled, unpickled and
            # validated again, ~0.4 s of a 1M-row conversion's driver time. True
            # skips it, and adds the beam_fn_api experiment to the options, which nothing of a
            # Dask run reads (assumption 21).
            return True

        def run_pipeline(self, pipeline: Pipeline, options: PipelineOptions) -> DaskRunnerResult:
            dask_options = options.view_as(_beam_dask.DaskOptions).get_all_options(
                drop_default=True, current_only=True
            )
            bag_kwargs = _beam_dask.DaskOptions._extract_bag_kwargs(dask_options)
            pipeline.replace_all(_overrides.dask_overrides())
            client = distributed.Client(**dask_options, set_as_default=False)
            try:
                nthreads = client.nthreads()
                threads = sum(nthreads.values())
                _LOGGER.info("Dask cluster %s: %d worker threads", client.scheduler.address, threads)
                translator = _Translator(
                    partitions=bag_kwargs.get("npartitions") or max(2, 2 * threads),
                    partition_size=bag_kwargs.get("partition_size"),
                    slots=_slots(nthreads),
                )
                pipeline.visit(translator)
                counts = [bag.map_partitions(dask_tasks.count, token="unread") for bag in translator.unread()]
                keys = frozenset(k for c in counts for k in c.__dask_graph__().keys())
                futures = client.compute(counts, optimize_graph=False)
            except BaseException:
                client.close()
                raise
            return DaskRunnerResult(client, futures, keys)

else:  # pragma: no cover - exercised only without the extra

    class DaskRunner:  # type: ignore[no-redef]
        """Stands in for the runner when dask is not installed: construction says how to get it."""

        def __init__(self) -> None:
            raise RecordForgeError(
                f"--runner DaskRunner needs dask[distributed] ({_IMPORT_ERROR}): "
                "pip install 'recordforge[dask]'"
            )
