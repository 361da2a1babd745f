"""Reading WebDataset shards: samples, and each back to the Example it was written from."""

from __future__ import annotations

import io
import json
import pickle
import tarfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

import numpy as np

from recordforge.errors import CorruptFile
from recordforge.files.storage import open_read
from recordforge.records.example_pb import Feature as FeatureMessage
from recordforge.records.webdataset import npy, ustar

__all__ = ["example_of", "read_examples", "read_samples"]


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
    array = npy.load(data)
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


class _Chained:
    """`first`, then the rest of `then`: where tarfile takes over from the ustar reader."""

    def __init__(self, first: bytes, then: ustar.Readable) -> None:
        self._first, self._then = first, then

    def read(self, size: int = -1) -> bytes:
        if not self._first:
            return self._then.read(size)
        if size < 0:
            data, self._first = self._first + self._then.read(), b""
            return data
        data, self._first = self._first[:size], self._first[size:]
        return data


def read_samples(
    path: str, on_raw: Callable[[bytes], None] | None = None
) -> Iterator[tuple[int, str, list[tuple[str, str, bytes]]]]:
    """(offset of its first header, key, [(feature, ext, data)]) for each sample of a shard, in
    order; a member that is not a regular file, or a name out of the grammar, is CorruptFile."""
    with open_read(path) as raw:
        source = _Hashing(raw, on_raw)
        key: str | None = None
        start, members = 0, list[tuple[str, str, bytes]]()
        for offset, name, data in ustar.members(path, source, _by_tarfile):
            try:
                k, feature, ext = _split_name(name)
            except ValueError as exn:
                raise CorruptFile(path, f"{exn} (at byte {offset})") from exn
            if k != key:
                if key is not None:
                    yield start, key, members
                key, start, members = k, offset, []
            members.append((feature, ext, data))
        if key is not None:
            yield start, key, members
        while source.read(1 << 20):  # the end-of-archive blocks and padding count as read too
            pass


def _by_tarfile(
    path: str, rest: bytes, source: ustar.Readable, base: int
) -> Iterator[tuple[int, str, bytes]]:
    """The members from byte `base` on, read by tarfile (`rest`: the bytes already taken from
    `source` there): what the ustar reader leaves to it (pax and GNU headers, base-256 sizes,
    names not in ASCII, anything it does not recognise), with tarfile's own checks."""
    try:
        tar = tarfile.open(fileobj=_Chained(rest, source), mode="r|")  # type: ignore[call-overload]
        for info in tar:
            if not info.isreg():
                raise CorruptFile(path, f"member {info.name!r} at byte {base + info.offset} is not a file")
            extracted = tar.extractfile(info)
            yield base + info.offset, info.name, extracted.read() if extracted is not None else b""
    except tarfile.TarError as exn:
        raise CorruptFile(path, f"not a readable tar file ({exn}, from byte {base})") from exn


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
