"""The bundle's count check: rows in = rows written + rows rejected, in metadata.json and in
Beam's counters, or nothing is published."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.metrics.metric import MetricsFilter

from demo.sampledata import taxi_table
from recordforge import add_conversion
from recordforge.pipelines.convert import run
from recordforge.records.encoding import ExampleEncoder


def test_a_run_that_loses_a_row_refuses_to_publish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pq.write_table(taxi_table(500), tmp_path / "t.parquet")
    encode = ExampleEncoder.encode
    lost = []

    def lose_one(self: ExampleEncoder, batch: pa.RecordBatch) -> pa.Array:
        out = encode(self, batch)
        # The pipeline's batches of 128, not the sample the run's estimate encodes first.
        if lost or batch.num_rows > 128:
            return out
        lost.append(out[-1].as_py())
        return out[:-1]  # a bug that drops a record without counting it as rejected

    monkeypatch.setattr(ExampleEncoder, "encode", lose_one)
    out = tmp_path / "out"
    with pytest.raises(Exception, match=r"read 500 rows but the shards hold 499 records and 0 were rejected"):
        # One worker, this process: the bug is patched into it.
        run(
            [
                "--source",
                str(tmp_path / "t.parquet"),
                "--output",
                str(out),
                "--batch_size",
                "128",
                "--direct_num_workers",
                "1",
            ]
        )
    assert lost, "the encoder was not called: the test proved nothing"
    assert not (out / "_SUCCESS").exists() and not (out / "metadata.json").exists()


def _counters(result: beam.runners.runner.PipelineResult) -> dict[str, int]:
    query = result.metrics().query(MetricsFilter().with_namespace("recordforge"))
    return {c.key.metric.name: c.committed for c in query["counters"]}


def test_beam_counters_agree_with_metadata(tmp_path: Path) -> None:
    table = taxi_table(400)
    # Three rows lack the trip id the schema requires: they are rejected, counted, and the rest written.
    ids = table.column("trip_id").to_pylist()
    for i in (3, 150, 399):
        ids[i] = None
    table = table.set_column(0, "trip_id", pa.array(ids, pa.int64()))
    pq.write_table(table, tmp_path / "t.parquet")
    schema = "examples/taxi.yaml"
    out = str(tmp_path / "out")
    p = beam.Pipeline()
    conversion = add_conversion(p, str(tmp_path / "t.parquet"), out, schema, max_rejected=10)
    with conversion.publishing():
        result = p.run()
        result.wait_until_finish()
    meta = json.loads((Path(out) / "metadata.json").read_text())
    counters = _counters(result)
    assert meta["rows_read"] == counters["rows_read"] == 400
    assert meta["rows_written"] == counters["rows_encoded"] == 397
    assert meta["rows_rejected"] == counters["rows_rejected"] == 3
    assert meta["rejected_by_rule"] == {"null": 3} and counters["rejected_null"] == 3
