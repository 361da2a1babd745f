"""An ORC file's stripes (rows each) and columns known to hold no null, from its decoded footer."""
# pyarrow reads ORC stripes but tells neither a stripe's row count nor the column statistics; the
# ORC library hands both over in its serialized FileTail (orc_proto.proto: FileTail.footer =
# Footer{stripes = 3: StripeInformation{numberOfRows = 5}, types = 4: Type{kind = 1,
# subtypes = 2, fieldNames = 3}, statistics = 7: ColumnStatistics{hasNull = 10}}), already
# decompressed. Every length read is checked against the bytes that hold it.

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["never_null_paths", "stripe_rows"]

_STRUCT = 12


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("truncated ORC file tail")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: varints as ints, length-delimited as bytes."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            size, at = _varint(data, at)
            if size > len(data) - at:
                raise ValueError("ORC file tail: a field longer than its message")
            yield number, data[at : at + size]
            at += size
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"ORC file tail: wire type {wire}")


def _footer(tail: bytes) -> bytes:
    for number, value in _fields(tail):
        if number == 2 and isinstance(value, bytes):
            return value
    raise ValueError("ORC file tail without a footer")


def stripe_rows(tail: bytes) -> list[int]:
    """The number of rows of each stripe, in file order."""
    out = []
    for number, value in _fields(_footer(tail)):
        if number == 3 and isinstance(value, bytes):
            out.append(next((int(v) for n, v in _fields(value) if n == 5), 0))
    return out


def never_null_paths(tail: bytes) -> frozenset[str]:
    """The columns (struct fields as `a.b`, lists by their own name) whose file statistics say
    they hold no null, nor does any struct above them; none where statistics are missing."""
    types: list[tuple[int, list[int], list[str]]] = []
    has_null: list[bool | None] = []
    for number, value in _fields(_footer(tail)):
        if number == 4 and isinstance(value, bytes):
            kind, subtypes, names = 0, [], []
            for n, v in _fields(value):
                if n == 1 and isinstance(v, int):
                    kind = v
                elif n == 2 and isinstance(v, bytes):  # packed
                    at = 0
                    while at < len(v):
                        sub, at = _varint(v, at)
                        subtypes.append(sub)
                elif n == 2 and isinstance(v, int):
                    subtypes.append(v)
                elif n == 3 and isinstance(v, bytes):
                    names.append(v.decode())
            types.append((kind, subtypes, names))
        elif number == 7 and isinstance(value, bytes):
            has_null.append(next((bool(v) for n, v in _fields(value) if n == 10), None))
    if len(has_null) != len(types) or not types:
        return frozenset()
    out: set[str] = set()

    def walk(column: int, path: str) -> None:
        if column >= len(types) or has_null[column] is not False:
            return
        kind, subtypes, names = types[column]
        if kind != _STRUCT:
            out.add(path)
            return
        for sub, name in zip(subtypes, names, strict=False):
            walk(sub, f"{path}.{name}" if path else name)

    walk(0, "")
    return frozenset(out)
