"""The benchmark table: 5 int64, 5 float64, 3 short strings, an int64 list (0..10), a float list
of 8, 2% nulls in every column; about 310 bytes per serialized example."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def make_table(num_rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = num_rows

    def mask() -> np.ndarray:
        return rng.random(n) < 0.02

    cols: dict[str, pa.Array] = {}
    for i in range(5):
        cols[f"i{i}"] = pa.array(rng.integers(-(10 ** (i * 3)), 10 ** (i * 3 + 1), n), mask=mask())
    for i in range(5):
        cols[f"f{i}"] = pa.array(rng.standard_normal(n) * 10**i, mask=mask())
    vocab = np.array([f"token_{k:04d}" for k in range(2000)], dtype=object)
    for i in range(3):
        cols[f"s{i}"] = pa.array(vocab[rng.integers(0, 2000, n)], pa.string(), mask=mask())
    lengths = rng.integers(0, 11, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ilist = pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(rng.integers(0, 10**6, offsets[-1])), mask=pa.array(mask())
    )
    cols["ilist"] = ilist
    foff = pa.array(np.arange(0, 8 * n + 1, 8, dtype=np.int32))
    cols["flist"] = pa.ListArray.from_arrays(
        foff, pa.array(rng.standard_normal(8 * n).astype(np.float32)), mask=pa.array(mask())
    )
    return pa.table(cols)


def ensure_table(path: str, num_rows: int) -> str:
    """Writes the table once per size; later runs reuse it."""
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        pq.write_table(make_table(num_rows), tmp, row_group_size=131072)
        os.replace(tmp, path)
    return path


def ensure_csv(parquet_path: str, csv_path: str) -> str:
    """The same table as CSV, list columns as JSON arrays in a cell (RecordForge's CSV form).

    The arrays are joined by Arrow, not `json.dumps` per row, so a 5M-row file is written in
    seconds; floats take Arrow's shortest text, which reads back to the same float32."""
    if os.path.exists(csv_path):
        return csv_path
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    table = pq.read_table(parquet_path)
    columns = {}
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_list(col.type):
            cells = pc.cast(col, pa.list_(pa.string()))
            columns[name] = pc.binary_join_element_wise("[", pc.binary_join(cells, ","), "]", "")
        else:
            columns[name] = col
    tmp = csv_path + ".tmp"
    pacsv.write_csv(pa.table(columns), tmp)
    os.replace(tmp, csv_path)
    return csv_path


if __name__ == "__main__":
    # `python -m bench.table parquet PATH ROWS` or `... csv PARQUET CSV`: run as a subprocess so
    # that the benchmark's parent process stays small (forked children inherit its peak RSS).
    import sys

    if sys.argv[1] == "parquet":
        ensure_table(sys.argv[2], int(sys.argv[3]))
    else:
        ensure_csv(sys.argv[2], sys.argv[3])
