"""Tensor columns (issue 58 part 3): Arrow fixed_shape_tensor and fixed-size lists of fixed-size lists
are features of their shape, inferred without a schema, FixedLenFeature([2, 3]) when never null,
read back by recordforge.read (tf.data) as [2, 3] tensors, exported back as tensor columns."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import recordforge
from recordforge.errors import SchemaError
from recordforge.pipelines.convert import run
from recordforge.schemas.infer import infer_schema

N = 7


def _table() -> tuple[pa.Table, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    emb = rng.normal(size=(N, 2, 3)).astype(np.float32)
    emb[0, 0, 0] = -0.0
    grid = rng.integers(-(2**62), 2**62, size=(N, 2, 3))
    table = pa.table(
        {
            "id": pa.array(range(N), pa.int64()),
            "emb": pa.FixedShapeTensorArray.from_numpy_ndarray(emb),
            "grid": pa.array(grid.tolist(), pa.list_(pa.list_(pa.int64(), 3), 2)),
        }
    )
    return table, emb, grid


def test_tensor_columns_are_inferred_as_features_of_their_shape() -> None:
    table, _, _ = _table()
    dense = infer_schema(
        table.schema, never_null=frozenset({"emb.list.element", "grid.list.element.list.element"})
    )
    by_name = {f.name: f for f in dense.features}
    assert by_name["emb"].shape == (2, 3) and by_name["emb"].dtype.value == "float32"
    assert by_name["grid"].shape == (2, 3) and by_name["grid"].dtype.value == "int64"
    assert {by_name[n].nulls.value for n in ("emb", "grid")} == {"required"}
    sparse = infer_schema(table.schema)  # no statistics: a tensor may be null
    assert {f.nulls.value for f in sparse.features if f.name != "id"} == {"absent"}
    permuted = pa.schema([("t", pa.fixed_shape_tensor(pa.float32(), [2, 3], permutation=[1, 0]))])
    with pytest.raises(SchemaError, match="cannot infer a feature for column"):
        infer_schema(permuted)


def test_tensors_read_back_by_tf_data_as_2x3_and_exported_back_as_tensor_columns(tmp_path: Path) -> None:
    table, emb, grid = _table()
    pq.write_table(table, tmp_path / "t.parquet")
    out = tmp_path / "out"
    meta = run(["--source", str(tmp_path / "t.parquet"), "--output", str(out), "--compression", "none"])
    assert meta["num_records"] == N
    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["emb"] == {"kind": "FixedLenFeature", "dtype": "float32", "shape": [2, 3]}
    assert spec["grid"] == {"kind": "FixedLenFeature", "dtype": "int64", "shape": [2, 3]}
    seen = set()
    for record in recordforge.read(str(out)):
        i = int(record["id"].numpy())
        seen.add(i)
        assert record["emb"].shape == (2, 3) and record["grid"].shape == (2, 3)
        assert record["emb"].numpy().tobytes() == emb[i].tobytes()  # -0.0 too
        assert (record["grid"].numpy() == grid[i]).all()
    assert seen == set(range(N))
    recordforge.export(str(out), str(tmp_path / "table"))
    got = pq.read_table(tmp_path / "table").sort_by("id")
    assert got.schema.field("emb").type == pa.fixed_shape_tensor(pa.float32(), [2, 3])
    assert got.schema.field("grid").type == pa.fixed_shape_tensor(pa.int64(), [2, 3])
    assert got.column("emb").combine_chunks().to_numpy_ndarray().tobytes() == emb.tobytes()
    assert (got.column("grid").combine_chunks().to_numpy_ndarray() == grid).all()
