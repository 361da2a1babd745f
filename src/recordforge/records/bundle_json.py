"""A bundle's metadata.json and feature_spec.json, read as files from strangers: the one place the
reading tools load them. A file that is not UTF-8, not JSON, nested past reason, or not of the
shape the readers rely on raises CorruptFile naming it and what is wrong, before any reader
indexes into it; a shard path that is absolute or climbs out of the bundle's folder is refused.
Keys the readers do not use are not checked."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from recordforge.errors import CorruptFile
from recordforge.files.storage import read_bytes
from recordforge.records.array_records import ARRAY_RECORD, COMPRESSIONS
from recordforge.records.tfrecord import Compression
from recordforge.records.webdataset import WEBDATASET

__all__ = ["MAX_DEPTH", "load_feature_spec", "load_json", "load_metadata", "relative_path_problem"]

MAX_DEPTH = 64  # RecordForge's own files nest 6 deep; the readers (and json.dumps) recurse
_MAX_COUNT = 2**63 - 1  # counts and sizes are int64 wherever numpy or the C readers hold them
_FORMATS = ("tfrecord", ARRAY_RECORD, WEBDATASET)
_KINDS = ("FixedLenFeature", "VarLenFeature", "RaggedFeature")
_STEP_KINDS = ("FixedLenSequenceFeature", "RaggedFeature")
_DTYPES = ("int64", "float32", "string")

Problem = str | None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(path: str) -> Any:
    """The JSON value of the file at `path`; CorruptFile where it is not UTF-8 JSON (NaN and
    Infinity, which Python's json takes, refused too), nests deeper than MAX_DEPTH, or holds a
    string that cannot be written as UTF-8 (a lone surrogate escape). OSError as storage raises."""
    data = read_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exn:
        raise CorruptFile(path, f"not UTF-8 (byte {exn.start} of {len(data)})") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise CorruptFile(path, f"not JSON RecordForge reads (nested more than {MAX_DEPTH} deep)") from None
    except ValueError as exn:
        raise CorruptFile(path, f"not valid JSON ({exn})") from None
    problem = _value_problem(value)
    if problem:
        raise CorruptFile(path, problem)
    return value


def _value_problem(value: Any) -> Problem:
    """Depth, unencodable strings and non-finite numbers (1e999 parses as inf), without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                return f"not JSON RecordForge reads (nested more than {MAX_DEPTH} deep)"
            items = list(node.items()) if isinstance(node, dict) else [(None, v) for v in node]
            for key, child in items:
                if key is not None and _unencodable(key):
                    return f"a key is not Unicode text ({key!r})"
                stack.append((child, depth + 1))
        elif isinstance(node, str) and _unencodable(node):
            return f"a string is not Unicode text ({node[:40]!r})"
        elif isinstance(node, float) and not math.isfinite(node):
            return f"a number is out of range ({node})"
    return None


def _unencodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def relative_path_problem(path: Any) -> Problem:
    """Why `path` is not a file path inside the bundle's folder: not a string, empty, absolute,
    with a scheme, a `..`, `.` or empty part, a backslash or a NUL."""
    if not isinstance(path, str):
        return f"is {_kind(path)}, not a path"
    parts = path.split("/")
    if path.startswith("/") or "://" in path or ".." in parts:
        return f"{path!r}: shard path escapes the bundle's folder"
    if not path or "\\" in path or "\x00" in path or any(p in ("", ".") for p in parts):
        return f"{path!r} is not a plain relative path"
    return None


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}.get(
        type(value), type(value).__name__
    )


def _count(value: Any) -> Problem:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is {_kind(value)}, not a count"
    if not 0 <= value <= _MAX_COUNT:
        return f"is {value}, not a count from 0 to 2**63-1"
    return None


def _text(value: Any) -> Problem:
    return None if isinstance(value, str) else f"is {_kind(value)}, not a string"


def _one_of(*choices: str) -> Callable[[Any], Problem]:
    def check(value: Any) -> Problem:
        if value in choices and isinstance(value, str):
            return None
        return f"is {value!r}, not one of {', '.join(map(repr, choices))}"

    return check


def _folder_name(value: Any) -> Problem:
    """A version: a folder directly below the output's (or none)."""
    if value is None or value == "":
        return None
    problem = relative_path_problem(value)
    if problem is None and "/" in value:
        problem = f"{value!r} is not a folder name"
    return problem


def _object(value: Any) -> Problem:
    return None if isinstance(value, dict) else f"is {_kind(value)}, not an object"


_SHARD_KEYS: dict[str, tuple[bool, Callable[[Any], Problem]]] = {
    "file": (True, relative_path_problem),
    "index": (False, relative_path_problem),
    "records": (True, _count),
    "bytes": (True, _count),
    "sha256": (True, _text),
    "split": (False, _text),
}
_TOP_KEYS: dict[str, tuple[bool, Callable[[Any], Problem]]] = {
    "compression": (True, _text),
    "format": (False, _one_of(*_FORMATS)),
    "tf_compression_type": (False, _text),
    "version": (False, _folder_name),
    "previous_version": (False, _folder_name),
    "num_records": (False, _count),
    "rows_read": (False, _count),
    "rows_written": (False, _count),
    "rows_rejected": (False, _count),
    "schema_origin": (False, _text),
    "schema_fingerprint": (False, _text),
    "split_counts": (False, _object),
    "sequence": (False, _object),
}


def _keys_problem(
    value: dict[str, Any], keys: dict[str, tuple[bool, Callable[[Any], Problem]]], where: str
) -> Problem:
    for key, (required, check) in keys.items():
        if key not in value:
            if required:
                return f"{where}has no {key!r}"
            continue
        problem = check(value[key])
        if problem:
            return f"{where}{key!r} {problem}"
    return None


def _metadata_problem(meta: Any) -> Problem:
    if not isinstance(meta, dict):
        return f"is {_kind(meta)}, not a JSON object"
    problem = _keys_problem(meta, _TOP_KEYS, "")
    if problem:
        return problem
    fmt = meta.get("format", "tfrecord")
    compressions = {ARRAY_RECORD: tuple(COMPRESSIONS), WEBDATASET: ("none",)}.get(fmt, Compression.CHOICES)
    problem = _one_of(*compressions)(meta["compression"])
    if problem:
        return f"'compression' {problem} (format {fmt})"
    if "shards" not in meta:
        return "has no 'shards' list"
    shards = meta["shards"]
    if not isinstance(shards, list):
        return f"'shards' is {_kind(shards)}, not a list"
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            return f"shard {i} is {_kind(shard)}, not an object"
        problem = _keys_problem(shard, _SHARD_KEYS, f"shard {i}: ")
        if problem:
            return problem
    return None


def load_metadata(path: str) -> dict[str, Any]:
    """A bundle's metadata.json (the file at `path`), checked: CorruptFile naming it when it is
    damaged (load_json) or lacks what the readers use (a `shards` list of objects, each with a
    `file` inside the bundle's folder, counts from 0 to 2**63-1, a `compression` of its format),
    or holds a value of the wrong type where they read one."""
    meta = load_json(path)
    problem = _metadata_problem(meta)
    if problem:
        raise CorruptFile(path, f"not a bundle's metadata: {problem}")
    return meta  # type: ignore[no-any-return]


def _shape_problem(value: Any, least: int) -> Problem:
    if not isinstance(value, list) or any(isinstance(d, bool) or not isinstance(d, int) for d in value):
        return f"is {_kind(value)}, not a list of integers"
    if any(not least <= d <= _MAX_COUNT for d in value) or math.prod(max(d, 1) for d in value) > _MAX_COUNT:
        return f"is {value}, not a shape"
    return None


def _flat(value: Any) -> list[Any] | None:
    """The scalars of a nested list, in order; None where the value is not one."""
    out: list[Any] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(reversed(node))
        elif isinstance(node, dict):
            return None
        else:
            out.append(node)
    return out


def _default_problem(entry: dict[str, Any]) -> Problem:
    values = _flat(entry["default_value"])
    if values is None:
        return "'default_value' is not a value or a list of values"
    size = math.prod(entry["shape"])
    if len(values) != size:
        return f"'default_value' holds {len(values)} values, its shape {entry['shape']} holds {size}"
    types: tuple[type, ...] = {"int64": (int,), "float32": (int, float), "string": (str,)}[entry["dtype"]]
    if any(isinstance(v, bool) or not isinstance(v, types) for v in values):
        return f"'default_value' holds values that are not {entry['dtype']}"
    if entry["dtype"] == "int64" and any(not -(2**63) <= v < 2**63 for v in values):
        return "'default_value' holds values out of int64's range"
    return None


def _entry_problem(entry: Any, steps: bool) -> Problem:
    """What is wrong with one entry of a spec; `steps`: of a sequence bundle's step features
    (FixedLenSequenceFeature, or RaggedFeature of the steps alone)."""
    if not isinstance(entry, dict):
        return f"is {_kind(entry)}, not an object"
    for key, choices in (("kind", _STEP_KINDS if steps else _KINDS), ("dtype", _DTYPES)):
        if key not in entry:
            return f"has no {key!r}"
        problem = _one_of(*choices)(entry[key])
        if problem:
            return f"{key!r} {problem}"
    for key in ("logical", "value_key"):
        if key in entry and not isinstance(entry[key], str):
            return f"{key!r} is {_kind(entry[key])}, not a string"
    decode = entry.get("decode")
    if decode is not None:
        if not isinstance(decode, dict) or not isinstance(decode.get("raw"), str):
            return "'decode' is not an object with a 'raw' string"
        problem = _shape_problem(decode.get("shape"), -1)
        if problem:
            return f"'decode' shape {problem}"
    if "image" in entry and not isinstance(entry["image"], dict):
        return f"'image' is {_kind(entry['image'])}, not an object"
    if entry["kind"] in ("FixedLenFeature", "FixedLenSequenceFeature"):
        problem = _shape_problem(entry.get("shape"), 0)
        if problem:
            return f"'shape' {problem}"
        if "default_value" in entry:
            return _default_problem(entry)
    if entry["kind"] == "RaggedFeature" and not steps:
        partitions = entry.get("partitions")
        if not isinstance(entry.get("value_key"), str):
            return "has no 'value_key' string"
        if (
            not isinstance(partitions, list)
            or not partitions
            or not all(isinstance(p, dict) and isinstance(p.get("row_lengths"), str) for p in partitions)
        ):
            return "'partitions' is not a list of objects, each with a 'row_lengths' string"
    return None


def _spec_problem(spec: Any, where: str, steps: bool = False) -> Problem:
    if not isinstance(spec, dict):
        return f"{where}is {_kind(spec)}, not a JSON object"
    for name, entry in spec.items():
        problem = _entry_problem(entry, steps)
        if problem:
            return f"{where}feature {name!r} {problem}"
    return None


def load_feature_spec(path: str, *, sequence: bool = False) -> dict[str, Any]:
    """A bundle's feature_spec.json (the file at `path`), checked: CorruptFile naming it when it
    is damaged (load_json), or is not {feature: entry} with every entry of a kind and dtype the
    readers know and the keys its kind needs (a FixedLenFeature's shape, and its default_value
    of that shape; a RaggedFeature's value_key and row_lengths partitions). A sequence bundle's
    (`sequence`, as its metadata.json says) is {"context": spec, "sequence": spec}."""
    spec = load_json(path)
    if not sequence:
        problem = _spec_problem(spec, "")
    elif not isinstance(spec, dict):
        problem = f"is {_kind(spec)}, not a JSON object"
    else:
        problem = next((f"has no {part!r}" for part in ("context", "sequence") if part not in spec), None)
        problem = problem or _spec_problem(spec["context"], "context: ")
        problem = problem or _spec_problem(spec["sequence"], "sequence: ", steps=True)
    if problem:
        raise CorruptFile(path, f"not a feature spec: {problem}")
    return spec  # type: ignore[no-any-return]
