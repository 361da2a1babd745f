"""Text cells as every source reads them: empty cells as nulls, timestamps with or without a zone."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["empty_text_to_null", "is_binary", "is_text", "parse_timestamps", "timestamp_parser"]


def is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def is_binary(t: pa.DataType) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t)


# A time of day followed by a zone offset (`Z`, `+HH`, `+HHMM`, `+HH:MM`), as ISO 8601 writes it.
_ZONED = r"[T ]\d\d[0-9:.]*(Z|[+-]\d\d(:?\d\d)?)$"


def timestamp_parser(unit: str) -> Callable[[pa.Array], pa.Array]:
    """Text to timestamps in `unit`, as Arrow parses them: a text with a zone offset is that
    instant in UTC, one without is taken as UTC already (Parquet's naive timestamps are too)."""
    naive, zoned = pa.timestamp(unit), pa.timestamp(unit, tz="UTC")

    def fn(a: pa.Array) -> pa.Array:
        try:
            return pc.cast(a, naive)
        except pa.ArrowInvalid:
            has_zone = pc.fill_null(pc.match_substring_regex(a, _ZONED), False)
            if not pc.any(has_zone).as_py():
                raise
        kept = pc.cast(pc.if_else(has_zone, pa.scalar(None, a.type), a), naive)
        moved = pc.cast(pc.cast(pc.if_else(has_zone, a, pa.scalar(None, a.type)), zoned), naive)
        return pc.if_else(has_zone, moved, kept)

    return fn


def parse_timestamps(text: pa.Array, unit: str) -> pa.Array:
    """CSV timestamp text as the conversion reads it (empty cells null, a zone offset converted,
    no offset taken as UTC); raises ArrowInvalid at a cell that is no timestamp in `unit`."""
    return timestamp_parser(unit)(empty_text_to_null(text))


def empty_text_to_null(arr: pa.Array) -> pa.Array:
    if not (is_text(arr.type) or is_binary(arr.type)):
        return arr
    empty = pc.equal(pc.binary_length(arr), 0)
    return pc.if_else(empty, pa.scalar(None, arr.type), arr)
