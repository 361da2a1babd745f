"""Harnesses for the C entry points (records/_native.c, _decode.c), each against a reference."""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np

from recordforge.records import _native
from recordforge.records.crc32c import masked_crc32c
from recordforge.records.example_pb import parse_example
from recordforge.records.wire import BYTES, FLOAT, INT64, decode_batch
from recordforge.records.wire_keys import KeyTable

__all__ = ["crc32c", "data_crc_mismatches", "decode_examples", "find_records", "split_records"]


def crc32c(data: bytes) -> None:
    """Both CRC32C loops (the CPU's instruction and the table) equal google-crc32c's, at any alignment."""
    want = google_crc32c.value(data)
    for skip in (0, 1, 3):
        piece = data[skip:]
        expected = want if not skip else google_crc32c.value(piece)
        assert _native.crc32c(piece, True) == expected, skip
        assert _native.crc32c(piece, False) == expected, skip
        assert _native.crc32c(memoryview(data)[skip:], False) == expected, skip


def _reference_frames(data: bytes) -> tuple[list[int], int, bool]:
    """The whole records at the front of `data`, hopped with struct: (heads, used, bad)."""
    heads, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if length > len(data) - pos - 16:
            break
        if masked_crc32c(data[pos : pos + 8]) != struct.unpack_from("<I", data, pos + 8)[0]:
            return heads, pos, True
        heads.append(pos)
        pos += length + 16
    return heads, pos, False


def find_records(data: bytes) -> None:
    """find_records equals a framing hopped in Python; every record it finds lies in `data`."""
    found, used, bad = _native.find_records(data)
    heads = np.frombuffer(found, np.int64).tolist()
    assert (heads, used, bool(bad)) == _reference_frames(data)


def data_crc_mismatches(data: bytes) -> None:
    """The data CRCs of the records find_records finds, against google-crc32c; heads and lengths
    that reach outside the data are a ValueError, never a read past it."""
    found, used, _ = _native.find_records(data)
    heads = np.frombuffer(found, np.int64)
    lengths = np.diff(heads, append=used) - 16
    expected = [
        i
        for i, (h, n) in enumerate(zip(heads.tolist(), lengths.tolist(), strict=True))
        if masked_crc32c(data[h + 12 : h + 12 + n]) != struct.unpack_from("<I", data, h + 12 + n)[0]
    ]
    assert _native.data_crc_mismatches(data, heads, lengths) == expected
    # Heads and lengths taken from the bytes themselves: anything, in or out of range.
    raw = np.frombuffer(data[: len(data) // 16 * 16], np.int64)
    crafted_heads, crafted_lengths = raw[0::2].copy(), raw[1::2].copy()
    inside = all(
        0 <= h and 0 <= n <= len(data) and h <= len(data) - 16 - n
        for h, n in zip(crafted_heads.tolist(), crafted_lengths.tolist(), strict=True)
    )
    try:
        got = _native.data_crc_mismatches(data, crafted_heads, crafted_lengths)
    except ValueError:
        assert not inside
    else:
        assert inside, got


def split_records(data: bytes) -> list[bytes]:
    """The fuzzer's bytes as records: each a 2-byte little-endian length, then that many bytes
    (the last one cut where the input ends)."""
    records, pos = [], 0
    while pos + 2 <= len(data):
        (n,) = struct.unpack_from("<H", data, pos)
        records.append(data[pos + 2 : pos + 2 + n])
        pos += 2 + n
    return records


def _floats(values: np.ndarray) -> bytes:
    """float32 values as bytes, every NaN as one: protobuf's Python floats are doubles, and a
    signalling NaN comes back quiet from them, where the C decoder keeps the bits it was given."""
    values = np.array(values, np.float32)
    values[np.isnan(values)] = np.float32("nan")
    return values.tobytes()


def _reference(record: bytes) -> dict[str, tuple[str, bytes | list[bytes]]] | None:
    """protobuf's parse, floats as their float32 bytes (NaNs compare); None where it refuses."""
    try:
        parsed = parse_example(record)
    except Exception:  # noqa: BLE001 - DecodeError and whatever else protobuf refuses with
        return None
    out: dict[str, tuple[str, bytes | list[bytes]]] = {}
    for name, (kind, values) in parsed.items():
        if kind == "float":
            out[name] = (kind, _floats(np.array(values, np.float32)))
        elif kind == "int64":
            out[name] = (kind, np.array(values, np.int64).tobytes())
        else:
            out[name] = (kind, list(values))
    return out


def decode_examples(data: bytes) -> None:
    """decode_batch (the C decoder, protobuf for the records it leaves) gives every record
    exactly as protobuf parses it, and a record protobuf refuses as not an Example; the C pass
    alone never keeps a record protobuf refuses."""
    records = split_records(data)
    blob = b"".join(records)
    ends = np.cumsum([len(r) for r in records], dtype=np.int64)
    starts = ends - np.array([len(r) for r in records], np.int64)
    slow = np.frombuffer(_native.decode_examples(blob, starts, ends)[10], bool)
    batch = decode_batch(blob, starts, ends, KeyTable())
    got: list[dict[str, tuple[str, bytes | list[bytes]]]] = [{} for _ in records]
    for name, col in batch.columns.items():
        ints = floats = b = 0
        for r, kind, count in zip(col.rec.tolist(), col.kind.tolist(), col.count.tolist(), strict=True):
            if kind == INT64:
                got[r][name] = ("int64", col.ints[ints : ints + count].tobytes())
                ints += count
            elif kind == FLOAT:
                got[r][name] = ("float", _floats(col.floats[floats : floats + count]))
                floats += count
            elif kind == BYTES:
                spans = zip(col.starts[b : b + count].tolist(), col.ends[b : b + count].tolist(), strict=True)
                got[r][name] = ("bytes", [col.blob[s:e].tobytes() for s, e in spans])
                b += count
            else:
                got[r][name] = ("none", [])
    for r, record in enumerate(records):
        want = _reference(record)
        if want is None:
            assert slow[r], f"record {r}: the C decoder kept a record protobuf refuses"
            assert r in batch.not_examples, r
            continue
        assert r not in batch.not_examples, r
        assert got[r] == want, (r, got[r], want)
