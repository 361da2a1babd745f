"""Random access to a bundle's records: `len()` and `[i]` over ArrayRecord or indexed TFRecord shards."""

from __future__ import annotations

import bisect
import math
import operator
import os
import struct
import tempfile
import threading
from collections.abc import Sequence
from typing import Any, SupportsIndex

import numpy as np

from recordforge.errors import CorruptFile, RecordForgeError
from recordforge.files import layout
from recordforge.files.storage import is_local, open_read, read_bytes, stat
from recordforge.reading.tf_data import load_bundle
from recordforge.records import array_records
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.tfrecord import CorruptRecord

__all__ = ["DataSource", "parse_example"]

_NUMPY = {"int64": np.int64, "float32": np.float32, "string": object}


def _refusal(out: str, meta: dict[str, Any]) -> str | None:
    """Why the shards of `meta` cannot be read at random, and what to convert with instead."""
    if meta.get("format") == array_records.ARRAY_RECORD:
        return None
    compression = meta["compression"]
    if compression != "none":
        return (
            f"{out}: its shards are {compression}-compressed TFRecords, which cannot be read at an "
            "offset (a deflate stream decodes only from its start); convert with --output_format "
            "array_record, or --compression none --record_index, for random access"
        )
    if any("index" not in s for s in meta["shards"]):
        return (
            f"{out}: its TFRecord shards have no record index; convert with --record_index (or "
            "--output_format array_record) for random access"
        )
    return None


class DataSource:
    """The records of a bundle (one split of it), numbered 0..len-1 in the order of its shards
    and, within a shard, of its records: the order a sequential read gives. Implements Grain's
    `RandomAccessDataSource` (`__len__`, `__getitem__`, `__getitems__`); items are serialized
    tf.train.Examples (bytes), which `parse` turns into numpy arrays by the bundle's spec.

    ArrayRecord shards are read with the ArrayRecord library, which reads local files only:
    shards on an object store are copied once to `cache_dir` (default: a folder of the system's
    temporary directory named after the version). Indexed TFRecord shards are read where they
    are, one ranged read per record. Picklable (Grain's worker processes): open files are not
    sent, each process opens its own. Thread-safe."""

    def __init__(self, path: str, split: str | None = None, *, cache_dir: str | None = None) -> None:
        out = path.rstrip("/")
        bundle = load_bundle(out, split=split)
        meta = bundle["metadata"]
        splits = list(meta.get("split_counts") or {})
        if split is None and splits:
            raise RecordForgeError(
                f"{out} holds splits {', '.join(splits)}: pass split= (one of them), "
                f"e.g. recordforge.data_source({out!r}, split={splits[0]!r})"
            )
        why = _refusal(out, meta)
        if why:
            raise RecordForgeError(why)
        shards = [s for s in meta["shards"] if split is None or s.get("split") == split]
        self._out = out
        self._array_record = meta.get("format") == array_records.ARRAY_RECORD
        self._files = [layout.join(out, s["file"]) for s in shards]
        self._indexes = [layout.join(out, s["index"]) if "index" in s else "" for s in shards]
        self._counts = [int(s["records"]) for s in shards]
        self._starts = list(np.cumsum([0, *self._counts]).tolist())
        self.feature_spec: dict[str, dict[str, Any]] = bundle["feature_spec"]
        self._cache_dir = cache_dir or os.path.join(
            tempfile.gettempdir(), "recordforge-cache", str(meta.get("version") or "unversioned")
        )
        self._open_state()

    def _open_state(self) -> None:
        self._lock = threading.Lock()
        self._handles: dict[int, Any] = {}  # shard -> ArrayRecord reader, file descriptor or file
        self._offsets: dict[int, np.ndarray] = {}  # shard -> (n, 2) index of (offset, size)
        self._shard_locks = [threading.Lock() for _ in self._files]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_lock", "_handles", "_offsets", "_shard_locks"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_state()

    def __len__(self) -> int:
        return self._starts[-1]

    def __repr__(self) -> str:
        kind = "ArrayRecord" if self._array_record else "indexed TFRecord"
        return f"DataSource({self._out!r}: {len(self)} records in {len(self._files)} {kind} shards)"

    def _locate(self, key: SupportsIndex) -> tuple[int, int]:
        i = operator.index(key)
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {operator.index(key)} of {n}")
        shard = bisect.bisect_right(self._starts, i) - 1
        return shard, i - self._starts[shard]

    def __getitem__(self, key: SupportsIndex) -> bytes:
        shard, at = self._locate(key)
        return self._read(shard, [at])[0]

    def __getitems__(self, keys: Sequence[SupportsIndex]) -> list[bytes]:
        """Many records at once, each shard's read together (in the order asked)."""
        located = [self._locate(k) for k in keys]
        by_shard: dict[int, list[int]] = {}
        for shard, at in located:
            by_shard.setdefault(shard, []).append(at)
        got = {shard: iter(self._read(shard, ats)) for shard, ats in by_shard.items()}
        return [next(got[shard]) for shard, _ in located]

    def parse(self, record: bytes) -> dict[str, Any]:
        """A record as numpy arrays by the bundle's feature spec (`parse_example`)."""
        return parse_example(record, self.feature_spec, origin=self._out)

    def _handle(self, shard: int) -> Any:
        with self._lock:
            handle = self._handles.get(shard)
            if handle is None:
                path = self._files[shard]
                if self._array_record:
                    handle = array_records.open_reader(array_records.cached_copy(path, self._cache_dir))
                elif is_local(path):
                    handle = os.open(path, os.O_RDONLY)
                else:
                    handle = open_read(path)
                self._handles[shard] = handle
            return handle

    def _index(self, shard: int) -> np.ndarray:
        rows = self._offsets.get(shard)
        if rows is None:
            rows = _read_index(self._indexes[shard], self._files[shard], self._counts[shard], self._out)
            self._offsets[shard] = rows
        return rows

    def _read(self, shard: int, ats: list[int]) -> list[bytes]:
        handle = self._handle(shard)
        if self._array_record:
            path = self._files[shard]
            with self._shard_locks[shard]:
                if len(ats) == 1:  # a seek and a read: no thread pool for one record
                    handle.seek(ats[0])
                    return [array_records.read_or_refuse(path, f"record at index {ats[0]}", handle.read)]
                got = array_records.read_or_refuse(path, f"records at index {ats}", handle.read, ats)
                return list(got)
        rows = self._index(shard)
        out = []
        for at in ats:
            offset, size = (int(v) for v in rows[at])
            if isinstance(handle, int):
                framed = os.pread(handle, size, offset)
            else:
                with self._shard_locks[shard]:
                    handle.seek(offset)
                    framed = handle.read(size)
            out.append(self._unframe(shard, offset, framed, size))
        return out

    def _unframe(self, shard: int, offset: int, framed: bytes, size: int) -> bytes:
        path = self._files[shard]
        if len(framed) != size or size < 16:
            raise CorruptRecord(path, offset, "record cut short (the index and the shard disagree)")
        (length,) = struct.unpack_from("<Q", framed)
        if length != size - 16 or struct.unpack_from("<I", framed, 8)[0] != masked_crc32c(framed[:8]):
            raise CorruptRecord(path, offset, "no record starts here (the index and the shard disagree)")
        data = framed[12:-4]
        if struct.unpack_from("<I", framed, size - 4)[0] != masked_crc32c(data):
            raise CorruptRecord(path, offset, "corrupt data (CRC mismatch)")
        return data


def _read_index(path: str, shard: str, records: int, out: str) -> np.ndarray:
    """A shard's record index as (offset, size) rows, each checked to lie within the shard
    before it is used to read (a size of 9e18 would be one allocation of that many bytes)."""
    try:
        rows = np.array(read_bytes(path).split(), dtype=np.int64).reshape(-1, 2)
    except (ValueError, OverflowError) as exn:  # not numbers, an odd count, or over 2**63
        raise CorruptFile(path, "not a record index (one `offset size` line per record)") from exn
    if len(rows) != records:
        raise CorruptFile(
            path,
            f"lists {len(rows)} records, the manifest says {records}; "
            f"`recordforge verify {out}` checks the bundle",
        )
    size = stat(shard).size
    offsets, sizes = rows[:, 0], rows[:, 1]
    outside = np.flatnonzero((offsets < 0) | (sizes < 16) | (sizes > size) | (offsets > size - sizes))
    if len(outside):
        at = int(outside[0])
        raise CorruptFile(
            path,
            f"line {at + 1} says offset {offsets[at]} size {sizes[at]}, not a record of the shard's "
            f"{size} bytes; `recordforge verify {out}` checks the bundle",
        )
    return rows


def parse_example(record: bytes, spec: dict[str, dict[str, Any]], *, origin: str = "") -> dict[str, Any]:
    """A serialized tf.train.Example as {feature: numpy array} by a bundle's feature_spec.json,
    without TensorFlow: a FixedLenFeature shaped as the spec says, a VarLenFeature as a 1-D
    array, a RaggedFeature as a list of 1-D arrays (one per row). Strings are bytes (object
    arrays). A FixedLenFeature that is absent takes the spec's default, else raises. A feature
    of another kind than the spec's dtype, or with another count than its shape holds, raises
    RecordForgeError as tf.io.parse_example refuses it (`origin`, the bundle, starts the message)."""
    from recordforge.records.example_pb import Example

    features = Example.FromString(record).features.feature
    where = f"{origin}: " if origin else ""
    out: dict[str, Any] = {}
    for name, entry in spec.items():
        dtype = entry["dtype"]
        if entry["kind"] == "RaggedFeature":
            values = _values(features, entry["value_key"], dtype, where)
            lengths = _values(features, entry["partitions"][0]["row_lengths"], "int64", where)
            out[name] = np.split(values, np.cumsum(lengths)[:-1]) if len(lengths) else []
        elif entry["kind"] == "FixedLenFeature":
            size = math.prod(entry["shape"])
            if name not in features or not _has_values(features[name]):
                if "default_value" not in entry:
                    raise RecordForgeError(
                        f"{where}feature {name!r} is missing (FixedLenFeature, no default)"
                    )
                out[name] = np.asarray(entry["default_value"], _NUMPY[dtype]).reshape(entry["shape"])
                continue
            values = _values(features, name, dtype, where)
            if len(values) != size:
                shape = entry["shape"]
                raise RecordForgeError(
                    f"{where}feature {name!r} has {len(values)} values, its shape {shape} holds {size}"
                )
            out[name] = values.reshape(entry["shape"])
        else:
            out[name] = _values(features, name, dtype, where)
    return out


def _has_values(feature: Any) -> bool:
    kind = feature.WhichOneof("kind")
    return kind is not None and len(getattr(feature, kind).value) > 0


_LISTS = {"int64": "int64_list", "float32": "float_list", "string": "bytes_list"}


def _values(features: Any, name: str, spec_dtype: str, where: str) -> np.ndarray:
    dtype = _NUMPY[spec_dtype]
    if name not in features:
        return np.zeros(0, dtype)
    feature = features[name]
    kind = feature.WhichOneof("kind")
    if kind not in (None, _LISTS[spec_dtype]):
        raise RecordForgeError(f"{where}feature {name!r} is a {kind}, the spec says {spec_dtype}")
    values = list(getattr(feature, kind).value) if kind else []
    return np.array(values, dtype=dtype) if dtype is not object else np.array(values + [None], object)[:-1]
