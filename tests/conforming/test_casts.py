"""casts.py: source values cast to a feature's value type, with their failures."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from recordforge.conforming.casts import cast_values
from recordforge.schemas import schema_from_dict

_NARROW = schema_from_dict({"features": [{"name": "x", "type": "float32", "narrow": True}]}).features[0]
_MAX = float(np.finfo(np.float32).max)
_ROUNDS_DOWN = float(np.nextafter(_MAX, np.inf))  # above FLT_MAX, still rounds to it


@pytest.mark.parametrize(
    "values",
    [
        [1.0, -2.5, None, float("nan"), 0.0],  # in range: ruled out by min and max
        [_MAX, -_MAX, _ROUNDS_DOWN, -_ROUNDS_DOWN],  # at the edge: no overflow
        [1.0, 1e39, None, -1e300, 3.0],  # overflow both ways
        [float("inf"), -float("inf"), 1e39, float("nan")],  # infinities stay, 1e39 fails
        [float("nan"), float("nan")],
        [None, None],
        [],
    ],
)
def test_narrowing_fails_exactly_the_finite_values_float32_cannot_hold(values: list) -> None:
    wide = pa.array(values, pa.float64())
    out, failures = cast_values(wide, _NARROW, "mem")
    as_float32 = np.array([np.nan if v is None else v for v in values], np.float64).astype(np.float32)
    expected = [
        i for i, v in enumerate(values) if v is not None and np.isfinite(v) and not np.isfinite(as_float32[i])
    ]
    got = [int(i) for f in failures for i in f.indices]
    assert got == expected
    assert all(f.rule == "range" for f in failures)
    assert out.type == pa.float32()
    for i, v in enumerate(values):
        if v is None or i in expected:
            assert not out[i].is_valid
        elif np.isnan(v):
            assert np.isnan(out[i].as_py())
        else:
            assert out[i].as_py() == float(np.float32(v))


def test_a_nulls_slot_holding_a_value_beyond_float32_is_no_failure() -> None:
    """A null's slot may hold any value (here 1e300, as a writer may leave it), and the array may
    be a slice: only valid values are judged, at their index in the slice."""
    values = np.array([7.0, 1e300, 2.0, -1e39, 1e300, 5.0], np.float64)
    valid = np.packbits(np.array([1, 0, 1, 1, 0, 1], bool), bitorder="little")
    whole = pa.Array.from_buffers(
        pa.float64(), 6, [pa.py_buffer(valid.tobytes()), pa.py_buffer(values.tobytes())]
    )
    out, failures = cast_values(whole.slice(1), _NARROW, "mem")
    assert [int(i) for f in failures for i in f.indices] == [2]  # -1e39, the slice's third value
    assert out.to_pylist() == [None, 2.0, None, None, 5.0]
