"""The resume key: equal for reruns of the same command, different when anything that decides the
output's bytes differs (the schema, the format, an output-changing flag, an append's base)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.flags import FLAGS
from recordforge.pipelines.inputs import Inputs
from recordforge.pipelines.resuming import plan_resume
from recordforge.schemas import compile_schema, load_schema
from recordforge.transforms.source_types import FileInfo

CONFIG = ConvertConfig(sources=("in/*.parquet",), output="out", schema_path="examples/taxi.yaml")
PLAN = compile_schema(load_schema("examples/taxi.yaml"))
FILES = [FileInfo("in/a.parquet", 100, 1.0)]

# Each output-changing flag with a value other than its default (each accepted by ConvertConfig).
CHANGED: dict[str, Any] = {
    "source_format": "csv",
    "output_format": "array_record",
    "record_index": True,
    "compression": "none",
    "compression_level": 3,
    "shard_size": "2MB",
    "records_per_shard": 150,
    "num_shards": 3,
    "batch_size": 64,
    "deterministic": True,
    "shuffle": True,
    "seed": 7,
    "max_rejected": 5,
    "max_rejected_fraction": 0.5,
    "max_record_bytes": 1000,
    "skip_unreadable_files": True,
    "splits": "train=3,eval=1",
    "split_key": "trip_id",
    "split_column": "payment_type",
    "split_salt": "pepper",
    "preprocessing_fn": "prep.py:fn",
    "analyze_split": "eval",
}
# What each needs beside it to be a valid configuration.
NEEDS: dict[str, dict[str, Any]] = {
    "output_format": {"compression": "none"},
    "record_index": {"compression": "none"},
    "seed": {"shuffle": True},
    "split_key": {"splits": "train=3,eval=1"},
    "split_column": {"splits": "train=3,eval=1"},
    "split_salt": {"splits": "train=3,eval=1"},
    "analyze_split": {"splits": "train=3,eval=1", "preprocessing_fn": "prep.py:fn"},
}


def _key(config: ConvertConfig = CONFIG, *, fmt: str = "parquet", schema: str = "examples/taxi.yaml",
         files: list[FileInfo] = FILES, base: str | None = None) -> str:  # fmt: skip
    plan = PLAN if schema == "examples/taxi.yaml" else compile_schema(load_schema(schema))
    inputs = Inputs(files=files, fmt=fmt, plan=plan, fingerprint="")
    return plan_resume(config, inputs, None, base=base, eligible=True).key


def test_every_output_changing_flag_has_a_changed_value() -> None:
    assert set(CHANGED) == {f.dest for f in FLAGS if f.changes_output}


@pytest.mark.parametrize("flag", sorted(CHANGED))
def test_an_output_changing_flag_changes_the_resume_key(flag: str) -> None:
    """Mutation this catches: the resume key ignoring the flags (in pipelines/resuming.py's
    `_resume_key`, delete the `"settings": config.settings(),` line); with it a rerun with
    --compression none kept a killed gzip run's parts. Put it back to pass."""
    needs = NEEDS.get(flag, {})
    before = dataclasses.replace(CONFIG, **needs)
    after = dataclasses.replace(CONFIG, **{**needs, flag: CHANGED[flag]})
    assert _key(before) != _key(after)


def test_another_schema_or_format_changes_the_resume_key(tmp_path: Any) -> None:
    """Mutation this catches: in `_resume_key`, delete the `"schema": inputs.plan.fingerprint,`
    line (or the `"format"` one); put it back to pass."""
    schema = tmp_path / "taxi.yaml"
    text = open("examples/taxi.yaml").read()
    schema.write_text(text.replace("name: passenger_count", "name: passengers", 1))
    assert _key(schema=str(schema)) != _key()
    assert _key(fmt="csv") != _key()
    assert _key(base="v-20260101T000000Z-00000001") != _key()


def test_the_same_command_keeps_its_resume_key() -> None:
    """A rerun's files may have grown (checked piece by piece, not by the key), and flags that
    decide nothing in the output (--overwrite, --resume, --if_changed) may differ."""
    same = dataclasses.replace(CONFIG, overwrite=True, if_changed=True, output="out/")
    assert _key(same, files=[FileInfo("in/a.parquet", 200, 2.0)]) == _key()
