"""CRC32C masked as TFRecord framing stores it: of one buffer, of many short rows, of an array of CRCs."""

from __future__ import annotations

import google_crc32c
import numpy as np

__all__ = ["crc32c_rows", "masked_crc32c", "masked_crc32c_array"]

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data: bytes | memoryview) -> int:
    crc = google_crc32c.value(bytes(data)) if isinstance(data, memoryview) else google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def masked_crc32c_array(crcs: np.ndarray) -> np.ndarray:
    crcs = crcs.astype(np.uint64)
    return (
        (((crcs >> np.uint64(15)) | (crcs << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)
    ).astype("<u4")


def _table() -> np.ndarray:
    poly = 0x82F63B78  # CRC-32C (Castagnoli), reflected
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ poly, table >> 1).astype(np.uint32)
    return table


_TABLE = _table()


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a small (n, k) uint8 matrix at once: k table lookups over n rows."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for k in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, k]) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)
