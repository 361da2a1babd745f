"""WebDataset shards: tar files of samples, one per record, members `<key>.<feature>.<ext>`.

A sample is the record's tf.train.Example written member by member (docs/webdataset.md):

    member      = header(512) data pad-to-512        ustar/pax header, mtime 0, uid/gid 0, mode 0644
    sample      = member*                            one per present feature, by member name
    shard       = sample* zero(1024)                 the end-of-archive marker

`__key__` is the record's place in its source (a digest of the file and the row), unique within
an output. A feature is named in a member with `/` as `:` (the image parts, `img:height`).
Each member decodes with `webdataset`'s default decoders to the value the schema gives it:

    .cls   int64 scalars (and `as: scaled_int` decimals: the scaled integer)   -> int
    .txt   string scalars, `as: string` decimals                                -> str
    .bin   bytes scalars                                                        -> bytes
    .jpg .png ...  images, their encoded bytes as the bundle holds them        -> bytes
    .json  string lists                                                         -> list[str]
    .pyd   bytes lists (pickled list of bytes)                                  -> list[bytes]
    .npy   everything else, in its dtype and shape: float32, float64 (`encode: bytes`; a
           `narrow` float64 is the float32 the bundle holds), bool, int64 lists and fixed shapes,
           timestamps as datetime64[unit], dates as datetime64[D], times as timedelta64[unit]

An absent feature has no member. The mapping back (`example_of`) reads the member's extension and
the array's dtype alone, and gives the Example's bytes exactly as the encoder wrote them.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import pyarrow as pa

from recordforge.errors import CorruptFile
from recordforge.files.storage import open_read
from recordforge.records.example_pb import Example
from recordforge.records.example_pb import Feature as FeatureMessage
from recordforge.schemas.feature import Feature
from recordforge.schemas.kinds import DType

__all__ = [
    "END_OF_ARCHIVE",
    "MIME",
    "SUFFIX",
    "WEBDATASET",
    "Member",
    "SampleCodec",
    "example_of",
    "read_examples",
    "read_samples",
    "sample_bytes",
    "webdataset_facts",
    "sample_key",
]

WEBDATASET = "webdataset"  # the output format's name, and how tools read its shards
SUFFIX = ".tar"
MIME = "application/x-tar"
END_OF_ARCHIVE = bytes(1024)
_BLOCK = 512
_IMAGE_EXT = {"jpeg": "jpg"}
_TIME_DTYPE = {DType.TIMESTAMP: "datetime64", DType.TIME: "timedelta64"}


@dataclass(frozen=True)
class Member:
    """How one Example feature is written in a sample: its extension and, for `.npy`, the
    array's dtype and shape (`()` a scalar, `(-1,)` a list)."""

    feature: str
    ext: str  # cls, txt, bin, json, pyd, npy, or image (the extension from the image's format)
    dtype: str = ""
    shape: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.feature.replace("/", ":")


def _members(f: Feature) -> list[Member]:
    if f.is_image:
        parts = [Member(f.part_name(p), "cls") for p in ("height", "width", "channels")]
        return [Member(f.name, "image"), *parts, Member(f.part_name("format"), "txt")]
    shape = (-1,) if -1 in f.shape else f.shape
    if f.is_ragged:
        return [Member(f.name, "npy", _dtype(f), shape), Member(f.row_lengths_name, "npy", "int64", (-1,))]
    hashed_or_scaled = f.hashed or (f.dtype is DType.DECIMAL and f.decimal_as == "scaled_int")
    if f.is_scalar and (f.dtype is DType.INT64 or hashed_or_scaled):
        return [Member(f.name, "cls")]
    if f.dtype in (DType.STRING, DType.DECIMAL) and not hashed_or_scaled:
        return [Member(f.name, "txt" if f.is_scalar else "json")]
    if f.dtype is DType.BYTES and not f.hashed:
        return [Member(f.name, "bin" if f.is_scalar else "pyd")]
    return [Member(f.name, "npy", _dtype(f), shape)]


def _dtype(f: Feature) -> str:
    if f.hashed or f.dtype is DType.INT64 or f.dtype is DType.DECIMAL:
        return "int64"
    if f.dtype is DType.BOOL:
        return "bool"
    if f.dtype is DType.DATE:
        return "datetime64[D]"
    if f.dtype in _TIME_DTYPE:
        return f"{_TIME_DTYPE[f.dtype]}[{f.unit}]"
    if f.dtype is DType.FLOAT64 and f.float64_bytes:
        return "float64"
    if f.dtype in (DType.FLOAT32, DType.FLOAT64):
        return "float32"
    raise ValueError(f"feature {f.name!r}: no array form for {f.dtype.value}")


def webdataset_facts() -> dict[str, str]:
    """What metadata.json says of the shards' samples (docs/webdataset.md)."""
    return {
        "member": "<key>.<feature>.<ext>, '/' in a feature's name written as ':'",
        "key": "sha256 of the source file's path (12 hex digits)-the row (12 digits)",
        "decode": "webdataset.WebDataset(urls).decode(): .cls int, .txt str, .json list[str], "
        ".pyd list[bytes], .npy numpy arrays of the feature's dtype and shape, images encoded",
    }


def sample_key(file: str, row: int) -> str:
    """A record's `__key__`: its source file's digest and its row (no `.`, no `/`)."""
    return f"{hashlib.sha256(file.encode()).hexdigest()[:12]}-{row:012d}"


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _npy(values: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, values, allow_pickle=False)
    return out.getvalue()


@dataclass(frozen=True)
class SampleCodec:
    """Writes serialized Examples as tar samples (the members of a schema's features)."""

    members: tuple[Member, ...]

    @classmethod
    def of(cls, features: Iterable[Feature]) -> SampleCodec:
        members = [m for f in features for m in _members(f)]
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError("two features share a WebDataset member name ('/' is written as ':')")
        return cls(tuple(sorted(members, key=lambda m: m.name)))

    def encode(self, key: str, record: bytes) -> bytes:
        """One sample: the record's present features, by member name."""
        feature = Example.FromString(record).features.feature
        out = []
        for m in self.members:
            if m.feature not in feature:
                continue
            ext, data = self._member(m, feature[m.feature], feature)
            out.append((m.feature, ext, data))
        return sample_bytes(key, out)

    def encode_batch(self, file: str, first_row: int, records: pa.Array) -> pa.LargeBinaryArray:
        """A batch's samples, record i keyed by row `first_row + i` of `file`."""
        samples = [
            self.encode(sample_key(file, first_row + i), record)
            for i, record in enumerate(records.to_pylist())
        ]
        return pa.array(samples, pa.large_binary())

    def _member(self, m: Member, feat: Any, feature: Any) -> tuple[str, bytes]:
        kind = feat.WhichOneof("kind")
        values = list(getattr(feat, kind).value) if kind else []
        if m.ext == "cls":
            return "cls", str(values[0]).encode()
        if m.ext in ("txt", "bin"):
            return m.ext, values[0]
        if m.ext == "image":
            fmt = feature[m.feature + "/format"].bytes_list.value
            name = fmt[0].decode() if fmt else "bin"
            return _IMAGE_EXT.get(name, name), values[0]
        if m.ext == "json":
            return "json", json.dumps([v.decode() for v in values], ensure_ascii=False).encode()
        if m.ext == "pyd":
            return "pyd", pickle.dumps([bytes(v) for v in values], protocol=4)
        if m.dtype == "float64":
            array = np.frombuffer(values[0] if values else b"", "<f8")
        elif m.dtype == "float32":
            array = np.asarray(values, np.float32)
        else:
            ints = np.asarray(values, np.int64)
            array = ints.astype(bool) if m.dtype == "bool" else ints.view(m.dtype)
        return "npy", _npy(array.reshape(m.shape))


class _Restricted(pickle.Unpickler):
    """Unpickles lists of bytes only: a shard is never a way to run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a .pyd member names {module}.{name}")


def _feature_values(ext: str, data: bytes) -> tuple[str, list[Any]]:
    """(Example list, values) of one member."""
    if ext == "cls":
        return "int64_list", [int(data)]
    if ext == "json":
        values = json.loads(data)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError("a .json member is not a list of strings")
        return "bytes_list", [v.encode() for v in values]
    if ext == "pyd":
        values = _Restricted(io.BytesIO(data)).load()
        if not isinstance(values, list) or not all(isinstance(v, bytes) for v in values):
            raise ValueError("a .pyd member is not a list of bytes")
        return "bytes_list", values
    if ext != "npy":
        return "bytes_list", [data]
    array = np.load(io.BytesIO(data), allow_pickle=False)
    if array.dtype.kind in "biuMm":
        return "int64_list", array.ravel().view(np.int64).tolist() if array.dtype.kind in "Mm" else (
            array.ravel().astype(np.int64).tolist()
        )
    if array.dtype == np.float32:
        return "float_list", array.ravel().tolist()
    if array.dtype == np.float64:
        return "bytes_list", [array.astype("<f8").tobytes()]
    raise ValueError(f"a .npy member of dtype {array.dtype}")


def _split_name(name: str) -> tuple[str, str, str]:
    """(key, feature, ext) of a member name."""
    key, dot, rest = name.partition(".")
    feature, dot2, ext = rest.rpartition(".")
    if not dot or not dot2 or not key or not feature:
        raise ValueError(f"member {name!r} is not <key>.<feature>.<ext>")
    return key, feature.replace(":", "/"), ext


def example_of(members: Iterable[tuple[str, str, bytes]]) -> bytes:
    """The Example a sample's (feature, ext, data) members were written from, serialized as the
    encoder serializes it."""
    entries = []
    for feature, ext, data in members:
        kind, values = _feature_values(ext, data)
        message = FeatureMessage()
        target = getattr(message, kind)
        target.SetInParent()
        target.value.extend(values)
        key = feature.encode()
        body = message.SerializeToString(deterministic=True)
        entries.append((key, b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(body)) + body))
    # Keys sorted by their UTF-8 bytes, as the encoder writes them (encoding.py's grammar).
    features = b"".join(b"\x0a" + _varint(len(e)) + e for _, e in sorted(entries))
    return b"\x0a" + _varint(len(features)) + features if entries else b""


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Hashing:
    """A file read through, each read's bytes shown to `on_raw` (to hash them as read)."""

    def __init__(self, f: IO[bytes], on_raw: Callable[[bytes], None] | None) -> None:
        self._f, self._on_raw = f, on_raw

    def read(self, size: int = -1) -> bytes:
        data = self._f.read(size)
        if self._on_raw is not None and data:
            self._on_raw(data)
        return data


def read_samples(
    path: str, on_raw: Callable[[bytes], None] | None = None
) -> Iterator[tuple[int, str, list[tuple[str, str, bytes]]]]:
    """(offset of its first header, key, [(feature, ext, data)]) for each sample of a shard, in
    order; a member that is not a regular file, or a name out of the grammar, is CorruptFile."""
    with open_read(path) as raw:
        try:
            tar = tarfile.open(fileobj=_Hashing(raw, on_raw), mode="r|")  # type: ignore[call-overload]
            key: str | None = None
            start, members = 0, list[tuple[str, str, bytes]]()
            for info in tar:
                if not info.isreg():
                    raise CorruptFile(path, f"member {info.name!r} at byte {info.offset} is not a file")
                try:
                    k, feature, ext = _split_name(info.name)
                except ValueError as exn:
                    raise CorruptFile(path, f"{exn} (at byte {info.offset})") from exn
                extracted = tar.extractfile(info)
                data = extracted.read() if extracted is not None else b""
                if k != key:
                    if key is not None:
                        yield start, key, members
                    key, start, members = k, info.offset, []
                members.append((feature, ext, data))
            if key is not None:
                yield start, key, members
            rest = _Hashing(raw, on_raw)
            while rest.read(1 << 20):  # the end-of-archive blocks and padding count as read too
                pass
        except tarfile.TarError as exn:
            raise CorruptFile(path, f"not a readable tar file ({exn})") from exn


def sample_bytes(key: str, members: Iterable[tuple[str, str, bytes]]) -> bytes:
    """A sample's bytes as `SampleCodec.encode` wrote them, from its members."""
    out = []
    for feature, ext, data in members:
        name = f"{key}.{feature.replace('/', ':')}.{ext}"
        out += [_header(name, len(data)), data, bytes(-len(data) % _BLOCK)]
    return b"".join(out)


def read_examples(path: str, on_raw: Callable[[bytes], None] | None = None) -> Iterator[tuple[int, bytes]]:
    """(byte offset, serialized Example) of each sample of a shard; a member that does not
    decode is CorruptFile naming its sample."""
    for offset, key, members in read_samples(path, on_raw):
        try:
            example = example_of(members)
        except Exception as exn:  # numpy's, json's and pickle's errors alike
            text = " ".join(str(exn).split()) or type(exn).__name__
            raise CorruptFile(path, f"sample {key!r} at byte {offset} does not decode ({text})") from exn
        yield offset, example
