"""Height, width and channels of encoded images, read from their headers (no decoding), so that
stats can show image sizes when the records carry no height/width features of their own."""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["image_sizes"]

# PNG color types: gray, RGB, palette (decoded to RGB), gray + alpha, RGBA.
_PNG_CHANNELS = np.array([1, 0, 3, 3, 2, 0, 4] + [0] * 249, np.int64)
_BMP_CHANNELS = {8: 1, 16: 3, 24: 3, 32: 4}
# JPEG start-of-frame markers (baseline, progressive...); C4, C8 and CC are other segments.
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def _be(blob: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(len(at), np.int64)
    for k in range(width):
        out = (out << 8) | blob[at + k]
    return out


def _le(blob: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros(len(at), np.int64)
    for k in reversed(range(width)):
        out = (out << 8) | blob[at + k]
    return out


def image_sizes(
    fmt: str, blob: np.ndarray, starts: np.ndarray, ends: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(height, width, channels) of the images blob[starts[i]:ends[i]] of one format; images
    whose header is cut short or unusual are left out. `blob` has 32 bytes of padding at least."""
    size = ends - starts
    if fmt == "png":  # IHDR is the first chunk: width, height (big-endian), depth, color type
        ok = (size >= 26) & (_be(blob, starts + 12, 4) == 0x49484452)
        s = starts[ok]
        return _be(blob, s + 20, 4), _be(blob, s + 16, 4), _PNG_CHANNELS[blob[s + 25]]
    if fmt == "gif":  # logical screen: width, height (little-endian); always decoded to RGB
        s = starts[size >= 10]
        return _le(blob, s + 8, 2), _le(blob, s + 6, 2), np.full(len(s), 3, np.int64)
    if fmt == "bmp":  # BITMAPINFOHEADER: width, height (signed: negative is top-down), bpp
        s = starts[size >= 30]
        height = _le(blob, s + 22, 4)
        height = np.abs(np.where(height >= 1 << 31, height - (1 << 32), height))
        bpp = _le(blob, s + 28, 2)
        channels = np.array([_BMP_CHANNELS.get(b, 0) for b in bpp.tolist()], np.int64)
        return height, _le(blob, s + 18, 4), channels
    if fmt == "jpeg":
        found = [_jpeg(blob[a:b].tobytes()) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]
        dims = np.array([d for d in found if d is not None], np.int64).reshape(-1, 3)
        return dims[:, 0], dims[:, 1], dims[:, 2]
    empty = np.zeros(0, np.int64)
    return empty, empty, empty


def _jpeg(raw: bytes) -> tuple[int, int, int] | None:
    """The frame header's height, width and components: segments are walked by their lengths
    (a few per file) up to the first start-of-frame."""
    pos, n = 2, len(raw)
    while pos + 9 < n:
        if raw[pos] != 0xFF:
            return None
        marker = raw[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _SOF:
            height, width, comps = struct.unpack_from(">HHB", raw, pos + 5)
            return height, width, comps
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length
            pos += 2
            continue
        pos += 2 + struct.unpack_from(">H", raw, pos + 2)[0]
    return None
