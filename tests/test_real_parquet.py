"""Parquet as real writers write it (issue 40): nullable fixed-size lists with null rows. Values
are read back with tf.data and protobuf."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml
from conftest import tf_records

from recordforge.pipelines.convert import run


def test_a_nullable_fixed_size_list_with_null_rows_converts(tmp_path: Path) -> None:
    vectors = [[1.5, 2.0, 3.0], None, [4.0, -5.0, 6.25], None, [0.0, 0.0, 0.0]]
    matrices = [[[1, 2], [3, 4]], [[5, 6], [7, 8]], None, None, [[9, 10], [11, 12]]]
    table = pa.table(
        {
            "id": range(5),
            "v": pa.array(vectors, pa.list_(pa.float32(), 3)),
            "m": pa.array(matrices, pa.list_(pa.list_(pa.int64(), 2), 2)),
        }
    )
    source = tmp_path / "fsl.parquet"
    pq.write_table(table, source)  # what pyarrow 25 cannot read back as it wrote it
    meta = run(["--source", str(source), "--output", str(tmp_path / "out")])
    assert (meta["rows_written"], meta["rows_rejected"]) == (5, 0)
    schema = yaml.safe_load((tmp_path / "out" / "schema.yaml").read_text())
    shapes = {f["name"]: (f.get("shape"), f.get("nulls")) for f in schema["features"]}
    assert shapes["v"] == ([3], "absent") and shapes["m"] == ([2, 2], "absent")
    got = {r["id"][0]: r for r in tf_records(tmp_path / "out")}
    for i in range(5):
        assert got[i].get("v") == vectors[i], i  # a null row: the feature is absent
        flat = None if matrices[i] is None else [x for row in matrices[i] for x in row]
        assert got[i].get("m") == flat, i
