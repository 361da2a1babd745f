"""recordforge.transforms: the README's own-pipeline example, run as written, read back whole."""

from __future__ import annotations

import glob
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from conftest import example_to_dict

import recordforge.transforms as rt
from recordforge.records.tfrecord import iter_records
from recordforge.schemas import compile_schema, load_schema


def test_every_export_resolves_to_the_class_it_names() -> None:
    from recordforge.runners.traits import ANY_RUNNER, RunnerTraits

    assert rt.ANY_RUNNER is ANY_RUNNER and rt.RunnerTraits is RunnerTraits
    for name in set(rt.__all__) - {"ANY_RUNNER"}:
        assert getattr(rt, name).__name__ == name


def test_the_conversion_in_ones_own_pipeline(tmp_path: Path) -> None:
    pq.write_table(pa.table({"id": [1, 2, 3], "name": ["a", "b", ""]}), tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"features": [{"name": "id", "type": "int64"}, {"name": "name", "type": "string"}]})
    )
    # The README's example, with its paths in tmp_path.
    plan = compile_schema(load_schema(str(tmp_path / "s.yaml")))
    spec = rt.ShardSpec(rt.Sizing.COUNT, "gzip", count=2)
    with TestPipeline() as p:
        read = p | rt.ReadParquet([str(tmp_path / "*.parquet")], traits=rt.ANY_RUNNER)
        encoded = read["batches"] | rt.ToExamples(plan)
        shards = encoded.examples | rt.WriteTFRecords(str(tmp_path / "out"), spec, spill=False)
        assert_that(shards | beam.Map(lambda s: s.records) | beam.CombineGlobally(sum), equal_to([3]))
    files = sorted(glob.glob(str(tmp_path / "out" / "data-*")))
    assert [Path(f).name for f in files] == [f"data-0000{i}-of-00002.tfrecord.gz" for i in range(2)]
    records = [example_to_dict(r) for f in files for r in iter_records(f, "gzip")]
    assert sorted((r["id"][0], r["name"][0]) for r in records) == [(1, b"a"), (2, b"b"), (3, b"")]
