"""ops.py: a feature's checks on its conformed values."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from recordforge.conforming.ops import check_values
from recordforge.schemas import schema_from_dict


def test_a_nulls_slot_is_not_checked_against_min_and_max() -> None:
    feature = schema_from_dict({"features": [{"name": "x", "type": "int64", "min": 0, "max": 10}]}).features[
        0
    ]
    values = np.array([5, -4, 11, 99, 3], np.int64)
    valid = np.packbits(np.array([1, 0, 1, 0, 1], bool), bitorder="little")
    arr = pa.Array.from_buffers(
        pa.int64(), 5, [pa.py_buffer(valid.tobytes()), pa.py_buffer(values.tobytes())]
    )
    got = {f.rule: [int(i) for i in f.indices] for f in check_values(arr, feature)}
    assert got == {"max": [2]}
    assert check_values(pa.array([1, None, 2], pa.int64()), feature) == []
