"""Split assignment: a salted, stable hash of a key's canonical bytes, or a column's values."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from recordforge.arrays import binary_parts

__all__ = ["SplitSpec", "assign_by_hash", "assign_by_value", "in_split", "split_index"]


@dataclass(frozen=True)
class SplitSpec:
    names: tuple[str, ...]
    weights: tuple[int, ...]
    key_feature: str | None = None  # None: hash the whole serialized record
    column: str | None = None  # split names come from this source column instead
    salt: str = "recordforge"


def in_split(keyed: tuple[tuple[str, str, int], object], name: str) -> bool:
    """Whether a `((split, file, first_row), records)` element belongs to split `name`."""
    return keyed[0][0] == name


def split_index(keyed: tuple[tuple[str, str, int], object], count: int, names: tuple[str, ...]) -> int:
    """`beam.Partition`'s function: the place in `names` of a `((split, file, first_row),
    records)` element's split; an element of no split named there is a bug, not a row to drop."""
    return names.index(keyed[0][0])


def assign_by_hash(keys: pa.Array, spec: SplitSpec) -> np.ndarray:
    """The split index of each row. The key bytes are a record's (or one feature's) canonical
    tf.train.Example encoding, so the same row lands in the same split on any machine or run."""
    offsets, data = binary_parts(keys)
    raw = data[offsets[0] : offsets[-1]].tobytes()
    rel = (offsets - offsets[0]).tolist()
    salt = spec.salt.encode()[:64]
    total = sum(spec.weights)
    buckets = np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(raw[rel[i] : rel[i + 1]], digest_size=8, key=salt).digest(), "little"
            )
            % total
            for i in range(len(keys))
        ),
        dtype=np.int64,
        count=len(keys),
    )
    bounds = np.cumsum(spec.weights)
    return np.searchsorted(bounds, buckets, side="right")


def assign_by_value(values: list[object], spec: SplitSpec) -> np.ndarray:
    """The split index of each row from its value; -1 where the value names no declared split."""
    index = {name: i for i, name in enumerate(spec.names)}
    return np.array(
        [
            index.get(v.decode() if isinstance(v, bytes) else str(v), -1) if v is not None else -1
            for v in values
        ],
        dtype=np.int64,
    )
