"""The members a schema's features become in a WebDataset sample, and a sample's tar bytes."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from recordforge.schemas.feature import Feature
from recordforge.schemas.kinds import DType

__all__ = [
    "END_OF_ARCHIVE",
    "MIME",
    "SUFFIX",
    "WEBDATASET",
    "Member",
    "sample_bytes",
    "sample_key",
    "webdataset_facts",
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


def sample_bytes(key: str, members: Iterable[tuple[str, str, bytes]]) -> bytes:
    """A sample's bytes as `SampleCodec.encode` wrote them, from its members."""
    out = []
    for feature, ext, data in members:
        name = f"{key}.{feature.replace('/', ':')}.{ext}"
        out += [_header(name, len(data)), data, bytes(-len(data) % _BLOCK)]
    return b"".join(out)
