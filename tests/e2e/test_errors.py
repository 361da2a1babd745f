"""Bad input fails loudly, naming the file, the row and the column."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.testing.test_pipeline import TestPipeline

from recordforge.errors import RecordForgeError, SourceError
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.convert import DEFAULT_RUNNER, build, run
from recordforge.pipelines.resolve import resolve


def _convert(tmp_path: Any, source: str, features: list[dict], **kw: Any) -> None:
    schema = tmp_path / "schema.yaml"
    schema.write_text(yaml.safe_dump({"features": features}))
    config = ConvertConfig(
        sources=(source,), output=str(tmp_path / "out"), schema_path=str(schema), batch_size=4, **kw
    )
    p = TestPipeline(runner=DEFAULT_RUNNER)
    build(p, resolve(p.options, config, look_at_output=False))
    p.run().wait_until_finish()


CASES = [
    # (column values as a pyarrow array, feature, expected row (1-based), reason pattern)
    (
        pa.array([1, 2, 3, 4, 5, None, 7], pa.int64()),
        {"type": "int64", "nulls": "required"},
        6,
        "nulls: required",
    ),
    (pa.array([1, 2, 2**64 - 1], pa.uint64()), {"type": "int64"}, 3, "not in range"),
    (pa.array([1.0, 1e300, 2.0]), {"type": "float64", "narrow": True}, 2, "outside float32"),
    (pa.array([1.0, 2.5]), {"type": "int64"}, 2, "truncated"),
    (pa.array([b"ok", b"\xff"], pa.binary()), {"type": "string"}, 2, "UTF-8"),
    (pa.array([0, 1, 2]), {"type": "bool"}, 3, "0 or 1"),
    (pa.array([[1, 2], [1], [3, 4]]), {"type": "int64", "shape": [2]}, 2, "needs 2 values"),
    (pa.array([[1], [2, None]]), {"type": "int64", "shape": [-1]}, 2, "holds a null"),
    (
        pa.array([[[1, 2], [3, 4]], [[1, 2], [3]]]),
        {"type": "int64", "shape": [2, 2]},
        2,
        "inner lists of length 2",
    ),
]


@pytest.mark.parametrize(("values", "feature", "row", "reason"), CASES)
def test_parquet_bad_value_names_file_row_column(
    tmp_path: Any, values: pa.Array, feature: dict, row: int, reason: str
) -> None:
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"col": values}), path)
    with pytest.raises(Exception) as err:
        _convert(tmp_path, str(path), [{"name": "col", **feature}])
    text = str(err.value)
    assert f"{path}, row {row}, column 'col'" in text
    assert re.search(reason, text), text


def test_csv_bad_value_names_row_after_quoted_newlines(tmp_path: Any) -> None:
    path = tmp_path / "bad.csv"
    path.write_text('n,note\n1,"two\nlines"\n2,x\nabc,y\n4,z\n')
    with pytest.raises(Exception) as err:
        _convert(tmp_path, str(path), [{"name": "n", "type": "int64"}, {"name": "note", "type": "string"}])
    assert f"{path}, row 3, column 'n'" in str(err.value)
    assert "'abc'" in str(err.value)


def test_missing_column_is_named(tmp_path: Any) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), path)
    with pytest.raises(Exception, match=r"no column\(s\) 'y'"):
        _convert(tmp_path, str(path), [{"name": "y", "type": "int64"}])


def test_pattern_matching_nothing_fails_at_construction(tmp_path: Any) -> None:
    pattern = str(tmp_path / "nothing-*.parquet")
    config = ConvertConfig(sources=(pattern,), output=str(tmp_path / "out"))
    with pytest.raises(SourceError, match=re.escape(f"{pattern!r} matched no files")):
        pipeline = TestPipeline(runner=DEFAULT_RUNNER)
        build(pipeline, resolve(pipeline.options, config, look_at_output=False))


def test_multi_threading_is_refused(tmp_path: Any) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), path)
    with pytest.raises(RecordForgeError, match="multi_threading is refused"):
        run(["--source", str(path), "--output", str(tmp_path / "o"), "--direct_running_mode=multi_threading"])


def test_existing_output_needs_overwrite(tmp_path: Any) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"x": np.arange(3)}), path)
    out = str(tmp_path / "o")
    first = run(["--source", str(path), "--output", out])
    assert first["num_records"] == 3
    with pytest.raises(RecordForgeError, match="--overwrite"):
        run(["--source", str(path), "--output", out])
    assert run(["--source", str(path), "--output", out, "--overwrite"])["num_records"] == 3
