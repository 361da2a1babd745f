"""Images: reading files through Beam's filesystems, header values, optional resize/re-encode.

By default the original encoded bytes are kept (no decode/re-encode); the header gives height,
width, channels (as `tf.io.decode_image` will return them) and format. A PNG is checked as far as
decoding could fail (chunk checksums, the image data inflated and its scanlines' filter types);
a JPEG's header and end marker are, so that a truncated one is rejected rather than written.
"""

from __future__ import annotations

import io
import os
import posixpath
import struct
import zlib
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from isal import isal_zlib

from recordforge.arrays import binary_array, binary_parts

__all__ = [
    "ImageColumn",
    "ImageOptions",
    "ImageResult",
    "load_image_column",
    "manifest_dir",
    "process_image",
    "read_local_files",
    "resolve",
]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
_THREADS = 16  # remote reads are I/O: overlap them (GCS latency is tens of milliseconds)


@dataclass(frozen=True)
class ImageOptions:
    resize: tuple[int, int] | None = None
    method: str | None = None
    encode: str | None = None  # None: the original bytes
    quality: int | None = None
    channels: int | None = None


class ImageResult(NamedTuple):  # a tuple: made once per image, at a third of a dataclass's cost
    data: bytes
    height: int
    width: int
    channels: int
    format: str


def resolve(path: str, base_dir: str) -> str:
    """A manifest's relative path is relative to the manifest's folder."""
    if "://" in path or path.startswith("/"):
        return path
    return FileSystems.join(base_dir, path) if base_dir else path


def manifest_dir(manifest: str) -> str:
    return posixpath.dirname(manifest) if "://" not in manifest else manifest.rsplit("/", 1)[0]


_READ_SIZE = 1 << 16


def _read(path: str) -> bytes:
    if "://" not in path:
        data = next(_read_local([path]))
        if isinstance(data, Exception):
            raise data
        return data
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def _channels(fmt: str, mode: str, info: dict) -> int:
    """Channels of tf.io.decode_image's result for this file."""
    if fmt == "JPEG":
        return 1 if mode == "L" else 3
    if fmt == "GIF":
        return 3
    if mode in ("1", "L", "I", "I;16", "I;16B", "F"):
        return 1
    if mode == "LA":
        return 2
    if mode == "P":
        return 4 if "transparency" in info else 3
    if mode in ("RGBA", "CMYK"):
        return 4
    return 3


_END_MARKERS = {"PNG": b"IEND\xaeB`\x82", "JPEG": b"\xff\xd9"}


def _complete(data: bytes, fmt: str) -> bool:
    """Cheap end-of-file checks: a truncated PNG lacks its IEND chunk, a JPEG its EOI marker."""
    end = _END_MARKERS.get(fmt)
    # Padding zeros after the end marker are tolerated; stripping copies, so only when present.
    return (
        end is None or data.endswith(end) or (data.endswith(b"\x00") and data.rstrip(b"\x00").endswith(end))
    )


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # color type -> channels (3, palette, decided below)


def _png_header(data: bytes) -> ImageResult | None:
    """Width, height and channels from IHDR (and tRNS for palettes), without Pillow."""
    if not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR" or len(data) < 33:
        return None
    width, height = struct.unpack_from(">II", data, 16)
    color_type = data[25]
    if color_type == 3:
        pos, channels = 8, 3
        while pos + 8 <= len(data):  # chunks before the image data: is there a tRNS?
            length = struct.unpack(">I", data[pos : pos + 4])[0]
            kind = data[pos + 4 : pos + 8]
            if kind == b"tRNS":
                channels = 4
            if kind in (b"IDAT", b"IEND"):
                break
            pos += 12 + length
    elif color_type in _PNG_CHANNELS:
        channels = _PNG_CHANNELS[color_type]
    else:
        return None
    return ImageResult(data, height, width, channels, "png")


_PNG_SAMPLES = {**_PNG_CHANNELS, 3: 1}  # colour type -> samples per pixel (a palette index)
_PNG_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
# Bytes of scanlines (and of compressed data) up to which a PNG's data is inflated to check it (a
# few us); inflating larger ones costs about as much as decoding: their chunk CRCs are checked.
_INFLATE_LIMIT = 4096
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _png_problem(data: bytes | memoryview, at: int = 0, inflate_limit: int = _INFLATE_LIMIT) -> str | None:
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


def _jpeg_header(data: bytes) -> ImageResult | None:
    """Height, width and components from the first SOF marker, without Pillow."""
    if not data.startswith(b"\xff\xd8"):
        return None
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        length = struct.unpack(">H", data[pos + 2 : pos + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if pos + 10 > len(data):
                return None
            height, width = struct.unpack(">HH", data[pos + 5 : pos + 9])
            components = data[pos + 9]
            return ImageResult(data, height, width, 1 if components == 1 else 3, "jpeg")
        pos += 2 + length
    return None


def process_image(data: bytes, opts: ImageOptions) -> ImageResult:
    """Header values and the bytes to write; raises ValueError for anything not a whole image."""
    if not data:
        raise ValueError("empty file")
    if opts.encode is None:
        # The common case, original bytes kept: PNG and JPEG headers are read directly (a few
        # microseconds); the end-of-file check still catches truncation.
        fast = _png_header(data) or _jpeg_header(data)
        if fast is not None:
            if not _complete(data, fast.format.upper()):
                raise ValueError(f"truncated {fast.format.upper()} file")
            problem = _png_problem(data) if fast.format == "png" else None
            if problem is not None:
                raise ValueError(problem)
            return fast
    from PIL import Image  # only off the fast path: importing it is not free per image

    try:
        im = Image.open(io.BytesIO(data))
        fmt = im.format or "UNKNOWN"
        if not _complete(data, fmt):
            raise ValueError(f"truncated {fmt} file")
        if fmt not in ("PNG", "JPEG"):
            im.load()  # other formats: decode fully to catch truncation
        if opts.encode is None:
            return ImageResult(data, im.height, im.width, _channels(fmt, im.mode, im.info), fmt.lower())
        im.load()
        mode = {1: "L", 3: "RGB", 4: "RGBA"}.get(opts.channels or 0)
        if mode is None:
            mode = (
                "L"
                if im.mode in ("1", "L", "I", "I;16", "F")
                else ("RGBA" if "A" in im.mode or "transparency" in im.info else "RGB")
            )
        im = im.convert(mode)
        if opts.resize:
            h, w = opts.resize
            method = getattr(Image.Resampling, (opts.method or "bilinear").upper())
            im = im.resize((w, h), method)
        channels = len(im.getbands())
        if opts.encode == "raw":
            pixels = np.asarray(im, dtype=np.uint8)
            return ImageResult(pixels.tobytes(), im.height, im.width, channels, "raw")
        out = io.BytesIO()
        if opts.encode == "jpeg":
            im.save(out, format="JPEG", quality=opts.quality or 95)
        else:
            im.save(out, format="PNG")
        return ImageResult(out.getvalue(), im.height, im.width, channels, opts.encode)
    except ValueError:
        raise
    except Exception as exn:  # PIL.UnidentifiedImageError, OSError for truncated data, ...
        raise ValueError(f"not a readable image: {exn}") from exn


@dataclass(frozen=True)
class ImageColumn:
    """A column of images, loaded: one entry per row; `present` marks the rows that hold an image
    (the others are nulls, or errors with their reason)."""

    data: pa.Array  # large_binary: the bytes to write; null where there is no image
    height: np.ndarray  # int64; 0 where there is no image (so are width and channels)
    width: np.ndarray
    channels: np.ndarray
    format: pa.Array  # large_binary ("png", "jpeg", ...); null where there is no image
    present: np.ndarray  # bool
    errors: dict[int, str]  # row -> why it holds no image (unreadable, not an image, truncated)


def load_image_column(
    col: pa.Array, base_dir: str, opts: ImageOptions, *, read: pa.Array | None = None
) -> ImageColumn:
    """Every image of a column of paths (relative ones against `base_dir`) or of encoded bytes,
    with its header values. `read`: the bytes of a column of paths, already read by the source
    (null where it could not read a file: that file is tried again here, for the reason).

    Batch-wise where it counts: local files are read in one tight loop, their bytes gathered into
    one Arrow buffer, and the headers of whole non-palette PNGs read with numpy over the batch,
    then only their data checked one by one. Every other image (JPEG, palette PNG, any other
    format, or all when re-encoding) goes through `process_image`; the results are the same.
    """
    n = len(col)
    valid = _valid(col)
    errors: dict[int, str] = {}
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        encoded = col.cast(pa.large_binary())
    elif read is None:
        encoded = _binary(_read_all(col.to_pylist(), base_dir, errors))
    else:
        encoded = read.cast(pa.large_binary())
        again = np.flatnonzero(valid & ~_valid(read)).tolist()
        if again:
            paths = col.to_pylist()
            parts = encoded.to_pylist()
            retried: dict[int, str] = {}
            for i, data in zip(again, _read_all([paths[i] for i in again], base_dir, retried), strict=True):
                parts[i] = data
            errors = {again[j]: reason for j, reason in retried.items()}
            encoded = _binary(parts)
    valid[list(errors)] = False
    offsets, buf = binary_parts(encoded)
    height, width, channels = (np.zeros(n, np.int64) for _ in range(3))
    formats = {"png": 0}  # format -> its index in `fmt`
    fmt = np.zeros(n, np.int64)
    fast = valid & _whole_pngs(offsets, buf) if opts.encode is None else np.zeros(n, bool)
    view, starts = memoryview(buf), offsets.tolist()
    for i in np.flatnonzero(fast).tolist():
        problem = _png_problem(view[: starts[i + 1]], starts[i])
        if problem is not None:
            errors[i] = problem
            fast[i] = valid[i] = False
    height[fast], width[fast], channels[fast] = _png_values(offsets[:-1][fast], buf)
    replaced: dict[int, bytes] = {}
    for i in np.flatnonzero(valid & ~fast).tolist():
        try:
            r = process_image(buf[offsets[i] : offsets[i + 1]].tobytes(), opts)
        except ValueError as exn:
            errors[i] = str(exn)
            continue
        height[i], width[i], channels[i] = r.height, r.width, r.channels
        fmt[i] = formats.setdefault(r.format, len(formats))
        if opts.encode is not None:
            replaced[i] = r.data
    present = valid.copy()
    present[list(errors)] = False
    if replaced or not present.all():
        encoded = _rebuild(encoded, replaced, present)
    return ImageColumn(
        data=encoded,
        height=height,
        width=width,
        channels=channels,
        format=pa.array([f.encode() for f in formats], pa.large_binary()).take(pa.array(fmt, mask=~present)),
        present=present,
        errors=errors,
    )


def _valid(col: pa.Array) -> np.ndarray:
    """A writable bool per element: not null."""
    if not col.null_count:
        return np.ones(len(col), bool)
    return np.array(col.is_valid().to_numpy(zero_copy_only=False), bool)


def _read_all(items: list[str | None], base_dir: str, errors: dict[int, str]) -> list[bytes | None]:
    """The bytes of every path (None for a null, or for a file that cannot be read: its reason
    goes to `errors`). Local files in order, remote ones on threads."""
    paths = [None if p is None else resolve(p, base_dir) for p in items]
    if any("://" in p for p in paths if p is not None):
        with ThreadPoolExecutor(max_workers=min(_THREADS, len(paths))) as pool:
            loaded = list(pool.map(_read_or_error, paths))
    else:
        loaded = _read_local(paths)
    out: list[bytes | None] = []
    for i, data in enumerate(loaded):
        if isinstance(data, bytes):
            out.append(data if items[i] is not None else None)
        else:
            errors[i] = f"cannot read {items[i]!r}: {data}"
            out.append(None)
    return out


def _read_or_error(path: str | None) -> bytes | Exception:
    if path is None:
        return b""
    try:
        return _read(path)
    except Exception as exn:
        return exn


def _read_local(paths: Iterable[str | None]) -> Iterator[bytes | Exception]:
    """The bytes of local files, or the exception that reading one raised (b"" for a None).

    Bare system calls: FileSystems.open costs ~25 us a file in lookups and wrappers, open() ~11
    us, this loop ~3 us, more than reading a small PNG takes."""
    open_, read, close = os.open, os.read, os.close
    flags = os.O_RDONLY | os.O_CLOEXEC
    for path in paths:
        if path is None:
            yield b""
            continue
        try:
            fd = open_(path, flags)
        except (OSError, ValueError) as exn:  # ValueError: a NUL in the path
            dangling = isinstance(exn, FileNotFoundError) and os.path.islink(path)
            yield FileNotFoundError(f"a dangling symbolic link to {os.readlink(path)!r}") if dangling else exn
            continue
        try:
            data = read(fd, _READ_SIZE)
            # A regular file reads short only at its end: a short read needs no second call to
            # see the end (a call costs ~2 us here, more than copying a small image). Were a
            # read ever cut short elsewhere, the end-of-file check rejects the image as truncated.
            if len(data) == _READ_SIZE:
                chunks = [data]
                while chunk := read(fd, _READ_SIZE):
                    chunks.append(chunk)
                data = b"".join(chunks)
        except OSError as exn:  # a folder, an I/O error
            data = exn
        finally:
            close(fd)
        yield data


def read_local_files(paths: list[str], batch_bytes: int) -> Iterator[tuple[int, pa.Array]]:
    """(first, bytes) for consecutive runs of `paths` (local files) of at most `batch_bytes` of
    data each (a bigger file alone): the bytes of each file, null where it cannot be read. The
    files are read once, in order, and the runs cut as they are read, so that nothing but the
    reading itself is spent on sizes."""
    start, size, run = 0, 0, []
    for data in _read_local(paths):
        if not isinstance(data, bytes):
            data = None
        length = len(data) if data is not None else 0
        if run and size + length > batch_bytes:
            yield start, _binary(run)
            start, size, run = start + len(run), 0, []
        run.append(data)
        size += length
    if run:
        yield start, _binary(run)


def _binary(items: list[bytes | None]) -> pa.Array:
    """A large_binary array of `items` (None: null), built from one join of the bytes."""
    valid = np.fromiter((x is not None for x in items), bool, len(items))
    items = [x if x is not None else b"" for x in items] if not valid.all() else items
    lengths = np.fromiter(map(len, items), np.int64, len(items))
    return binary_array(np.frombuffer(b"".join(items), np.uint8), lengths, valid=valid)


_PNG_START = np.frombuffer(_PNG_SIGNATURE + b"\0\0\0\0IHDR", np.uint8)  # the length is not checked
_PNG_START_CHECKED = np.array([i for i in range(16) if not 8 <= i < 12])
_PNG_END = np.frombuffer(_END_MARKERS["PNG"], np.uint8)
_PNG_FAST_TYPES = np.zeros(256, bool)
_PNG_FAST_TYPES[list(_PNG_CHANNELS)] = True
_PNG_CHANNELS_BY_TYPE = np.zeros(256, np.int64)
_PNG_CHANNELS_BY_TYPE[list(_PNG_CHANNELS)] = list(_PNG_CHANNELS.values())


def _whole_pngs(offsets: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """Which elements `_png_header` reads without a chunk walk (colour types other than palette)
    and `_complete` finds ending in IEND: the same tests, on every element at once."""
    starts, ends = offsets[:-1], offsets[1:]
    ok = ends - starts >= 33
    at = starts[ok]
    head = buf[at[:, None] + _PNG_START_CHECKED]
    tail = buf[ends[ok][:, None] - len(_PNG_END) + np.arange(len(_PNG_END))]
    ok[ok] = (
        (head == _PNG_START[_PNG_START_CHECKED]).all(axis=1)
        & (tail == _PNG_END).all(axis=1)
        & _PNG_FAST_TYPES[buf[at + 25]]
    )
    return ok


def _png_values(starts: np.ndarray, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(height, width, channels) from the IHDR chunks at `starts`: big-endian uint32s at 20 and 16,
    the colour type at 25."""

    def be32(at: np.ndarray) -> np.ndarray:
        b = buf[at[:, None] + np.arange(4)].astype(np.int64)
        return (b[:, 0] << 24) | (b[:, 1] << 16) | (b[:, 2] << 8) | b[:, 3]

    return be32(starts + 20), be32(starts + 16), _PNG_CHANNELS_BY_TYPE[buf[starts + 25]]


def _rebuild(encoded: pa.Array, replaced: dict[int, bytes], present: np.ndarray) -> pa.Array:
    """`encoded` with re-encoded rows swapped in and rows without an image made null."""
    offsets, buf = binary_parts(encoded)
    if not replaced:  # only nulls to add: the same bytes, a new validity
        lengths = np.where(present, np.diff(offsets), 0)
        keep = np.repeat(present, np.diff(offsets))
        return binary_array(buf[offsets[0] : offsets[-1]][keep], lengths, valid=present)
    return _binary(
        [
            replaced.get(i, buf[offsets[i] : offsets[i + 1]].tobytes()) if present[i] else None
            for i in range(len(present))
        ]
    )
