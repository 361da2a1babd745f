"""Reading a published bundle without RecordForge's readers: what whole-conversion tests check.

TFRecord shards are unframed here with `struct`, both CRCs of every record checked with
google-crc32c, after decompressing with Python's own `gzip`/`zlib` (RecordForge writes with
ISA-L and reads with its own streams); ArrayRecord shards are read with the `array_record`
package's reader; WebDataset shards with `tarfile`. Nothing here imports `recordforge`.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import struct
import tarfile
import tempfile
import zlib
from typing import Any

import google_crc32c

__all__ = ["bundle_records", "file_records", "framed_records", "manifest", "samples", "shard_records"]

_MASK_DELTA = 0xA282EAD8


def _masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _read(path: str) -> bytes:
    if path.startswith("gs://"):
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read()
    with open(path, "rb") as f:
        return f.read()


def _decompressed(data: bytes, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.decompress(data)  # every member of a multi-member file
    if compression == "zlib":
        out, rest = [], data
        while rest:  # concatenated zlib streams: each shard part is its own stream
            d = zlib.decompressobj()
            out.append(d.decompress(rest))
            rest = d.unused_data
        return b"".join(out)
    if compression == "none":
        return data
    raise ValueError(f"not a TFRecord compression: {compression!r}")


def framed_records(data: bytes, where: str = "") -> list[bytes]:
    """The records of uncompressed TFRecord bytes; AssertionError at a bad frame or CRC."""
    records, offset = [], 0
    while offset < len(data):
        head = data[offset : offset + 12]
        assert len(head) == 12, f"{where}: truncated header at {offset}"
        (length,) = struct.unpack("<Q", head[:8])
        assert struct.unpack("<I", head[8:])[0] == _masked_crc(head[:8]), f"{where}: length CRC at {offset}"
        start, end = offset + 12, offset + 12 + length
        assert end + 4 <= len(data), f"{where}: record at {offset} runs past the end"
        record = data[start:end]
        assert struct.unpack("<I", data[end : end + 4])[0] == _masked_crc(record), (
            f"{where}: data CRC at {offset}"
        )
        records.append(record)
        offset = end + 4
    return records


def manifest(output: str | os.PathLike[str]) -> dict[str, Any]:
    """The output's published metadata.json."""
    return json.loads(_read(f"{os.fspath(output)}/metadata.json"))


def _format(meta: dict[str, Any]) -> str:
    return str(meta.get("format") or "tfrecord")


def shard_records(path: str, meta: dict[str, Any]) -> list[bytes]:
    """One shard's records (serialized Examples; a WebDataset shard's samples as tar bytes each,
    see `samples` for their members)."""
    fmt = _format(meta)
    return file_records(path, fmt if fmt != "tfrecord" else str(meta["compression"]))


def file_records(path: str, kind: str) -> list[bytes]:
    """A shard file's records; `kind` is its TFRecord compression (gzip, zlib, none),
    "array_record" or "webdataset" (each sample as the JSON of its members, bytes in hex)."""
    if kind == "array_record":
        from array_record.python.array_record_module import ArrayRecordReader

        if path.startswith("gs://"):  # the reader takes local paths only
            with tempfile.NamedTemporaryFile(suffix=".array_record") as f:
                f.write(_read(path))
                f.flush()
                return file_records(f.name, kind)
        reader = ArrayRecordReader(path)
        try:
            return list(reader.read_all()) if reader.num_records() else []
        finally:
            reader.close()
    if kind == "webdataset":
        return [json.dumps(s, sort_keys=True, default=bytes.hex).encode() for s in samples(path)]
    return framed_records(_decompressed(_read(path), kind), path)


def samples(path: str) -> list[dict[str, Any]]:
    """A WebDataset shard's samples in order: {"__key__": key, "<feature>.<ext>": bytes}."""
    out: list[dict[str, Any]] = []
    with tarfile.open(fileobj=io.BytesIO(_read(path)), mode="r:") as tar:
        for member in tar:
            assert member.isfile(), f"{path}: {member.name} is not a file"
            key, _, rest = member.name.partition(".")
            if not out or out[-1]["__key__"] != key:
                out.append({"__key__": key})
            f = tar.extractfile(member)
            assert f is not None
            out[-1][rest] = f.read()
    return out


def bundle_records(output: str | os.PathLike[str], split: str | None = None) -> list[bytes]:
    """Every record of a published bundle (or one split), shard after shard in manifest order,
    each shard's count checked against the manifest."""
    root = os.fspath(output)
    meta = manifest(root)
    records: list[bytes] = []
    for shard in meta["shards"]:
        if split is not None and shard.get("split") != split:
            continue
        got = shard_records(f"{root}/{shard['file']}", meta)
        assert len(got) == shard["records"], (shard["file"], len(got), shard["records"])
        records += got
    if split is None:
        assert len(records) == meta["num_records"], (len(records), meta["num_records"])
    return records
