"""recordforge export writes rows in the bundle's order (shard after shard, record after record)
whichever way its parts are written: by a thread while the shards are scanned (every column's type
known from the schema) or by processes after the scan (a fixed shape: its type depends on the
records), from one shard's chunks shared by the processes or from a shard per process, over many
chunks, parts and row groups; a damaged shard stops the streamed writing with nothing published."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import recordforge
from recordforge.errors import CorruptFile
from recordforge.exporting import parquet
from recordforge.pipelines.convert import run
from recordforge.records.array_records import reading
from recordforge.records.example_pb import parse_example
from recordforge.records.tfrecord import iter_records
from recordforge.tools import scan

ROWS = 3000


def _bundle(tmp_path: Path, shards: int, fixed: bool) -> tuple[Path, pa.Table]:
    source = pa.table(
        {
            "id": pa.array(range(ROWS), pa.int64()),
            "name": pa.array([None if i % 7 == 0 else f"n{i}" for i in range(ROWS)]),
            "vals": pa.array(
                [None if i % 5 == 0 else list(range(i % 4)) for i in range(ROWS)], pa.list_(pa.int64())
            ),
        }
    )
    features: list[dict[str, Any]] = [
        {"name": "id", "type": "int64", "shape": []},
        {"name": "name", "type": "string", "shape": [], "nulls": "absent"},
        {"name": "vals", "type": "int64", "shape": [-1], "nulls": "absent"},
    ]
    if fixed:
        pairs = [None if i % 3 == 0 else [i / 2, -i / 4] for i in range(ROWS)]
        source = source.append_column("pair", pa.array(pairs, pa.list_(pa.float32(), 2)))
        features.append({"name": "pair", "type": "float32", "shape": [2], "nulls": "absent"})
    pq.write_table(source, tmp_path / "t.parquet", row_group_size=500)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"features": features}))
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    run([*argv, "--output", str(tmp_path / "out"), "--num_shards", str(shards), "--compression", "gzip"])
    return tmp_path / "out", source


def _bundle_ids(out: Path) -> list[int]:
    """The `id` of every record, read shard after shard with protobuf."""
    bundle = recordforge.load_bundle(str(out))
    return [
        parse_example(raw)["id"][1][0]
        for path in bundle["files"]
        for raw in iter_records(path, reading(bundle["metadata"]))
    ]


def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few dozen records, parts and row groups of a few chunks (in forked workers,
    which see these settings, even where this process has loaded ArrayRecord: scan.py)."""
    monkeypatch.setattr(scan, "start_method", lambda: "fork")
    monkeypatch.setattr(scan, "CHUNK_BYTES", 2048)
    monkeypatch.setattr(parquet, "_PART_BYTES", 40_000)
    monkeypatch.setattr(parquet, "_MIN_PART_BYTES", 10_000)
    monkeypatch.setattr(parquet, "_ROW_GROUP_BYTES", 12_000)


def _not_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the other way of writing the parts was taken")


@pytest.mark.parametrize("shards", [1, 3], ids=["chunks_shared", "shard_per_process"])
@pytest.mark.parametrize("fixed", [False, True], ids=["streamed", "after_the_scan"])
def test_rows_come_in_bundle_order_over_chunks_shards_parts_and_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shards: int, fixed: bool
) -> None:
    out, source = _bundle(tmp_path, shards, fixed)
    ids = _bundle_ids(out)
    assert sorted(ids) == list(range(ROWS))
    _small(monkeypatch)
    monkeypatch.setattr(parquet, "_Streamer" if fixed else "_write_parts", _not_called)
    manifest = parquet.export(str(out), str(tmp_path / "table"), workers=2)
    parts = [tmp_path / "table" / p["file"] for p in manifest["files"]]
    assert len(parts) > 2 and any(pq.ParquetFile(p).num_row_groups > 1 for p in parts)
    assert [pq.ParquetFile(p).metadata.num_rows for p in parts] == [p["rows"] for p in manifest["files"]]
    got = pa.concat_tables([pq.read_table(p) for p in parts])
    assert manifest["rows"] == got.num_rows == ROWS
    assert got.column("id").to_pylist() == ids
    want = source.take(pa.array(ids))
    for name in source.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.corrupts
def test_a_damaged_shard_stops_the_streamed_parts_and_nothing_is_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, _ = _bundle(tmp_path, 3, fixed=False)
    _small(monkeypatch)
    monkeypatch.setattr(parquet, "_write_parts", _not_called)
    shard = out / recordforge.load_bundle(str(out))["metadata"]["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptFile, match=shard.name):
        parquet.export(str(out), str(tmp_path / "table"), workers=2)
    assert not (tmp_path / "table").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert not [t for t in threading.enumerate() if t.name == "export-parts"]  # stopped, not waiting
