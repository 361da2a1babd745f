"""Arrow helpers the encoder, readers and writers share: binary and list arrays as numpy, and back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["binary_array", "binary_parts", "drop_hidden_values", "list_offsets"]


def binary_array(
    data: np.ndarray, lengths: np.ndarray, *, valid: np.ndarray | None = None
) -> pa.LargeBinaryArray:
    """Wraps contiguous bytes and per-element lengths as a large_binary array (no copy of data);
    `valid` (bool per element) marks nulls."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    validity = None
    if valid is not None and not valid.all():
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.large_binary(), len(lengths), [validity, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def binary_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of a binary/large_binary array, as numpy, honouring the array's slice."""
    width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=width)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return offsets.astype(np.int64), data


def list_offsets(arr: pa.Array) -> np.ndarray:
    """The int64 offsets of a large_list array, as numpy, honouring the array's slice."""
    return np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + len(arr) + 1]


def drop_hidden_values(lists: pa.Array) -> pa.Array:
    """A large_list array whose null rows span no values. Arrow lets a null list's slot cover
    any run of values (Parquet's reader leaves it empty; `ListArray.from_arrays(..., mask=)`, a
    cast from a fixed_size_list and other producers do not): values that belong to no row, and
    must be neither checked nor written. Returns `lists` itself when no null row spans values."""
    if not lists.null_count:
        return lists
    offsets = list_offsets(lists)
    counts = np.diff(offsets)
    valid = pc.is_valid(lists).to_numpy(zero_copy_only=False)
    if not counts[~valid].any():
        return lists
    start = int(offsets[0])
    values = lists.values.slice(start, int(offsets[-1]) - start)
    kept = np.where(valid, counts, 0)
    compact = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(kept, out=compact[1:])
    return pa.LargeListArray.from_arrays(
        pa.array(compact), values.filter(pa.array(np.repeat(valid, counts))), mask=pa.array(~valid)
    )
