"""The flag table (pipelines/flags.py) is the one declaration every flag use derives from."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.flags import FLAGS, readme_table
from recordforge.pipelines.options import ConvertOptions
from recordforge.pipelines.template import template_metadata

ROOT = Path(__file__).resolve().parents[2]
# ConvertConfig fields that no flag fills: set by run() or from the command line itself.
_NOT_FLAGS = {"command", "version"}
_BASE: dict[str, Any] = {"sources": ("in.parquet",), "output": "out"}

# For every flag: another valid value, with what it needs beside it. A new flag fails
# test_every_flag_has_a_fingerprint_case until it is listed here.
_OTHER: dict[str, dict[str, Any]] = {
    "sources": {"sources": ("other.parquet",)},
    "output": {"output": "elsewhere"},
    "schema_path": {"schema_path": "schema.yaml"},
    "source_format": {"source_format": "csv"},
    "compression": {"compression": "zlib"},
    "output_format": {"output_format": "array_record"},
    "record_index": {"record_index": True},
    "compression_level": {"compression_level": 3},
    "shard_size": {"shard_size": "64MB"},
    "records_per_shard": {"records_per_shard": 10},
    "num_shards": {"num_shards": 4},
    "batch_size": {"batch_size": 100},
    "profile": {"profile": "/tmp/trace.json"},
    "deterministic": {"deterministic": True},
    "shuffle": {"shuffle": True},
    "seed": {"shuffle": True, "seed": 7},
    "max_rejected": {"max_rejected": 5},
    "max_rejected_fraction": {"max_rejected_fraction": 0.5},
    "max_record_bytes": {"max_record_bytes": 1000},
    "delta_version": {"source_format": "delta", "delta_version": 3},
    "skip_unreadable_files": {"skip_unreadable_files": True},
    "splits": {"splits": "train=1,test=1"},
    "split_key": {"splits": "train=1,test=1", "split_key": "id"},
    "split_column": {"splits": "train=1,test=1", "split_column": "part"},
    "split_salt": {"split_salt": "pepper"},
    "preprocessing_fn": {"preprocessing_fn": "prep.py:fn"},
    "analyze_split": {"splits": "train=1,test=1", "analyze_split": "test"},
    "span": {"span": "latest"},
    "if_changed": {"if_changed": True},
    "overwrite": {"overwrite": True},
    "append": {"append": True},
    "resume": {"resume": False},
}
# A flag's value is compared against the same configuration without that flag: for `seed` that
# is `--shuffle` alone, for `split_key` the splits alone.
_BESIDE = {"seed": {"shuffle": True}, "split_key": {"splits": "train=1,test=1"}}
_BESIDE.update({"analyze_split": {"splits": "train=1,test=1"}, "split_column": {"splits": "train=1,test=1"}})
_BESIDE["delta_version"] = {"source_format": "delta"}


def test_every_config_field_is_one_flag() -> None:
    fields = {f.name for f in dataclasses.fields(ConvertConfig)} - _NOT_FLAGS
    dests = [f.dest for f in FLAGS]
    assert len(dests) == len(set(dests)), "two flags fill one field"
    assert set(dests) == fields
    assert len({f.name for f in FLAGS}) == len(FLAGS)


def test_config_defaults_are_the_flags_defaults() -> None:
    config = ConvertConfig(**_BASE)
    for f in FLAGS:
        if not f.required:
            assert getattr(config, f.dest) == f.default, f.name
    parsed = ConvertConfig.from_options(
        PipelineOptions(["--source", "in.parquet", "--output", "out"]).view_as(ConvertOptions)
    )
    assert parsed == config


def _argv(values: dict[str, Any]) -> list[str]:
    argv = []
    for f in FLAGS:
        if f.dest not in values:
            continue
        value = values[f.dest]
        for one in value if f.repeated else [value]:
            argv.append(f"--{f.name}={str(one).lower() if isinstance(one, bool) else one}")
    return argv


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_from_options_reads_every_flag(flag: Any) -> None:
    values = {**_BASE, **_OTHER[flag.dest]}
    parsed = ConvertConfig.from_options(PipelineOptions(_argv(values)).view_as(ConvertOptions))
    assert parsed == ConvertConfig(**values)


def test_every_flag_has_a_fingerprint_case() -> None:
    assert set(_OTHER) == {f.dest for f in FLAGS}


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_settings_change_exactly_with_output_changing_flags(flag: Any) -> None:
    """settings() feeds --if_changed: a flag that changes the bytes must change it, one that
    does not (or whose input is fingerprinted apart, like --source) must not."""
    before = ConvertConfig(**{**_BASE, **_BESIDE.get(flag.dest, {})})
    after = ConvertConfig(**{**_BASE, **_OTHER[flag.dest]})
    assert getattr(before, flag.dest) != getattr(after, flag.dest)
    assert (before.settings() != after.settings()) == flag.changes_output


def test_readme_flag_table_is_generated() -> None:
    readme = (ROOT / "README.md").read_text().splitlines()
    start = readme.index("| flag | meaning |")
    end = start
    while end < len(readme) and readme[end].startswith("|"):
        end += 1
    assert "\n".join(readme[start:end]) + "\n" == readme_table(), (
        "README's flag table is stale: paste `python -m recordforge.pipelines.flags` over it"
    )


def test_template_parameters_are_the_flags() -> None:
    params = template_metadata()["parameters"]
    assert [p["name"] for p in params] == [f.name for f in FLAGS]
    assert {p["name"] for p in params if not p["isOptional"]} == {"source", "output"}


def test_convert_help_lists_every_flag_with_its_help() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    for f in FLAGS:
        assert f"--{f.name}" in text
        assert " ".join(f.help.split())[:60] in text, f.name
