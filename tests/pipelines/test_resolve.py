"""pipelines/resolve.py: requests from a command line and from Python values, and the frozen Run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

from recordforge.errors import RecordForgeError, UsageError
from recordforge.pipelines import inputs as inputs_module
from recordforge.pipelines.resolve import DEFAULT_RUNNER, request_from_argv, request_from_kwargs, resolve
from recordforge.runners import workers as workers_module
from recordforge.sources import probe as source_probe


@pytest.fixture
def table(tmp_path: Path) -> str:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3], "s": ["a", "b", "c"]}), path)
    return str(path)


def test_a_command_line_and_python_values_make_the_same_config(table: str, tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    argv = ["--source", table, "--output", out, "--num_shards", "3", "--deterministic", "--splits", "a=1,b=2"]
    by_argv = request_from_argv(argv)
    by_kwargs = request_from_kwargs(
        table, out, None, {"num_shards": 3, "deterministic": True, "splits": "a=1,b=2"}
    )
    assert dataclasses.replace(by_argv.config, command=()) == dataclasses.replace(
        by_kwargs.config, command=()
    )
    for request in (by_argv, by_kwargs):
        assert request.options.view_as(StandardOptions).runner == DEFAULT_RUNNER


def test_python_values_are_checked_against_the_flag_table(table: str) -> None:
    request = request_from_kwargs(
        [table, table], "out", "s.yaml", {"max_rejected_fraction": 0, "format": "parquet"}
    )
    assert request.config.sources == (table, table) and request.config.schema_path == "s.yaml"
    assert request.config.max_rejected_fraction == 0.0 and isinstance(
        request.config.max_rejected_fraction, float
    )
    assert request.config.source_format == "parquet"
    for flags, message in [
        ({"num_shards": 2.5}, "num_shards=2.5: expected int"),
        ({"num_shards": True}, "num_shards=True: expected int"),
        ({"overwrite": "yes"}, "overwrite='yes': expected bool"),
        ({"format": "xlsx"}, "format='xlsx': expected one of"),
        ({"num_shard": 2}, "unknown option num_shard; did you mean num_shards"),
    ]:
        with pytest.raises(UsageError, match=message):
            request_from_kwargs(table, "out", None, flags)


def test_beam_options_by_name_reach_the_pipeline_options(table: str) -> None:
    options = request_from_kwargs(table, "out", None, {"direct_num_workers": 2}).options
    assert options.view_as(DirectOptions).direct_num_workers == 2
    with pytest.raises(UsageError, match="multi_threading is refused"):
        request_from_kwargs(table, "out", None, {"direct_running_mode": "multi_threading"})


@pytest.mark.parametrize("cores", [1, 2, 3, 16])
def test_a_local_run_uses_every_core_unless_told(
    table: str, cores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda _: set(range(cores)))

    def direct(flags: dict[str, object]) -> tuple[str, int]:
        options = request_from_kwargs(table, "out", None, flags).options.view_as(DirectOptions)
        return options.direct_running_mode, options.direct_num_workers

    # A worker per core (bench.workers: the default is the fastest explicit count).
    every = ("multi_processing", cores) if cores > 1 else ("in_memory", 1)
    assert direct({}) == every
    assert direct({"direct_num_workers": 0}) == every  # Beam's spelling of a worker per core
    assert direct({"direct_num_workers": 1}) == ("in_memory", 1)
    assert direct({"direct_num_workers": 3}) == ("multi_processing", 3)
    assert direct({"direct_running_mode": "in_memory"}) == ("in_memory", 1)
    assert direct({"direct_running_mode": "multi_processing", "direct_num_workers": 2}) == (
        "multi_processing",
        2,
    )
    argv = request_from_argv(["--source", table, "--output", "out"]).options.view_as(DirectOptions)
    assert (argv.direct_running_mode, argv.direct_num_workers) == every
    dask = request_from_kwargs(table, "out", None, {"runner": "DirectRunner"}).options
    assert dask.view_as(DirectOptions).direct_num_workers == 1  # a runner named: its own defaults


def test_a_small_conversion_keeps_one_worker_unless_workers_were_asked_for(
    table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers_module.os, "sched_getaffinity", lambda _: {0, 1, 2, 3})

    def workers(flags: list[str]) -> tuple[str, int]:
        request = request_from_argv(["--source", table, "--output", str(tmp_path / "out"), *flags])
        run = resolve(request.options, request.config, every_core=request.every_core)
        direct = run.options.view_as(DirectOptions)
        assert run.traits.workers == direct.direct_num_workers
        return direct.direct_running_mode, direct.direct_num_workers

    assert workers([]) == ("in_memory", 1)  # 3 rows: workers would cost more than they save
    assert workers(["--direct_num_workers", "4"]) == ("multi_processing", 4)
    monkeypatch.setattr(workers_module, "SMALL_ROWS", 3)
    assert workers([]) == ("multi_processing", 4)  # a worker per core
    # On 4 cores the bounds are 0.59x 2 cores' (workers save more): 3 rows < 10 x 0.59.
    monkeypatch.setattr(workers_module, "SMALL_ROWS", 10)
    assert workers([]) == ("in_memory", 1)
    csv = tmp_path / "t.csv"
    csv.write_text("x\n1\n")
    request = request_from_argv(["--source", str(csv), "--output", str(tmp_path / "csv")])
    asked = request.options.get_all_options()
    run = resolve(request.options, request.config, every_core=request.every_core)
    assert run.options.view_as(DirectOptions).direct_num_workers == 1  # by its size in bytes
    # The run holds options of its own: the request's are as the caller made them.
    assert request.options.get_all_options() == asked
    assert request.options.view_as(DirectOptions).direct_num_workers == 4
    monkeypatch.setattr(workers_module, "SMALL_BYTES", 2)
    request = request_from_argv(["--source", str(csv), "--output", str(tmp_path / "csv")])
    run = resolve(request.options, request.config, every_core=request.every_core)
    assert run.options.view_as(DirectOptions).direct_num_workers == 4


def test_each_parquet_footer_is_read_once_and_gives_the_row_total(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(3):
        pq.write_table(pa.table({"x": list(range(i + 1)), "s": ["a"] * (i + 1)}), tmp_path / f"{i}.parquet")
    opened: list[object] = []
    real = source_probe.pq.ParquetFile

    def counting(source: object, *args: object, **kwargs: object) -> object:
        opened.append(getattr(source, "name", source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(source_probe.pq, "ParquetFile", counting)
    request = request_from_argv(["--source", str(tmp_path / "*.parquet"), "--output", str(tmp_path / "out")])
    run = resolve(request.options, request.config)
    assert len(opened) == 3 and run.inputs.rows == 1 + 2 + 3
    nulls = {f.name: f.nulls.value for f in run.plan.schema.features}
    assert nulls == {"x": "required", "s": "required"}  # no null in any footer


def test_resolve_makes_one_frozen_run_and_fingerprints_the_inputs_once(
    table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    fingerprint = inputs_module.input_fingerprint
    monkeypatch.setattr(inputs_module, "input_fingerprint", lambda *a: calls.append(a) or fingerprint(*a))
    request = request_from_argv(["--source", table, "--output", str(tmp_path / "out"), "--if_changed"])
    run = resolve(request.options, request.config)
    assert len(calls) == 1 and run.inputs.fingerprint == fingerprint(*calls[0])
    assert run.root == f"{run.output}/{run.version}" and run.up_to_date is None
    assert run.compression == "gzip" and run.splits is None and not run.preprocessing
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.compression = "other"  # type: ignore[misc]
    assert not (tmp_path / "out").exists()  # resolving writes nothing


def test_every_check_fails_in_resolve_before_anything_is_written(table: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    request = request_from_argv(
        ["--source", table, "--output", str(out), "--splits", "a=1", "--split_key", "nope"]
    )
    with pytest.raises(RecordForgeError, match="--split_key 'nope' is not a feature"):
        resolve(request.options, request.config)
    assert not out.exists()
    # A schema where publishing would replace it (a top-level file of the bundle).
    out.mkdir()
    (out / "metadata.json").write_text('{"features": [{"name": "x", "type": "int64"}]}')
    inside = request_from_argv(
        ["--source", table, "--output", str(out), "--schema", str(out / "metadata.json")]
    )
    with pytest.raises(RecordForgeError, match="--schema .* is where RecordForge writes its bundle"):
        resolve(inside.options, inside.config, look_at_output=False)
    assert sorted(p.name for p in out.iterdir()) == ["metadata.json"]
