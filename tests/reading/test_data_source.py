"""recordforge.data_source on damaged bundles: a record index over int64 or past the shard, and
a corrupt ArrayRecord chunk, each a CorruptFile naming the file and the record."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest

import recordforge
from recordforge.errors import CorruptFile, RecordForgeError
from recordforge.records import array_records
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.example_pb import Example

SPEC = {"x": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []}}


def _example(i: int) -> bytes:
    ex = Example()
    ex.features.feature["x"].int64_list.value.append(i)
    return ex.SerializeToString()


def _frame(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


def _bundle(out: Path, name: str, data: bytes, records: int, **shard: str) -> Path:
    if data:  # else the shard is written already
        (out / name).write_bytes(data)
    data = (out / name).read_bytes()
    entry = {"file": name, "records": records, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    meta = {"shards": [{**entry, **shard}], "num_records": records, "compression": "none"}
    if name.endswith(".array_record"):
        meta["format"] = "array_record"
    (out / "metadata.json").write_text(json.dumps(meta))
    (out / "feature_spec.json").write_text(json.dumps(SPEC))
    (out / "_SUCCESS").write_text("")
    return out


def _indexed(tmp_path: Path, second_line: str) -> recordforge.DataSource:
    framed = [_frame(_example(i)) for i in range(2)]
    name = "data-00000-of-00001.tfrecord"
    (tmp_path / f"{name}.tfindex").write_text(f"0 {len(framed[0])}\n{second_line}\n")
    _bundle(tmp_path, name, b"".join(framed), 2, index=f"{name}.tfindex")
    return recordforge.data_source(str(tmp_path))


@pytest.mark.corrupts
@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("30 99999999999999999999", "not a record index"),
        ("30 9000000000000000000", "line 2 says offset 30 size 9000000000000000000, not a record of"),
        ("9000000000000000000 30", "line 2 says offset 9000000000000000000 size 30"),
        ("-5 30", "line 2 says offset -5"),
    ],
)
def test_a_damaged_record_index_is_named(tmp_path: Path, line: str, said: str) -> None:
    """Before: OverflowError, or a MemoryError reading 9e18 bytes."""
    source = _indexed(tmp_path, line)
    index = tmp_path / "data-00000-of-00001.tfrecord.tfindex"
    with pytest.raises(CorruptFile, match=f"^{index}: ") as info:
        source[0]
    assert said in str(info.value)


@pytest.mark.corrupts
def test_a_good_index_still_reads(tmp_path: Path) -> None:
    source = _indexed(tmp_path, f"{len(_frame(_example(0)))} {len(_frame(_example(1)))}")
    assert [source[0], source[1]] == [_example(0), _example(1)]


@pytest.mark.corrupts
def test_a_corrupt_array_record_chunk_is_named(tmp_path: Path) -> None:
    """Before: RuntimeError "Corrupted Riegeli/records file", no file named."""
    name = "data-00000-of-00001.array_record"
    writer = array_records.open_writer(str(tmp_path / name), array_records.writer_options("none"))
    for i in range(10):
        writer.write(_example(1000 + i))
    writer.close()
    data = bytearray((tmp_path / name).read_bytes())
    data[bytes(data).index(_example(1004)) - 4] ^= 0xFF  # in record 4's chunk
    (tmp_path / name).write_bytes(bytes(data))
    source = recordforge.data_source(str(_bundle(tmp_path, name, b"", 10)))
    assert source[3] == _example(1003)
    with pytest.raises(
        CorruptFile, match=f"^{tmp_path / name}: record at index 4 cannot be read \\(Corrupted"
    ):
        source[4]
    with pytest.raises(CorruptFile, match=f"^{tmp_path / name}: records at index \\[3, 4\\] cannot be read"):
        source.__getitems__([3, 4])


def _parsed_with(tmp_path: Path, spec: dict, record: bytes) -> dict:
    name = "data-00000-of-00001.array_record"
    writer = array_records.open_writer(str(tmp_path / name), array_records.writer_options("none"))
    writer.write(record)
    writer.close()
    source = recordforge.data_source(str(_bundle(tmp_path, name, b"", 1)))
    source.feature_spec = spec
    return source.parse(source[0])


@pytest.mark.corrupts
def test_a_shape_the_record_does_not_fill_is_named(tmp_path: Path) -> None:
    """Found by the bundle_json fuzz target (a feature_spec.json whose shape was changed from
    [2] to [3]); before: ValueError "cannot reshape array of size 1 into shape (3,)"."""
    spec = {"x": {"kind": "FixedLenFeature", "dtype": "int64", "shape": [3]}}
    with pytest.raises(
        RecordForgeError, match=f"^{tmp_path}: feature 'x' has 1 values, its shape \\[3\\] holds 3"
    ):
        _parsed_with(tmp_path, spec, _example(7))
    (tmp_path / "ok").mkdir()
    assert _parsed_with(tmp_path / "ok", {"x": {**spec["x"], "shape": [1]}}, _example(7))["x"] == [7]


@pytest.mark.corrupts
def test_a_feature_of_another_type_than_the_spec_is_named(tmp_path: Path) -> None:
    """A bytes feature where the spec says int64 (as a damaged dtype makes it); before:
    ValueError "invalid literal for int() with base 10: b'a'"."""
    ex = Example()
    ex.features.feature["x"].bytes_list.value.append(b"a")
    spec = {"x": {"kind": "VarLenFeature", "dtype": "int64"}}
    with pytest.raises(
        RecordForgeError, match=f"^{tmp_path}: feature 'x' is a bytes_list, the spec says int64"
    ):
        _parsed_with(tmp_path, spec, ex.SerializeToString())
