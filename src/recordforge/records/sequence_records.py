"""Reading a tf.train.SequenceExample with protobuf alone: its context as an Example's features,
its feature lists walked from the wire (FeatureLists = (0x0A len (0x0A len key 0x12 len
(0x0A len Feature)*))*), each Feature parsed by protobuf."""

from __future__ import annotations

from typing import Any

from recordforge.records.example_pb import parse_example

__all__ = ["parse_sequence_example"]

_KINDS = {"int64_list": "int64", "float_list": "float", "bytes_list": "bytes"}


def _varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if byte < 0x80:
            return value, pos


def _fields(raw: bytes) -> list[tuple[int, bytes]]:
    """(field number, bytes) of every length-delimited field of a message, in order; a field of
    another wire type is refused (none of SequenceExample's messages have one)."""
    out, pos = [], 0
    while pos < len(raw):
        tag, pos = _varint(raw, pos)
        if tag & 7 != 2:
            raise ValueError(f"unexpected wire type {tag & 7} for field {tag >> 3}")
        length, pos = _varint(raw, pos)
        if pos + length > len(raw):
            raise ValueError("truncated field")
        out.append((tag >> 3, raw[pos : pos + length]))
        pos += length
    return out


def parse_sequence_example(
    raw: bytes,
) -> tuple[dict[str, tuple[str, list[Any]]], dict[str, tuple[str, list[list[Any]]]]]:
    """(context, feature lists): context as `parse_example` gives an Example's features,
    feature lists as {name: (kind, [values of each step])}; raises ValueError on a record that
    is not a SequenceExample."""
    from google.protobuf.message import DecodeError

    from recordforge.records.example_pb import Feature

    try:
        context = parse_example(raw)  # field 1 of a SequenceExample is laid out as Example's
    except DecodeError as exn:
        raise ValueError(f"not a tf.train.SequenceExample ({exn})") from exn
    lists: dict[str, tuple[str, list[list[Any]]]] = {}
    for number, body in _fields(raw):
        if number != 2:
            continue
        for _, entry in _fields(body):
            parts = dict(_fields(entry))
            name = parts.get(1, b"").decode("utf-8")
            kind, steps = "none", []
            for _, feature in _fields(parts.get(2, b"")):
                parsed = Feature.FromString(feature)
                which = parsed.WhichOneof("kind")
                if which is not None:
                    kind = _KINDS[which]
                steps.append(list(getattr(parsed, which).value) if which else [])
            lists[name] = (kind, steps)
    return context, lists
