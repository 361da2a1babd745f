"""Files a stranger might hand over: crafted TFRecord files and small hand-made bundles."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from typing import Any

from recordforge.records import array_records
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.example_pb import Example

__all__ = [
    "array_record_bundle",
    "corrupt_array_record",
    "example",
    "frame",
    "gzip_bomb",
    "header",
    "huge_claim",
    "long_names",
    "tfrecord_bundle",
]


def header(length: int) -> bytes:
    """A record header claiming `length` bytes, its CRC right."""
    raw = struct.pack("<Q", length)
    return raw + struct.pack("<I", masked_crc32c(raw))


def frame(data: bytes) -> bytes:
    return header(len(data)) + data + struct.pack("<I", masked_crc32c(data))


def example(**features: tuple[str, list[Any]]) -> bytes:
    """A serialized Example: name=(kind, values), kind "int64", "float", "bytes" or "none" (a
    Feature with no list); a "__" in a name stands for "."."""
    ex = Example()
    for name, (kind, values) in features.items():
        feature = ex.features.feature[name.replace("__", ".")]
        if kind == "none":
            feature.SetInParent()
        else:
            listed = getattr(feature, f"{kind}_list")
            listed.SetInParent()
            listed.value.extend(values)
    return ex.SerializeToString()


def huge_claim(path: Path, size: int) -> Path:
    """A header claiming 2**40 bytes followed by zeros, `size` bytes in all."""
    with open(path, "wb") as f:
        f.write(header(1 << 40))
        zeros = bytes(1 << 20)
        left = size - 12
        while left > 0:
            f.write(zeros[:left])
            left -= len(zeros)
    return path


def gzip_bomb(path: Path, zeros: int = 1 << 30, *, level: int = 9) -> Path:
    """A gzip file: one header claiming 2**40 bytes, then `zeros` zero bytes (1 GiB: a 1 MB
    file at level 9)."""
    deflate = zlib.compressobj(level, zlib.DEFLATED, 31)
    with open(path, "wb") as f:
        f.write(deflate.compress(header(1 << 40)))
        block = bytes(16 << 20)
        for at in range(0, zeros, len(block)):
            f.write(deflate.compress(block[: zeros - at]))
        f.write(deflate.flush())
    return path


def long_names(path: Path, short: int = 4000, long: int = 64 << 10) -> Path:
    """One record whose feature name is `long` bytes, then `short` records with a name each
    (a 200 KB file by default)."""
    records = [example(**{"n" * long: ("int64", [1])})]
    records += [example(**{f"f{i}": ("int64", [i])}) for i in range(short)]
    path.write_bytes(b"".join(frame(r) for r in records))
    return path


def _publish(out: Path, shards: list[dict[str, Any]], spec: dict[str, Any], extra: dict[str, Any]) -> Path:
    records = sum(s["records"] for s in shards)
    meta = {
        "shards": shards,
        "num_records": records,
        "rows_read": records,
        "rows_written": records,
        "rows_rejected": 0,
        "schema_origin": "declared",
        "schema_fingerprint": "0" * 64,
        **extra,
    }
    (out / "metadata.json").write_text(json.dumps(meta))
    (out / "feature_spec.json").write_text(json.dumps(spec))
    (out / "_SUCCESS").write_text("")
    return out


def tfrecord_bundle(out: Path, records: list[bytes], spec: dict[str, Any], *, index: bool = False) -> Path:
    """An unversioned bundle of one uncompressed TFRecord shard holding `records`, with a
    record index where `index`, that `verify` passes as long as the records parse with `spec`."""
    out.mkdir(parents=True)
    framed = [frame(r) for r in records]
    data = b"".join(framed)
    name = "data-00000-of-00001.tfrecord"
    (out / name).write_bytes(data)
    shard = {"file": name, "records": len(records), "bytes": len(data)}
    shard["sha256"] = hashlib.sha256(data).hexdigest()
    if index:
        lines, at = [], 0
        for f in framed:
            lines.append(f"{at} {len(f)}\n")
            at += len(f)
        (out / f"{name}.tfindex").write_text("".join(lines))
        shard["index"] = f"{name}.tfindex"
    return _publish(out, [shard], spec, {"compression": "none", "tf_compression_type": ""})


def array_record_bundle(out: Path, records: list[bytes], spec: dict[str, Any]) -> Path:
    """An unversioned bundle of one ArrayRecord shard holding `records`."""
    out.mkdir(parents=True)
    name = "data-00000-of-00001.array_record"
    writer = array_records.open_writer(str(out / name), array_records.writer_options("none"))
    for r in records:
        writer.write(r)
    writer.close()
    data = (out / name).read_bytes()
    shard = {"file": name, "records": len(records), "bytes": len(data)}
    shard["sha256"] = hashlib.sha256(data).hexdigest()
    return _publish(out, [shard], spec, {"compression": "none", "format": "array_record"})


def corrupt_array_record(path: Path, record: int = 40) -> None:
    """Flips a byte in the chunk of one record (one record per chunk, as RecordForge writes):
    riegeli then refuses that chunk ("Corrupted Riegeli/records file")."""
    data = bytearray(path.read_bytes())
    reader = array_records.open_reader(str(path))
    try:
        reader.seek(record)
        target = reader.read()
    finally:
        reader.close()
    at = bytes(data).index(target)  # the record's bytes lie in its uncompressed chunk
    data[at - 4] ^= 0xFF
    path.write_bytes(bytes(data))
