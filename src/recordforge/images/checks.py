"""Whether an encoded PNG or JPEG is whole: its end marker, and a PNG's chunks and image data."""

from __future__ import annotations

import struct
import zlib

import numpy as np
from isal import isal_zlib

from recordforge.images.headers import JPEG, PNG

__all__ = ["complete", "ends_whole", "png_problem"]

_END_MARKERS = {PNG: b"IEND\xaeB`\x82", JPEG: b"\xff\xd9"}


def complete(data: bytes, code: int) -> bool:
    """Cheap end-of-file checks: a truncated PNG lacks its IEND chunk, a JPEG its EOI marker."""
    end = _END_MARKERS.get(code)
    # Padding zeros after the end marker are tolerated; stripping copies, so only when present.
    return (
        end is None or data.endswith(end) or (data.endswith(b"\x00") and data.rstrip(b"\x00").endswith(end))
    )


def ends_whole(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """`complete` for every image of a batch: the end markers are compared with numpy, and only
    an image that ends in a zero byte is looked at alone."""
    whole = np.ones(len(starts), bool)
    for code, marker in _END_MARKERS.items():
        at = np.flatnonzero((codes == code) & (ends - starts >= len(marker)))
        tail = buf[ends[at][:, None] - len(marker) + np.arange(len(marker))]
        whole[codes == code] = False
        whole[at] = (tail == np.frombuffer(marker, np.uint8)).all(axis=1)
        for i in at[~whole[at] & (tail[:, -1] == 0)].tolist():
            whole[i] = complete(buf[starts[i] : ends[i]].tobytes(), code)
    return whole


_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel (a palette index)
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Bytes of scanlines (and of compressed data) up to which a PNG's data is inflated to check it;
# inflating larger ones costs about as much as decoding: their chunk CRCs are checked.
INFLATE_LIMIT = 4096
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def png_problem(data: bytes | memoryview, at: int = 0, inflate_limit: int = INFLATE_LIMIT) -> str | None:
    """Why libpng (tf.io.decode_png) would refuse a PNG that has IHDR and IEND, or None: a wrong
    CRC of a critical chunk; up to `inflate_limit`, image data that is no whole zlib stream or is
    short of the scanlines, or an unknown filter type (unfiltering cannot fail after that). Like
    libpng, it tolerates ancillary chunks' CRCs and data past the scanlines. The PNG starts at
    `at` in `data` and ends with it (a batch's buffer is walked in place, never sliced)."""
    pos, idat, end = at + 8, [], len(data)
    while pos + 12 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        stop = pos + 12 + length
        if stop > end:
            return f"corrupt PNG: chunk {kind!r} runs past the end of the file"
        if not kind[0] & 0x20:  # a critical chunk: libpng refuses it with a wrong CRC
            if isal_zlib.crc32(data[pos + 4 : stop - 4]) != struct.unpack_from(">I", data, stop - 4)[0]:
                return f"corrupt PNG: CRC mismatch in chunk {kind.decode('latin-1')}"
            if kind == b"IDAT":
                idat.append(data[pos + 8 : stop - 4])
            elif kind == b"IEND":
                break
        pos = stop
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, at + 16)
    if depth not in _PNG_DEPTHS.get(colour, ()) or not width or not height:
        return f"corrupt PNG: {width}x{height}, bit depth {depth}, colour type {colour}"
    passes, size = [], 0  # (first byte, stride, rows): a scanline is a filter byte, then pixels
    for x0, y0, dx, dy in _ADAM7 if interlace else ((0, 0, 1, 1),):
        w, h = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if w and h:
            passes.append((size, 1 + (w * depth * _PNG_SAMPLES[colour] + 7) // 8, h))
            size += passes[-1][1] * h
    stream = idat[0] if len(idat) == 1 else b"".join(idat)
    if size > inflate_limit or len(stream) > inflate_limit:
        return None
    try:  # inflating is bounded by the stream's length (at most ~1032x), a few MiB at most here
        pixels = zlib.decompress(stream)
    except zlib.error as exn:
        return f"corrupt PNG image data: {exn}"
    if len(pixels) < size:
        return f"corrupt PNG: the image data ends early ({len(pixels)} of {size} bytes)"
    if any(pixels[at : at + stride * h : stride].translate(None, b"\0\1\2\3\4") for at, stride, h in passes):
        return "corrupt PNG: unknown scanline filter type"
    return None
