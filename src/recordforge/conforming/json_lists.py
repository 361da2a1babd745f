"""List features' CSV cells (JSON arrays) parsed to the declared type, vectorised where they are flat."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.arrays import binary_parts
from recordforge.schemas.kinds import DType
from recordforge.schemas.model import Feature
from recordforge.schemas.plan import TEXT_VALUE_TYPES

__all__ = ["numeric_json_lists", "parse_json_lists"]


def numeric_json_lists(col: pa.Array, f: Feature) -> pa.Array | None:
    """Vectorised parse of flat JSON arrays of numbers or booleans (`[1, 2.5]`): split on the
    commas, trim the blanks and brackets off each value, cast. None when any cell is not that
    simple (then: json.loads per cell)."""
    value_t = TEXT_VALUE_TYPES.get(f.dtype)
    if (
        value_t is None
        or len(f.shape) != 1
        or not (pa.types.is_integer(value_t) or pa.types.is_floating(value_t) or pa.types.is_boolean(value_t))
    ):
        return None
    # The shape, with numpy on the column's bytes (cheaper than a regex over every cell): every
    # non-empty cell starts with "[", ends with "]" and holds no other bracket. Quotes, braces and
    # nested lists then fail the cast below. Blanks around a list and blank cells are left to
    # json.loads.
    offsets, data = binary_parts(
        col.view(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    )
    starts, ends = offsets[:-1], offsets[1:]
    is_list = (ends > starts) & pc.is_valid(col).to_numpy(zero_copy_only=False)
    cells = np.count_nonzero(is_list)
    text = data[offsets[0] : offsets[-1]]
    if (
        (data[starts[is_list]] != ord("[")).any()
        or (data[ends[is_list] - 1] != ord("]")).any()
        or np.count_nonzero(text == ord("[")) != cells
        or np.count_nonzero(text == ord("]")) != cells
    ):
        return None
    # "[1, 2]" -> "[1", " 2]" -> "1", "2": the brackets can only be at the ends of a list.
    parts = pc.split_pattern(col, ",")
    values = pc.utf8_trim(pc.list_flatten(parts), " \t\n\r[]")
    split_lengths = pc.fill_null(pc.list_value_length(parts), 0).to_numpy(zero_copy_only=False)
    lengths = np.where(is_list, split_lengths, 0)
    # "[]" splits into one blank value: an empty list, not a bad value.
    single = np.flatnonzero(lengths == 1)
    first = (np.cumsum(split_lengths) - split_lengths)[single]  # where their one value is
    empty = pc.binary_length(values.take(pa.array(first))).to_numpy(zero_copy_only=False) == 0
    lengths[single[empty]] = 0
    if empty.any() or cells < len(col):  # drop the values of empty lists and of empty cells
        values = values.filter(pa.array(np.repeat(lengths > 0, split_lengths)))
    try:
        typed = pc.cast(values, value_t)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if pa.types.is_floating(value_t) and pc.any(pc.is_inf(typed)).as_py():
        return None  # an overflow or a written infinity: told apart value by value, below
    list_offsets = np.zeros(len(col) + 1, dtype=np.int64)
    np.cumsum(lengths, out=list_offsets[1:])
    return pa.LargeListArray.from_arrays(pa.array(list_offsets), typed, mask=pa.array(~is_list))


class _OutOfRange(ValueError):
    pass


def _checked_float(value_t: pa.DataType | None) -> Callable[[str], float] | None:
    """For float lists: json's number parser, refusing a number the list's float type cannot hold
    (which would otherwise become an infinity); `Infinity` written out stays a value."""
    if value_t is None or not pa.types.is_floating(value_t):
        return None
    limit = float(np.finfo(np.float32).max) if value_t == pa.float32() else math.inf

    def parse(text: str) -> float:
        value = float(text)
        with np.errstate(over="ignore"):
            narrowed = float(np.float32(value)) if abs(value) > limit else value
        if math.isinf(narrowed):
            raise _OutOfRange(f"{text} is outside {value_t} range")
        return value

    return parse


def parse_json_lists(col: pa.Array, f: Feature) -> tuple[pa.Array, list[tuple[int, str, str]]]:
    """CSV cells of list features hold JSON arrays (`[1, 2]`); an empty (or blank) cell is a null.
    Values are converted straight to the declared type, as a typed CSV column would be. Returns
    the lists and (row, rule, reason) of each cell that is none (a null in the lists)."""
    fast = numeric_json_lists(col, f)
    if fast is not None:
        return fast, []
    parsed: list[Any] = []
    bad: list[tuple[int, str, str]] = []
    number = _checked_float(TEXT_VALUE_TYPES.get(f.dtype))
    for i, cell in enumerate(col.to_pylist()):
        value = None
        if cell is not None and cell.strip(" \t\n\r"):  # a blank cell is a null, as on the fast path
            try:
                value = json.loads(cell, parse_float=number) if number else json.loads(cell)
                if not isinstance(value, list):
                    raise ValueError("not a JSON array")
            except _OutOfRange as exn:
                bad.append((i, "range", str(exn)))
                value = None
            except ValueError as exn:
                bad.append((i, "type", f"not a JSON array: {exn}"))
                value = None
        if isinstance(value, list) and f.dtype is DType.BYTES:
            value = [v.encode() if isinstance(v, str) else v for v in value]
        parsed.append(value)
    value_t = TEXT_VALUE_TYPES.get(f.dtype)
    list_t = None
    if value_t is not None:
        list_t = pa.list_(pa.list_(value_t) if len(f.shape) == 2 else value_t)
    try:
        return pa.array(parsed, list_t), bad
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        for i, value in enumerate(parsed):
            try:
                pa.array([value], list_t)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exn:
                bad.append((i, "type", f"list values are not {f.dtype.value}: {exn}"))
                parsed[i] = None
        return pa.array(parsed, list_t), bad
