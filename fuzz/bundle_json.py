"""The reading tools on bundles whose metadata.json or feature_spec.json is damaged: each
succeeds or raises a RecordForgeError naming the file, in bounded time, and touches nothing
outside the bundle's folder."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from fuzz.bundles import JSON_FILES, JSON_MODES, KINDS, SPEC, build_bundles, bundle_file
from recordforge.errors import RecordForgeError
from recordforge.exporting.parquet import export
from recordforge.reading.random_access import DataSource
from recordforge.reading.tf_data import load_bundle
from recordforge.schemas.feature_specs import schema_from_feature_spec
from recordforge.schemas.loader import dump_schema
from recordforge.tools.describe import format_inspect, inspect
from recordforge.tools.records import record_files
from recordforge.tools.stats import stats
from recordforge.tools.stats_format import format_stats
from recordforge.tools.verify import verify

__all__ = ["SECONDS_PER_CALL", "bundle_json", "mutated_json"]

SECONDS_PER_CALL = 20.0
_DEEP = "\x00DEEP\x00"  # replaced, once dumped, by JSON nested 100,000 deep
_CANARY = "\x00CANARY\x00"  # replaced by the absolute path of the shard copy outside the bundle
# Values a structured mutation puts in place of a node; "@" is replaced by the bundle's shard name.
_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2, 2**31, 2**63 - 1, 2**63, 2**64, 10**30, -(2**63) - 1,
    1.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf"),
    "", "x", ".", "..", "/", "//", "../outside/@", "a/../../outside/@", "./@", "@/", "@//", _CANARY,
    "gs://bucket/@", "file:///etc/hostname", "C:\\@", "\x00", "\udcff", "\u00e9@", "@\n", "x" * 300,
    [], {}, [[]], {"": {}}, [{}], ["@"], [1, 2], _DEEP,
    "none", "gzip", "deflate", "array_record", "webdataset", "tfrecord", "GZIP", "ZLIB",
    "FixedLenFeature", "VarLenFeature", "RaggedFeature", "SparseFeature",
    "int64", "float32", "float", "string", "bytes",
    "v-20260101T000000Z-deadbeef", "metadata.json", "feature_spec.json", "_SUCCESS",
]  # fmt: skip
_KEYS = [
    "file", "index", "records", "bytes", "sha256", "split", "shards", "version", "previous_version",
    "num_records", "rows_read", "rows_written", "rows_rejected", "compression", "format",
    "tf_compression_type", "split_counts", "sequence", "appended", "transform", "schema_origin",
    "schema_fingerprint", "context", "kind", "dtype", "shape", "default_value", "value_key",
    "partitions", "row_lengths", "logical", "decode", "raw", "image", "id", "score", "name", "tags",
]  # fmt: skip

_STATE: dict[str, Path] = {}
_GUARD: dict[str, Any] = {"on": False, "bundle": "", "allowed": (), "watched": "", "seen": []}


def _bundles() -> dict[str, Path]:
    if not _STATE:
        root = Path(tempfile.mkdtemp(prefix="recordforge-fuzz-json-"))
        _STATE["root"] = root
        _STATE.update(build_bundles(root / "base"))
        schema = schema_from_feature_spec(SPEC, origin="fuzz")
        for kind in KINDS:
            (_STATE[kind] / "schema.yaml").write_text(dump_schema(schema))
        sys.addaudithook(_audit)
    return {kind: _STATE[kind] for kind in KINDS}


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """While a tool runs: a file opened for writing must lie in the bundle, the export's
    destination or the DataSource's cache; nothing may be opened beside the bundle (the shard
    copy in `outside/` is what a climbing path would reach)."""
    dir_fd = {"os.mkdir": 2, "os.rename": 2, "os.remove": 1}
    if not _GUARD["on"] or event not in ("open", "os.listdir", "shutil.rmtree", *dir_fd):
        return
    raw = args[0]
    if isinstance(raw, int) or raw is None or (event in dir_fd and args[dir_fd[event]] is not None):
        return  # a descriptor, or a name relative to one (shutil.rmtree's, below its audited top)
    try:
        path = os.path.realpath(os.fsdecode(raw))
    except (TypeError, ValueError):
        return
    writes = event != "open" and event != "os.listdir"
    if event == "open":
        mode, flags = args[1], args[2]
        writes = (mode is not None and any(c in mode for c in "wax+")) or (
            mode is None and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        )
    if _inside(path, _GUARD["watched"]) or (
        writes and not path.endswith(".pyc") and not any(_inside(path, a) for a in _GUARD["allowed"])
    ):
        _GUARD["seen"].append(f"{event} {path}")


def _walk(doc: list[Any], ops: Iterator[int]) -> tuple[Any, Any]:
    """(container, key) of a node of doc[0], chosen by the bytes of `ops`."""
    holder: Any = doc
    key: Any = 0
    while True:
        node = holder[key]
        b = next(ops, None)
        if b is None or not isinstance(node, dict | list) or not node or b & 1 == 0:
            return holder, key
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        holder, key = node, keys[(b >> 1) % len(keys)]


def mutated_json(base: Any, data: bytes, shard: str, canary: str) -> bytes:
    """`base` changed by the operations `data` spells (each: a walk to a node, an operation, its
    argument), dumped as JSON, NaN and all."""
    doc = [copy.deepcopy(base)]
    ops = iter(data)
    while (op := next(ops, None)) is not None:
        holder, key = _walk(doc, ops)
        node = holder[key]
        arg = next(ops, 0)
        value = copy.deepcopy(_VALUES[arg % len(_VALUES)])  # never the shared list or dict itself
        value = value.replace("@", shard) if isinstance(value, str) else value
        kind = op % 8
        if kind == 0:
            holder[key] = value
        elif kind == 1 and holder is not doc:
            del holder[key]
        elif kind == 2 and isinstance(node, dict):
            node[_KEYS[arg % len(_KEYS)]] = copy.deepcopy(_VALUES[next(ops, 0) % len(_VALUES)])
        elif kind == 2 and isinstance(node, list):
            node.append(copy.deepcopy(node[arg % len(node)]) if node else value)
        elif kind == 3:
            holder[key] = [node] if arg & 1 else {_KEYS[arg % len(_KEYS)]: node}
        elif kind == 4 and isinstance(node, int) and not isinstance(node, bool):
            holder[key] = [-node, node + 1, node * 2**40, str(node), float(node), node - 1][arg % 6]
        elif kind == 4 and isinstance(node, str):
            holder[key] = ["../" + node, "/" + node, node + "/..", node.upper(), int(arg), node * 2][arg % 6]
        elif kind == 5 and isinstance(node, dict | list) and node:
            holder[key] = list(node) if isinstance(node, dict) else dict.fromkeys(map(str, node), arg)
        elif kind == 6:
            holder[key] = copy.deepcopy(_walk(doc, ops)[0])
        elif kind == 7 and isinstance(node, list) and len(node) > 1:
            node.reverse()
    text = json.dumps(doc[0])
    text = text.replace(json.dumps(_DEEP), "[" * 100_000 + "]" * 100_000)
    return text.replace(json.dumps(_CANARY), json.dumps(canary)).encode("utf-8", "surrogatepass")


class _Slow(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Slow


def _read_all(path: str) -> None:
    source = DataSource(path)
    for record in source.__getitems__(range(min(len(source), 64))):
        source.parse(record)


def _missing_file(exn: BaseException, bundle: str) -> bool:
    """A file the damaged manifest names and that is not there (FileNotFoundError, as for a
    shard deleted from a sound bundle): the error says which."""
    if not isinstance(exn, FileNotFoundError | NotADirectoryError):
        return False
    path = os.path.realpath(str(exn.filename or str(exn).split(":", 1)[0]))
    return _inside(path, bundle) and not os.path.exists(path)


def bundle_json(data: bytes) -> None:
    """Byte 0 picks a bundle, metadata.json or feature_spec.json, and bytes or structured mode;
    in bytes mode the rest is the file's new content, in structured mode the operations that
    change its parsed JSON (mutated_json). verify, stats, inspect, load_bundle, data_source and
    export then read the bundle."""
    if not data:
        return
    kind = KINDS[data[0] % len(KINDS)]
    which = JSON_FILES[data[0] // len(KINDS) % len(JSON_FILES)]
    mode = JSON_MODES[data[0] // (len(KINDS) * len(JSON_FILES)) % len(JSON_MODES)]
    base = _bundles()[kind]
    case = _STATE["root"] / "case"
    shutil.rmtree(case, ignore_errors=True)
    work, outside, dest = case / "bundle", case / "outside", case / "exported" / "dest"
    shutil.copytree(base, work)
    shutil.copytree(base, outside)
    dest.parent.mkdir()
    shard = bundle_file(work, "shard")
    assert shard is not None
    target = work / which
    if mode == "bytes":
        target.write_bytes(data[1:])
    else:
        parsed = json.loads(target.read_text())
        target.write_bytes(mutated_json(parsed, data[1:], shard.name, str(outside / shard.name)))
    out = str(work)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("verify", lambda: verify(out, workers=1)),
        ("stats", lambda: format_stats(stats(out, workers=1))),
        ("inspect", lambda: format_inspect(inspect(out))),
        ("record_files", lambda: record_files(out)),
        ("load_bundle", lambda: load_bundle(out)),
        ("data_source", lambda: _read_all(out)),
        ("export", lambda: export(out, str(dest), overwrite=True, workers=1)),
    ]
    cache = os.path.realpath(os.path.join(tempfile.gettempdir(), "recordforge-cache"))
    _GUARD.update(
        bundle=os.path.realpath(work),
        allowed=(os.path.realpath(work), os.path.realpath(dest.parent), cache + "/", "/dev/"),
        watched=os.path.realpath(outside),
        seen=[],
    )
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for name, call in calls:
            began = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, SECONDS_PER_CALL)
            _GUARD["on"] = True
            try:
                call()
            except RecordForgeError as exn:
                assert out in str(exn), f"{name}: {type(exn).__name__} names no file of the bundle: {exn}"
            except _Slow:
                raise AssertionError(f"{name} ran past {SECONDS_PER_CALL:.0f} s") from None
            except Exception as exn:
                if not _missing_file(exn, _GUARD["bundle"]):
                    raise
            finally:
                _GUARD["on"] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.monotonic() - began
            assert took < SECONDS_PER_CALL, f"{name} took {took:.1f} s"
            assert not _GUARD["seen"], f"{name} reached outside the bundle: {_GUARD['seen'][:3]}"
    finally:
        signal.signal(signal.SIGALRM, previous)
