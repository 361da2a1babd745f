""".npy members to arrays, each distinct header parsed once.

`np.load` parses a member's header (a Python dict literal) with `ast.literal_eval` every time:
most of the time of reading a small member. A shard's members of one feature share one header
(the writer makes one per dtype and shape), so each header's parse (numpy's own, with numpy's
checks) is kept, and the values are a view of the member's bytes. Anything numpy would handle
another way (a Fortran-order or object array, a version-3 header, data shorter than the header
says) goes to `np.load`, which reads it or raises as it always did.
"""

from __future__ import annotations

import io
import math

import numpy as np
import numpy.lib.format as npy_format

__all__ = ["load"]

_MAGIC = b"\x93NUMPY"
# Kept parses: a shard from a stranger can hold any number of distinct headers.
_MOST_KEPT = 512
_kept: dict[bytes, tuple[np.dtype, tuple[int, ...], int] | None] = {}


def load(data: bytes) -> np.ndarray:
    """The array of a .npy member, as `np.load(..., allow_pickle=False)` reads it."""
    header_end = _header_end(data)
    if header_end is not None and header_end <= len(data):
        header = data[:header_end]
        if header in _kept:
            parsed = _kept[header]
        else:
            parsed = _parse(header)
            if len(_kept) >= _MOST_KEPT:
                _kept.clear()
            _kept[header] = parsed
        if parsed is not None:
            dtype, shape, count = parsed
            if len(data) - header_end >= count * dtype.itemsize:
                return np.frombuffer(data, dtype=dtype, count=count, offset=header_end).reshape(shape)
    return np.load(io.BytesIO(data), allow_pickle=False)


def _header_end(data: bytes) -> int | None:
    if data[:6] != _MAGIC or len(data) < 10:
        return None
    if data[6] == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    if data[6] == 2 and len(data) >= 12:
        return 12 + int.from_bytes(data[8:12], "little")
    return None


def _parse(header: bytes) -> tuple[np.dtype, tuple[int, ...], int] | None:
    """(dtype, shape, values) from numpy's own reading of the header; None where this module
    leaves the member to np.load (which then reads it, or raises numpy's error)."""
    f = io.BytesIO(header)
    try:
        major, _ = npy_format.read_magic(f)
        read = npy_format.read_array_header_1_0 if major == 1 else npy_format.read_array_header_2_0
        shape, fortran_order, dtype = read(f)
    except (ValueError, TypeError, SyntaxError):
        return None
    if fortran_order or dtype.hasobject or dtype.itemsize == 0 or f.read(1):
        return None
    return dtype, shape, math.prod(shape)
