"""Reading any TFRecord file of tf.train.Examples: compression detected from content, records with
their byte offsets and CRC checks, and a feature spec inferred from a sample."""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from recordforge.tfrecord import masked_crc32c

__all__ = ["CorruptRecord", "FeatureSummary", "detect_compression", "infer_feature_spec",
           "parse_example", "read_records"]

_CHUNK = 4 << 20

class CorruptRecord(ValueError):
    """A record whose framing or CRC is wrong; `offset` is its byte offset in the decompressed
    stream."""

    def __init__(self, path: str, offset: int, what: str) -> None:
        self.path = path
        self.offset = offset
        super().__init__(f"{path}: {what} at byte {offset}")

def detect_compression(path: str) -> str:
    """"gzip", "zlib" or "none", from the first bytes (the suffix is not trusted)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        head = f.read(16)
    if head[:2] == b"\x1f\x8b":
        return "gzip"
    if len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        # A zlib header. An uncompressed TFRecord starts with a little-endian length instead;
        # tell them apart by the length's CRC.
        if len(head) >= 12 and struct.unpack("<I", head[8:12])[0] == masked_crc32c(head[:8]):
            return "none"
        return "zlib"
    return "none"

def _chunks(
    path: str, compression: str, on_raw: Callable[[bytes], None] | None = None
) -> Iterator[bytes]:
    inflate = None
    if compression != "none":
        inflate = zlib.decompressobj(47 if compression == "gzip" else 15)
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        while raw := f.read(_CHUNK):
            if on_raw is not None:
                on_raw(raw)
            yield inflate.decompress(raw) if inflate else raw
            while inflate and inflate.unused_data:  # concatenated gzip members
                rest = inflate.unused_data
                inflate = zlib.decompressobj(47)
                yield inflate.decompress(rest)
    if inflate:
        yield inflate.flush()

def read_records(
    path: str, compression: str | None = None, *, check_crc: bool = True,
    on_raw: Callable[[bytes], None] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """(offset, record) for each record, streaming in bounded memory. Raises CorruptRecord at the
    first bad frame or CRC, naming its offset. `on_raw` sees the file's bytes as read (to hash)."""
    compression = compression or detect_compression(path)
    buf = b""
    pos = 0  # offset in `buf`
    base = 0  # stream offset of buf[0]
    chunks = _chunks(path, compression, on_raw)
    done = False
    while True:
        if len(buf) - pos < 12 and not done:
            more = next(chunks, None)
            if more is None:
                done = True
            else:
                buf = buf[pos:] + more
                base += pos
                pos = 0
                continue
        if len(buf) - pos == 0 and done:
            return
        if len(buf) - pos < 12:
            raise CorruptRecord(path, base + pos, "truncated record header")
        head = buf[pos : pos + 12]
        (length,) = struct.unpack("<Q", head[:8])
        if check_crc and struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
            raise CorruptRecord(path, base + pos, "corrupt length (CRC mismatch)")
        end = pos + 16 + length
        while len(buf) < end and not done:
            more = next(chunks, None)
            if more is None:
                done = True
            else:
                buf = buf[pos:] + more
                base += pos
                end -= pos
                pos = 0
        if len(buf) < end:
            raise CorruptRecord(path, base + pos, "truncated record")
        data = buf[pos + 12 : end - 4]
        if check_crc and struct.unpack("<I", buf[end - 4 : end])[0] != masked_crc32c(data):
            raise CorruptRecord(path, base + pos, "corrupt data (CRC mismatch)")
        yield base + pos, data
        pos = end

def parse_example(raw: bytes) -> dict[str, tuple[str, list[Any]]]:
    """{feature: (kind, values)} with kind "int64", "float" or "bytes", using protobuf only."""

    from recordforge.tools._example_pb import Example

    ex = Example.FromString(raw)
    out = {}
    for name, feat in ex.features.feature.items():
        kind = feat.WhichOneof("kind")
        if kind is None:
            out[name] = ("none", [])
        else:
            out[name] = ({"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}[kind],
                         list(getattr(feat, kind).value))
    return out

@dataclass
class FeatureSummary:
    """What a sample of records says about one feature."""

    kind: str
    present: int = 0
    min_count: int | None = None
    max_count: int = 0
    kinds: set[str] = field(default_factory=set)

    def add(self, kind: str, count: int) -> None:
        self.kinds.add(kind)
        self.present += 1
        self.min_count = count if self.min_count is None else min(self.min_count, count)
        self.max_count = max(self.max_count, count)

def infer_feature_spec(
    records: list[bytes],
) -> tuple[dict[str, FeatureSummary], dict[str, dict[str, Any]]]:
    """Summaries per feature and a JSON feature spec: FixedLenFeature where every sampled record
    has the feature with the same number of values, VarLenFeature otherwise."""
    summaries: dict[str, FeatureSummary] = {}
    for raw in records:
        for name, (kind, values) in parse_example(raw).items():
            summaries.setdefault(name, FeatureSummary(kind)).add(kind, len(values))
    spec: dict[str, dict[str, Any]] = {}
    dtypes = {"int64": "int64", "float": "float32", "bytes": "string", "none": "string"}
    for name, s in sorted(summaries.items()):
        kind = next(iter(s.kinds - {"none"}), "none") if len(s.kinds) > 1 else s.kind
        dtype = dtypes[kind]
        fixed = s.present == len(records) and s.min_count == s.max_count and s.max_count > 0
        if fixed:
            shape = [] if s.max_count == 1 else [s.max_count]
            spec[name] = {"kind": "FixedLenFeature", "dtype": dtype, "shape": shape}
        else:
            spec[name] = {"kind": "VarLenFeature", "dtype": dtype}
    return summaries, spec
