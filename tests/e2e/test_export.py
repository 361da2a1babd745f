"""recordforge export (issue 58): every type of the every-type tables round trips source -> convert ->
export to a table equal to the source after docs/export.md's type mapping, for TFRecord, ArrayRecord
and WebDataset bundles; splits; DEST never replaced without --overwrite, never a stranger's file
deleted; a damaged bundle refused in one line with nothing published."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from test_infer_and_ops import _every_type_table
from test_webdataset import _table as _declared_table

import recordforge
from recordforge.errors import CorruptFile, UsageError
from recordforge.pipelines.convert import run

FORMATS = [
    ("tfrecord", ["--compression", "gzip"]),
    ("array_record", []),
    ("webdataset", []),
]


def _mapped(t: pa.DataType, *, exact: bool = False, nulls: bool = False) -> pa.DataType:
    """docs/export.md's table, written out independently of the code: the type a source column of
    type `t` comes back as (`exact`: a float64 kept with `encode: bytes`; `nulls`: the column
    holds a null, so that a fixed shape comes back as a list)."""
    if pa.types.is_dictionary(t):
        return _mapped(t.value_type)
    if pa.types.is_integer(t):
        return pa.int64()
    if pa.types.is_floating(t):
        return pa.float64() if exact and pa.types.is_float64(t) else pa.float32()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit)
    if pa.types.is_decimal(t):
        return pa.decimal128(38, t.scale)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _mapped(f.type, exact=exact)) for f in t])
    if pa.types.is_fixed_size_list(t) and nulls:
        inner = t.value_type
        if pa.types.is_fixed_size_list(inner):
            inner = pa.list_(pa.field("element", _mapped(inner.value_type, exact=exact)))
        return pa.list_(pa.field("element", _mapped(inner, exact=exact)))
    if pa.types.is_fixed_size_list(t) and pa.types.is_fixed_size_list(t.value_type):
        return pa.fixed_shape_tensor(_mapped(t.value_type.value_type), [t.list_size, t.value_type.list_size])
    if pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("element", _mapped(t.value_type, exact=exact)), t.list_size)
    if pa.types.is_list(t):
        return pa.list_(pa.field("element", _mapped(t.value_type, exact=exact)))
    if t == pa.time32("s"):
        return pa.time32("ms")  # Parquet has no time of day in seconds
    return t  # bool, date32, time32/time64


def _cast(col: pa.Array, t: pa.DataType) -> pa.Array:
    if isinstance(t, pa.FixedShapeTensorType):  # a fixed-size list of fixed-size lists
        flat = pa.FixedSizeListArray.from_arrays(
            col.values.values, col.type.list_size * t.shape[1], mask=col.is_null()
        )
        return pa.ExtensionArray.from_storage(t, flat.cast(t.storage_type))
    return col.cast(t)


def _expected(source: pa.Table, exact: set[str]) -> pa.Table:
    columns = [c.combine_chunks() for c in source.columns]
    types = [
        _mapped(f.type, exact=f.name in exact, nulls=c.null_count > 0)
        for f, c in zip(source.schema, columns, strict=True)
    ]
    return pa.table([_cast(c, t) for c, t in zip(columns, types, strict=True)], names=source.column_names)


def _canon(col: pa.Array) -> pa.Array:
    """Floats as their bits (NaN equal to itself, -0.0 not to 0.0), at any depth."""
    assert col.offset == 0
    t = col.type
    mask = col.is_null() if col.null_count else None
    if isinstance(t, pa.BaseExtensionType):
        return _canon(col.storage)
    if pa.types.is_floating(t):
        return col.view({2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[t.bit_width // 8])
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays(
            [_canon(col.field(i)) for i in range(t.num_fields)], names=[f.name for f in t], mask=mask
        )
    if pa.types.is_fixed_size_list(t):
        return pa.FixedSizeListArray.from_arrays(_canon(col.values), t.list_size, mask=mask)
    if pa.types.is_list(t):
        return pa.ListArray.from_arrays(col.offsets, _canon(col.values), mask=mask)
    return col


def _same(got: pa.Table, want: pa.Table, key: str) -> None:
    got, want = got.sort_by(key), want.sort_by(key)
    diff = [(a, b) for a, b in zip(got.schema, want.schema, strict=True) if not a.equals(b)]
    assert got.schema.equals(want.schema), diff
    for name in want.column_names:
        a, b = got.column(name).combine_chunks(), want.column(name).combine_chunks()
        assert _canon(a).equals(_canon(b)), (name, a, b)
    assert got.num_rows == want.num_rows


@pytest.mark.parametrize("fmt,flags", FORMATS, ids=[f for f, _ in FORMATS])
def test_every_inferred_type_comes_back_equal_to_the_source(
    tmp_path: Path, fmt: str, flags: list[str]
) -> None:
    source = _every_type_table()
    pq.write_table(source, tmp_path / "all.parquet")
    schema = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordforge",
            "infer-schema",
            str(tmp_path / "all.parquet"),
            "--lossless_float64",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (tmp_path / "schema.yaml").write_text(schema)
    argv = ["--source", str(tmp_path / "all.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    run([*argv, "--output", str(tmp_path / "out"), "--output_format", fmt, "--num_shards", "2", *flags])
    manifest = recordforge.export(str(tmp_path / "out"), str(tmp_path / "table"))
    assert manifest["rows"] == source.num_rows
    assert sorted(p.name for p in (tmp_path / "table").iterdir()) == ["_export.json", "part-00000.parquet"]
    got = pq.read_table(tmp_path / "table")
    _same(got, _expected(pq.read_table(tmp_path / "all.parquet"), {"f64", "loc"}), "u64")


@pytest.mark.parametrize("fmt,flags", FORMATS, ids=[f for f, _ in FORMATS])
def test_every_declared_type_comes_back_equal_to_the_source(
    tmp_path: Path, fmt: str, flags: list[str]
) -> None:
    source, features = _declared_table()
    pq.write_table(source, tmp_path / "t.parquet", row_group_size=16)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"features": features}))
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    run([*argv, "--output", str(tmp_path / "out"), "--output_format", fmt, "--num_shards", "3", *flags])
    recordforge.export(str(tmp_path / "out"), str(tmp_path / "table"))
    got = pq.read_table(tmp_path / "table")
    # The source as written: pyarrow cannot read back its fixed-size lists with nulls.
    _same(got, _expected(source, {"exact", "wide"}), "id")


def _split_bundle(tmp_path: Path) -> tuple[Path, pa.Table]:
    source, features = _declared_table()
    pq.write_table(source, tmp_path / "t.parquet")
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"features": features}))
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "schema.yaml")]
    run([*argv, "--output", str(tmp_path / "out"), "--splits", "train=3,eval=1", "--num_shards", "2"])
    return tmp_path / "out", source


def test_a_split_alone_and_every_split_together(tmp_path: Path) -> None:
    out, source = _split_bundle(tmp_path)
    meta = recordforge.load_bundle(str(out))["metadata"]
    train = recordforge.export(str(out), str(tmp_path / "train"), split="train")
    evals = recordforge.export(str(out), str(tmp_path / "eval"), split="eval")
    assert (train["rows"], evals["rows"]) == tuple(
        meta["split_counts"][s]["records"] for s in ("train", "eval")
    )
    ids = [pq.read_table(tmp_path / name).column("id").to_pylist() for name in ("train", "eval")]
    assert sorted(ids[0] + ids[1]) == list(range(source.num_rows)) and not set(ids[0]) & set(ids[1])
    every = recordforge.export(str(out), str(tmp_path / "all"))
    assert sorted(pq.read_table(tmp_path / "all").column("id").to_pylist()) == list(range(source.num_rows))
    assert every["rows"] == source.num_rows
    with pytest.raises(Exception, match="no split 'test'"):
        recordforge.export(str(out), str(tmp_path / "test"), split="test")


def test_dest_is_replaced_only_with_overwrite_and_a_strangers_file_never(tmp_path: Path) -> None:
    out, source = _split_bundle(tmp_path)
    dest = tmp_path / "table"
    recordforge.export(str(out), str(dest), split="eval")
    before = {p.name: p.read_bytes() for p in dest.iterdir()}
    with pytest.raises(UsageError, match="exists: pass --overwrite"):
        recordforge.export(str(out), str(dest))
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before
    recordforge.export(str(out), str(dest), overwrite=True)
    assert pq.read_table(dest).num_rows == source.num_rows
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write"):
        recordforge.export(str(out), str(dest), split="eval", overwrite=True)
    assert (dest / "notes.txt").read_text() == "mine"
    assert pq.read_table(dest / "part-00000.parquet").num_rows == source.num_rows
    # Nothing is left beside DEST by a run, whether it published or was refused.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.corrupts
def test_a_damaged_bundle_is_refused_in_one_line_and_nothing_published(tmp_path: Path) -> None:
    out, _ = _split_bundle(tmp_path)
    meta = recordforge.load_bundle(str(out))["metadata"]
    shard = out / meta["shards"][1]["file"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptFile, match=shard.name):
        recordforge.export(str(out), str(tmp_path / "table"))
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "export", str(out), "--to", "parquet", str(tmp_path / "table")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1 and shard.name in proc.stderr, proc.stderr
    assert not (tmp_path / "table").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
