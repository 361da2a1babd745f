"""analyze_transform's steps around tensorflow-transform: `_TftInputFn` carries each row's place in
its file (ToExamples' SOURCE_ROW, gaps where rows were rejected) past TFT, and `_EncodeFn` fails
the run on a transformed record over --max_record_bytes, naming that source file and row."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from recordforge.errors import DataError
from recordforge.schemas import compile_schema, schema_from_dict
from recordforge.transforms.analyze_transform import _ROW, _WHERE, _EncodeFn, _TftInputFn
from recordforge.transforms.examples import SOURCE_ROW

_PLAN = compile_schema(
    schema_from_dict(
        {
            "features": [
                {"name": "i", "type": "int64", "nulls": "required"},
                {"name": "s", "type": "string", "nulls": "required"},
            ]
        }
    )
)


def _tft_output(texts: list[str], rows: list[int], where: str = "train\0/data/a.parquet") -> pa.RecordBatch:
    """A batch as TransformDataset hands it on: every output a list column, plus the passthroughs."""
    n = len(texts)
    offsets = pa.array(np.arange(n + 1, dtype=np.int64))

    def lists(values: pa.Array) -> pa.Array:
        return pa.LargeListArray.from_arrays(offsets, values)

    return pa.RecordBatch.from_pydict(
        {
            "i": lists(pa.array(range(n), pa.int64())),
            "s": lists(pa.array([t.encode() for t in texts], pa.large_binary())),
            _WHERE: lists(pa.array([where.encode()] * n, pa.large_binary())),
            _ROW: lists(pa.array(rows, pa.int64())),
        }
    )


def _encode(fn: _EncodeFn, batch: pa.RecordBatch) -> list[tuple[object, list[bytes]]]:
    fn.setup()
    return [(key, records.to_pylist()) for key, records in fn.process((batch, {}))]


def test_records_within_the_limit_are_encoded_under_their_first_source_row() -> None:
    batch = _tft_output(["a", "bb", "ccc"], [10, 12, 13])
    for limit in (0, 1000):
        ((key, records),) = _encode(_EncodeFn(_PLAN, {}, limit), batch)
        assert key == ("train", "/data/a.parquet", 10) and len(records) == 3


def test_a_transformed_record_over_the_limit_fails_naming_its_source_file_and_row() -> None:
    batch = _tft_output(["a", "x" * 500, "ccc"], [10, 12, 13])  # row 12 (0-based): the 2nd record
    with pytest.raises(DataError) as caught:
        _encode(_EncodeFn(_PLAN, {}, 200), batch)
    error = caught.value
    assert (error.file, error.row, error.column) == ("/data/a.parquet", 13, "s")
    assert "[rule: record_size]" in str(error) and "over --max_record_bytes 200" in str(error)
    assert "\n" not in str(error)


def test_tft_input_carries_each_rows_place_in_its_file() -> None:
    raw = pa.schema([("i", pa.large_list(pa.int64())), ("s", pa.large_list(pa.large_binary()))])
    conformed = pa.RecordBatch.from_pydict(
        {
            "i": pa.array([0, 2, 3], pa.int64()),
            "s": pa.array([b"a", b"c", b"d"], pa.large_binary()),
            SOURCE_ROW: pa.array([100, 102, 103], pa.int64()),  # row 101 was rejected
        }
    )
    ((out,),) = [list(_TftInputFn(raw, []).process((("", "/f", 100), conformed)))]
    assert out.column(_ROW).values.to_pylist() == [100, 102, 103]
    # Without the column (a caller of its own), the rows follow the batch's first row.
    ((out,),) = [list(_TftInputFn(raw, []).process((("", "/f", 100), conformed.drop_columns([SOURCE_ROW]))))]
    assert out.column(_ROW).values.to_pylist() == [100, 101, 102]
