"""CSV files as real writers write them (issue 40): zoned timestamps. Values are read back with
tf.data and protobuf, not RecordForge's reader."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from conftest import example_to_dict

from recordforge.pipelines.convert import run

_UTC = dt.timezone.utc
_NS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}


def records(output: Path) -> list[dict[str, list[Any]]]:
    """Every record of an output, read with tf.data and parsed with protobuf."""
    import tensorflow as tf

    meta = json.loads((output / "metadata.json").read_text())
    files = [str(output / s["file"]) for s in meta["shards"]]
    if not files:
        return []
    ds = tf.data.TFRecordDataset(files, compression_type=meta["tf_compression_type"])
    return [example_to_dict(raw.numpy()) for raw in ds]


def logical_units(output: Path) -> dict[str, str]:
    """The unit of each timestamp feature, from the bundle's feature_spec.json."""
    spec = json.loads((output / "feature_spec.json").read_text())
    return {
        k: v["logical"][len("timestamp[") : -1]
        for k, v in spec.items()
        if "timestamp[" in v.get("logical", "")
    }


def convert(source: Path, output: Path, *extra: str) -> dict[str, Any]:
    return run(["--source", str(source), "--output", str(output), *extra])


def _instants() -> list[dt.datetime | None]:
    base = dt.datetime(2013, 1, 1, 10, 0, 0, tzinfo=_UTC)
    return [base + dt.timedelta(hours=7 * i, seconds=i) for i in range(6)] + [None]


def _epoch_ns(values: list[dt.datetime | None]) -> list[int | None]:
    epoch = dt.datetime(1970, 1, 1, tzinfo=_UTC)
    return [None if v is None else (v - epoch) // dt.timedelta(microseconds=1) * 1000 for v in values]


def _written_ns(output: Path, column: str = "t") -> list[int | None]:
    """The timestamps written, by row id, in nanoseconds since the epoch (UTC)."""
    scale = _NS[logical_units(output)[column]]
    by_id = {r["id"][0]: r.get(column) for r in records(output)}
    return [by_id[i][0] * scale if by_id[i] else None for i in sorted(by_id)]


def _zoned_csvs(folder: Path) -> dict[str, Path]:
    """The same instants as pandas, pyarrow's CSV writer and hand-written ISO 8601 (`Z`, and a
    +02:00 offset) write them."""
    when = _instants()
    ids = list(range(len(when)))
    out = {}
    frame = pd.DataFrame({"id": ids, "t": pd.to_datetime([w for w in when], utc=True)})
    out["pandas"] = folder / "pandas.csv"
    frame.to_csv(out["pandas"], index=False)  # 2013-01-01 10:00:00+00:00
    for unit in ("s", "us"):
        table = pa.table({"id": ids, "t": pa.array(when, pa.timestamp(unit, tz="UTC"))})
        out[f"pyarrow_{unit}"] = folder / f"pyarrow_{unit}.csv"
        pacsv.write_csv(table, out[f"pyarrow_{unit}"])  # 2013-01-01 10:00:00Z, ...00.000000Z
    lines = ["id,t"]
    for i, w in enumerate(when):
        if w is None:
            lines.append(f"{i},")
        elif i % 2:
            lines.append(f"{i},{w.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()}")
        else:
            lines.append(f"{i},{w.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    out["iso"] = folder / "iso.csv"
    out["iso"].write_text("\n".join(lines) + "\n")
    return out


def test_zoned_timestamps_convert_to_utc_as_parquet_does(tmp_path: Path) -> None:
    csvs = _zoned_csvs(tmp_path)
    assert "+02:00" in csvs["iso"].read_text() and "Z" in csvs["pyarrow_us"].read_text()
    expected = _epoch_ns(_instants())
    parquet = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": range(7), "t": pa.array(_instants(), pa.timestamp("s", tz="UTC"))}), parquet
    )
    convert(parquet, tmp_path / "out_parquet")
    assert _written_ns(tmp_path / "out_parquet") == expected
    for name, path in csvs.items():
        meta = convert(path, tmp_path / f"out_{name}")
        assert (meta["rows_written"], meta["rows_rejected"]) == (7, 0), name
        assert _written_ns(tmp_path / f"out_{name}") == expected, name
