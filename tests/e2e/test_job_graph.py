"""The Dataflow job graph, built offline: no step holds the whole dataset.

Dataflow runs a GroupByKey's groups on one worker each, so the graph may group only small things
(work items, joins, file names, counts) and, with --deterministic, records per shard; and the
bundle step reads one combine's output, not lists of per-row or per-batch facts."""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.convert import build
from recordforge.pipelines.resolve import resolve

GBK = "beam:transform:group_by_key:v1"
DATAFLOW = [
    "--runner=DataflowRunner",
    "--project=my-project",
    "--region=us-central1",
    "--temp_location=gs://bucket/tmp",
    "--dry_run=True",
]
# What each allowed GroupByKey groups: none of them all records.
SMALL = {
    "Read/Files/MaybeReshuffle/Reshuffle/ReshufflePerKey/GroupByKey": "file paths",
    "Read/Spread/ReshufflePerKey/GroupByKey": "work items (files, row-group ranges)",
    "WriteBundle/Gather/CombinePerKey/GroupByKey": "partial sums of the bundle's facts",
    "SpreadJoins/ReshufflePerKey/GroupByKey": "plans of short parts to join",
    "FileRows/GroupByKey": "one end row per batch, max per file (deterministic)",
    "WriteRejected/Write/Write/WriteImpl/GroupByKey": "names of written rejected-row files",
}


def _job(config: ConvertConfig) -> Any:
    p = beam.Pipeline(options=PipelineOptions(DATAFLOW))
    build(p, resolve(p.options, config, look_at_output=False))
    assert p.run().state == "DONE"
    return p.runner.proto_pipeline.components.transforms


@pytest.mark.parametrize(
    "flags",
    [
        {},
        {"max_rejected": 10},
        {"splits": "train=8,eval=2"},
        {"num_shards": 3},
        {"deterministic": True, "num_shards": 3},
        {"deterministic": True, "splits": "train=8,eval=2"},
    ],
    ids=["default", "dead-letters", "splits", "num-shards", "deterministic", "deterministic-splits"],
)
def test_no_step_groups_all_records_and_the_bundle_reads_a_combine(parquet_source: str, flags: dict) -> None:
    transforms = _job(ConvertConfig(sources=(parquet_source,), output="gs://bucket/out", **flags))
    groups = [t.unique_name for t in transforms.values() if t.spec.urn == GBK]
    for name in groups:
        if name.endswith("/GroupShards"):
            # Records grouped per shard, each shard one worker's: only for deterministic output
            # (--num_shards alone cuts the rolling writer's parts into that many shards).
            assert flags.get("deterministic"), name
            continue
        assert any(name.endswith(small) for small in SMALL), f"{name} may group all records"
    assert any(n.endswith("/GroupShards") for n in groups) == bool(flags.get("deterministic"))
    # The bundle step: its only input is the output of the combine that gathers every fact.
    (write,) = [t for t in transforms.values() if t.unique_name == "WriteBundle/Write"]
    (source,) = write.inputs.values()
    producers = [
        t.unique_name for t in transforms.values() if source in t.outputs.values() and not t.subtransforms
    ]
    assert producers == ["WriteBundle/Gather/InjectDefault"], producers
    steps = {t.unique_name for t in transforms.values()}
    assert "WriteBundle/Gather/CombinePerKey" in steps and "WriteBundle/Gather/CombinePerKey/Combine" in steps
