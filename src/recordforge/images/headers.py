"""Format, height, width and channels of encoded images, read from their headers over a whole batch."""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["BMP", "FORMATS", "GIF", "JPEG", "PNG", "WEBP", "header_values", "image_format", "sniff"]

# A format's code is its index here; 0 is "no image format we know".
FORMATS = ("", "png", "jpeg", "gif", "bmp", "webp")
PNG, JPEG, GIF, BMP, WEBP = range(1, 6)
_SIGNATURES = (
    (PNG, b"\x89PNG\r\n\x1a\n"),
    (JPEG, b"\xff\xd8\xff"),
    (GIF, b"GIF8"),
    (BMP, b"BM"),
    (WEBP, b"RIFF"),  # and "WEBP" at byte 8
)
_HEAD = 12  # bytes a signature test looks at
_FIRST_BYTES = np.zeros(256, bool)
_FIRST_BYTES[[sig[0] for _, sig in _SIGNATURES]] = True

# The channels tf.io.decode_image returns, which the converter writes: a PNG's by colour type (a
# palette's are 3, or 4 where a tRNS chunk precedes the image data); 0 where the type is unknown.
_PNG_CHANNELS = np.zeros(256, np.int64)
_PNG_CHANNELS[[0, 2, 3, 4, 6]] = [1, 3, 3, 2, 4]
_PNG_PALETTE = 3
_IHDR = 0x49484452
# A BMP's by bits per pixel; 32 only uncompressed (bit fields may carry alpha), and palettes
# (1, 4, 8 bits) are unknown: their colours decide between grey and RGB.
_BMP_CHANNELS = np.zeros(33, np.int64)
_BMP_CHANNELS[[16, 24, 32]] = 3
# JPEG start-of-frame markers (baseline, progressive...); C4, C8 and CC are other segments.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _gather(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The `width` bytes at each offset of `at` (as int64), reading no byte past the buffer."""
    if not len(buf):
        return np.zeros((len(at), width), np.int64)
    return buf[np.minimum(at[:, None] + np.arange(width), len(buf) - 1)].astype(np.int64)


def _big_endian(raw: np.ndarray) -> np.ndarray:
    out = np.zeros(len(raw), np.int64)
    for k in range(raw.shape[1]):
        out = (out << 8) | raw[:, k]
    return out


def _little_endian(raw: np.ndarray) -> np.ndarray:
    return _big_endian(raw[:, ::-1])


def sniff(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The format code of each of the images buf[starts[i]:ends[i]], from its signature."""
    codes = np.zeros(len(starts), np.int64)
    if not len(starts) or not len(buf):
        return codes
    # Only values whose first byte starts a signature are looked at further: a column of text
    # has few of them, and its values' heads are then never gathered.
    maybe = np.flatnonzero((ends > starts) & _FIRST_BYTES[buf[np.minimum(starts, len(buf) - 1)]])
    size = ends[maybe] - starts[maybe]
    head = _gather(buf, starts[maybe], _HEAD)
    found = np.zeros(len(maybe), np.int64)
    for code, signature in _SIGNATURES:
        sig = np.frombuffer(signature, np.uint8)
        hit = (found == 0) & (size >= len(sig)) & (head[:, : len(sig)] == sig).all(axis=1)
        found[hit] = code
    webp = found == WEBP
    found[webp & ~((size >= _HEAD) & (head[:, 8:12] == np.frombuffer(b"WEBP", np.uint8)).all(axis=1))] = 0
    codes[maybe] = found
    return codes


def image_format(data: bytes) -> str:
    """The format of one encoded image ("" when it is none we know)."""
    raw = np.frombuffer(data[:_HEAD], np.uint8)
    return FORMATS[int(sniff(raw, np.zeros(1, np.int64), np.array([len(data)]))[0])]


def header_values(
    buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(height, width, channels, read) of the images buf[starts[i]:ends[i]] whose format codes are
    `codes`: `read` where the header gave height and width; channels are 0 where the header does
    not tell them. PNG, GIF and BMP headers are read with numpy over the batch; a palette PNG's
    chunks and a JPEG's segments are walked one image at a time (a few steps each)."""
    n = len(starts)
    height, width, channels = (np.zeros(n, np.int64) for _ in range(3))
    read = np.zeros(n, bool)
    size = ends - starts

    png = np.flatnonzero((codes == PNG) & (size >= 33))  # IHDR: width, height, depth, colour type
    ihdr = _gather(buf, starts[png] + 12, 14)
    colour = ihdr[:, 13]
    ok = (_big_endian(ihdr[:, :4]) == _IHDR) & (_PNG_CHANNELS[colour] > 0)
    png, ihdr, colour = png[ok], ihdr[ok], colour[ok]
    width[png], height[png] = _big_endian(ihdr[:, 4:8]), _big_endian(ihdr[:, 8:12])
    channels[png] = _PNG_CHANNELS[colour]
    read[png] = True
    # numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
    view = memoryview(buf)  # type: ignore[arg-type]
    for i in png[colour == _PNG_PALETTE].tolist():
        channels[i] = _palette_channels(view, int(starts[i]), int(ends[i]))

    gif = np.flatnonzero((codes == GIF) & (size >= 10))  # logical screen, little-endian
    screen = _gather(buf, starts[gif] + 6, 4)
    width[gif], height[gif], channels[gif] = _little_endian(screen[:, :2]), _little_endian(screen[:, 2:]), 3
    read[gif] = True

    bmp = np.flatnonzero((codes == BMP) & (size >= 34))  # BITMAPINFOHEADER
    info = _gather(buf, starts[bmp] + 18, 16)
    rows = _little_endian(info[:, 4:8])  # signed: a negative height is a top-down image
    width[bmp], height[bmp] = (
        _little_endian(info[:, :4]),
        np.abs(np.where(rows >= 1 << 31, rows - (1 << 32), rows)),
    )
    bits = np.minimum(_little_endian(info[:, 10:12]), 32)
    uncompressed = _little_endian(info[:, 12:16]) == 0
    channels[bmp] = np.where((bits < 32) | uncompressed, _BMP_CHANNELS[bits], 0)
    read[bmp] = True

    for i in np.flatnonzero(codes == JPEG).tolist():
        frame = _jpeg_frame(view, int(starts[i]), int(ends[i]))
        if frame is not None:
            height[i], width[i], components = frame
            channels[i] = 1 if components == 1 else 3
            read[i] = True
    return height, width, channels, read


def _palette_channels(data: memoryview, at: int, end: int) -> int:
    """4 where a tRNS chunk comes before the image data of the palette PNG at `at`, else 3."""
    pos = at + 8
    while pos + 8 <= end:
        length, kind = struct.unpack_from(">I4s", data, pos)
        if kind == b"tRNS":
            return 4
        if kind in (b"IDAT", b"IEND"):
            break
        pos += 12 + length
    return 3


def _jpeg_frame(data: memoryview, at: int, end: int) -> tuple[int, int, int] | None:
    """(height, width, components) of the first start-of-frame of the JPEG at `at`: segments are
    walked by their lengths; None where the walk meets anything but a marker first."""
    pos = at + 2
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker in _SOF:
            if pos + 10 > end:
                return None
            return struct.unpack_from(">HHB", data, pos + 5)
        pos += 2 + struct.unpack_from(">H", data, pos + 2)[0]
    return None
