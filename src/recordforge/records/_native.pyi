"""Types of recordforge.records._native (_native.c): encoding, decoding, framing, CRC32C over batches."""

from typing import Any

import numpy as np
from typing_extensions import Buffer

# numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
_Bytes = Buffer | np.ndarray[Any, Any]

HARDWARE_CRC: int

def encode_examples(n: int, columns: list[tuple[Any, ...]]) -> tuple[bytearray, bytearray]: ...

# (key starts, key lengths, rec, kind, count, ints, floats, bytes starts, bytes ends, bounds, slow)
def decode_examples(data: _Bytes, starts: _Bytes, ends: _Bytes) -> tuple[bytearray, ...]: ...
def frame_records(offsets: _Bytes, data: _Bytes) -> bytearray: ...
def crc32c(data: _Bytes, hardware: bool = True) -> int: ...
def find_records(data: _Bytes) -> tuple[bytearray, int, bool]: ...
def data_crc_mismatches(data: _Bytes, heads: _Bytes, lengths: _Bytes) -> list[int]: ...
