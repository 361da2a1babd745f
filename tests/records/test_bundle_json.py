"""A bundle's metadata.json and feature_spec.json as a stranger may hand them over: each damage
the bundle_json fuzz target found (fuzz/bundle_json.py; the error a reading tool raised before
is named in each case) is a CorruptFile naming the file, raised where the file is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from recordforge.errors import CorruptFile
from recordforge.records.bundle_json import load_feature_spec, load_metadata

SHARD = {"file": "data-00000-of-00001.tfrecord", "records": 2, "bytes": 60, "sha256": "0" * 64}
META = {"shards": [SHARD], "num_records": 2, "compression": "none", "version": ""}
SPEC = {
    "x": {"kind": "FixedLenFeature", "dtype": "int64", "shape": [2], "default_value": [0, 1]},
    "s": {"kind": "VarLenFeature", "dtype": "string"},
    "r": {
        "kind": "RaggedFeature",
        "dtype": "float32",
        "value_key": "r",
        "partitions": [{"row_lengths": "n"}],
    },
}
SEQUENCE_SPEC = {
    "context": {"x": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []}},
    "sequence": {
        "f": {"kind": "FixedLenSequenceFeature", "dtype": "float32", "shape": [3]},
        "t": {"kind": "RaggedFeature", "dtype": "string"},
    },
}


def _file(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return str(path)


def _refused(load: Any, path: str, said: str, **kw: Any) -> None:
    with pytest.raises(CorruptFile, match=f"^{path}: ") as info:
        load(path, **kw)
    assert said in str(info.value)


def test_sound_files_load_as_they_are(tmp_path: Path) -> None:
    assert load_metadata(_file(tmp_path, "metadata.json", META)) == META
    assert load_feature_spec(_file(tmp_path, "feature_spec.json", SPEC)) == SPEC
    spec = _file(tmp_path, "sequence.json", SEQUENCE_SPEC)
    assert load_feature_spec(spec, sequence=True) == SEQUENCE_SPEC


def test_metadata_not_utf8(tmp_path: Path) -> None:
    """Before: UnicodeDecodeError from stats and record_files."""
    path = _file(tmp_path, "metadata.json", b'{"shards": "\xf1\x80"}')
    _refused(load_metadata, path, "not UTF-8 (byte 12 of 16)")


def test_metadata_not_json(tmp_path: Path) -> None:
    """Before: JSONDecodeError from stats, inspect, verify's callers, load_bundle."""
    path = _file(tmp_path, "metadata.json", json.dumps(META).encode()[:-5])
    _refused(load_metadata, path, "not valid JSON (")


def test_json_nested_deep(tmp_path: Path) -> None:
    """Before: RecursionError from stats (100,000 brackets); json.loads takes 900 deep, which
    the readers and json.dumps then recurse through: refused past 64."""
    deep = _file(tmp_path, "feature_spec.json", b"[" * 100_000 + b"]" * 100_000)
    _refused(load_feature_spec, deep, "nested more than 64 deep")
    nested: Any = 1
    for _ in range(100):
        nested = [nested]
    path = _file(tmp_path, "metadata.json", {**META, "sources": nested})
    _refused(load_metadata, path, "nested more than 64 deep")


@pytest.mark.parametrize("text", [b'{"num_records": NaN}', b'{"num_records": 1e999}', b'{"x": "\\udcff"}'])
def test_json_python_takes_but_no_reader_can_use(tmp_path: Path, text: bytes) -> None:
    """NaN (Python's json takes it), a number that parses as inf, a lone surrogate (which no
    path, print or UTF-8 write takes)."""
    path = _file(tmp_path, "metadata.json", text)
    with pytest.raises(CorruptFile, match=f"^{path}: "):
        load_metadata(path)


# (metadata.json, what the message says, what a reading tool raised before)
DAMAGED_METADATA = [
    ([META], "is a list, not a JSON object", "AttributeError: 'list' object has no attribute 'get' (verify)"),
    ({**META, "shards": None}, "'shards' is null", "TypeError (record_files, stats)"),
    ({k: v for k, v in META.items() if k != "shards"}, "has no 'shards' list", "KeyError 'shards'"),
    ({**META, "shards": ["x"]}, "shard 0 is a string, not an object", "TypeError (verify)"),
    ({**META, "shards": [{**SHARD, "file": None}]}, "'file' is null, not a path", "AttributeError (verify)"),
    (
        {**META, "shards": [{**SHARD, "bytes": "60"}]},
        "'bytes' is a string, not a count",
        "ValueError (verify)",
    ),
    ({**META, "shards": [{**SHARD, "records": -1}]}, "'records' is -1, not a count", "wrong length"),
    ({**META, "shards": [{**SHARD, "records": 2**64}]}, "not a count from 0 to 2**63-1", "OverflowError"),
    ({**META, "shards": [{**SHARD, "records": True}]}, "'records' is a boolean", "counted as 1"),
    ({**META, "rows_read": None}, "'rows_read' is null, not a count", "TypeError (verify)"),
    ({**META, "num_records": {"": {}}}, "'num_records' is an object", "TypeError (inspect)"),
    ({k: v for k, v in META.items() if k != "compression"}, "has no 'compression'", "KeyError (reading)"),
    ({**META, "compression": "zstd"}, "'compression' is 'zstd', not one of", "ValueError (read_records)"),
    ({**META, "format": "array_record", "compression": "gzip"}, "(format array_record)", "read as TFRecord"),
    ({**META, "split_counts": 3}, "'split_counts' is an integer, not an object", "TypeError (load_bundle)"),
    ({**META, "previous_version": ["x"]}, "'previous_version' is a list", "TypeError unhashable (verify)"),
]


@pytest.mark.parametrize(("meta", "said", "before"), DAMAGED_METADATA, ids=[c[1] for c in DAMAGED_METADATA])
def test_metadata_of_the_wrong_shape(tmp_path: Path, meta: Any, said: str, before: str) -> None:
    _refused(load_metadata, _file(tmp_path, "metadata.json", meta), said)


@pytest.mark.parametrize(
    "shard",
    [
        {**SHARD, "file": "../outside/data-00000-of-00001.tfrecord"},
        {**SHARD, "file": "/tmp/outside/data-00000-of-00001.tfrecord"},
        {**SHARD, "file": "gs://bucket/data-00000-of-00001.tfrecord"},
        {**SHARD, "index": "a/../../outside/data.tfindex"},
    ],
    ids=["climbs", "absolute", "scheme", "index climbs"],
)
def test_a_shard_path_outside_the_bundle(tmp_path: Path, shard: dict[str, Any]) -> None:
    """Before: inspect read a shard, verify a record index, beside the bundle's folder."""
    path = _file(tmp_path, "metadata.json", {**META, "shards": [shard]})
    _refused(load_metadata, path, "shard path escapes the bundle's folder")


@pytest.mark.parametrize("file", ["", ".", "a//b", "./a", "a\\b", "a\x00b"])
def test_a_shard_path_that_is_not_a_plain_relative_path(tmp_path: Path, file: str) -> None:
    path = _file(tmp_path, "metadata.json", {**META, "shards": [{**SHARD, "file": file}]})
    _refused(load_metadata, path, "is not a plain relative path")


@pytest.mark.parametrize("version", ["..", "a/b", "/tmp", 7])
def test_a_version_that_is_not_a_folder_of_the_bundle(tmp_path: Path, version: Any) -> None:
    """Before: load_bundle read `bundle/../feature_spec.json`; data_source's cache folder is
    named after the version too."""
    path = _file(tmp_path, "metadata.json", {**META, "version": version})
    _refused(load_metadata, path, "'version' ")


def _entry(**changed: Any) -> dict[str, Any]:
    return {"x": {**SPEC["x"], **changed}}


# (feature_spec.json, what the message says, what a reading tool raised before)
DAMAGED_SPECS = [
    ([SPEC], "is a list, not a JSON object", "AttributeError 'list' has no 'get' (stats)"),
    ({"x": 3}, "feature 'x' is an integer, not an object", "TypeError 'int' is not iterable (inspect)"),
    ({"x": {"dtype": "int64"}}, "feature 'x' has no 'kind'", "KeyError 'kind' (inspect)"),
    (_entry(dtype={"a": 1}), "'dtype' is {'a': 1}, not one of", "TypeError unhashable (data_source)"),
    (_entry(kind="SparseFeature"), "'kind' is 'SparseFeature'", "skipped, or parsed as VarLen"),
    (_entry(shape=None), "'shape' is null, not a list of integers", "TypeError (data_source)"),
    (_entry(shape=[-2]), "'shape' is [-2], not a shape", "ValueError reshape"),
    (_entry(shape=[2**40, 2**40]), "is [1099511627776, 1099511627776], not a shape", "overflow"),
    (_entry(default_value=[1, 2, 3]), "holds 3 values, its shape [2] holds 2", "ValueError reshape"),
    (_entry(default_value=["a", "b"]), "holds values that are not int64", "ValueError (data_source)"),
    (_entry(default_value={"a": 1}), "is not a value or a list of values", "TypeError"),
    ({"r": {**SPEC["r"], "partitions": [{}]}}, "each with a 'row_lengths' string", "KeyError (data_source)"),
    ({"r": {**SPEC["r"], "value_key": 5}}, "'value_key' is an integer", "TypeError"),
    ({"x": {**SPEC["x"], "decode": {"raw": "float64"}}}, "'decode' shape is null", "TypeError (read)"),
]


@pytest.mark.parametrize(("spec", "said", "before"), DAMAGED_SPECS, ids=[c[1] for c in DAMAGED_SPECS])
def test_feature_spec_of_the_wrong_shape(tmp_path: Path, spec: Any, said: str, before: str) -> None:
    _refused(load_feature_spec, _file(tmp_path, "feature_spec.json", spec), said)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        (SPEC, "has no 'context'"),
        ({**SEQUENCE_SPEC, "sequence": []}, "sequence: is a list, not a JSON object"),
        ({**SEQUENCE_SPEC, "sequence": {"f": {"kind": "VarLenFeature", "dtype": "int64"}}}, "'kind' is"),
    ],
)
def test_a_sequence_bundles_spec_of_the_wrong_shape(tmp_path: Path, spec: Any, said: str) -> None:
    """Before: KeyError 'context' from verify, where metadata.json has a `sequence`."""
    _refused(load_feature_spec, _file(tmp_path, "feature_spec.json", spec), said, sequence=True)
