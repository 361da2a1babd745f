"""Masked CRC32C: one buffer, many rows at once and an array of CRCs agree with google-crc32c."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest

from recordforge.records.crc32c import crc32c_rows, masked_crc32c, masked_crc32c_array


def _mask(crc: int) -> int:
    """The TFRecord mask, as tensorflow/core/lib/hash/crc32c.h writes it."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


@pytest.mark.parametrize("data", [b"", b"\0", b"123456789", bytes(range(256)), b"\xff" * 8])
def test_masked_crc32c_of_one_buffer(data: bytes) -> None:
    assert masked_crc32c(data) == _mask(google_crc32c.value(data))
    assert masked_crc32c(memoryview(data)) == masked_crc32c(data)


def test_rows_and_arrays_agree_with_one_buffer_at_a_time() -> None:
    rows = np.random.default_rng(0).integers(0, 256, (50, 8), dtype=np.uint8)
    rows[0] = 0
    want = [google_crc32c.value(r.tobytes()) for r in rows]
    assert crc32c_rows(rows).tolist() == want
    masked = masked_crc32c_array(np.array(want, np.uint64))
    assert masked.dtype == np.dtype("<u4")
    assert masked.tolist() == [masked_crc32c(r.tobytes()) for r in rows]
