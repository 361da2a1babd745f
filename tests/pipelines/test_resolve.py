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
        run.version = "other"  # type: ignore[misc]
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
