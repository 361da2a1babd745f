"""Images as the converter writes them: header values, whole-image checks, optional resize/re-encode."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from recordforge.arrays import binary_array, binary_parts
from recordforge.images.checks import complete, ends_whole, png_problem
from recordforge.images.files import binary, read_all
from recordforge.images.headers import FORMATS, JPEG, PNG, header_values, sniff

__all__ = ["ImageColumn", "ImageOptions", "ImageResult", "load_image_column", "process_image"]


@dataclass(frozen=True)
class ImageOptions:
    resize: tuple[int, int] | None = None
    method: str | None = None
    encode: str | None = None  # None: the original bytes
    quality: int | None = None
    channels: int | None = None


class ImageResult(NamedTuple):  # a tuple: made once per image, and cheaper to make than a dataclass
    data: bytes
    height: int
    width: int
    channels: int
    format: str


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


_PILLOW_CODES = {"PNG": PNG, "JPEG": JPEG}  # formats whose end marker is checked


def process_image(data: bytes, opts: ImageOptions) -> ImageResult:
    """Header values and the bytes to write; raises ValueError for anything not a whole image."""
    if not data:
        raise ValueError("empty file")
    if opts.encode is None:
        # The common case, original bytes kept: PNG and JPEG headers are read directly; the
        # end-of-file check still catches truncation.
        buf, starts, ends = np.frombuffer(data, np.uint8), np.zeros(1, np.int64), np.array([len(data)])
        codes = sniff(buf, starts, ends)
        height, width, channels, read = header_values(buf, starts, ends, codes)
        code = int(codes[0])
        if read[0] and code in (PNG, JPEG):
            problem = _whole_problem(buf, starts, ends, codes)
            if problem is not None:
                raise ValueError(problem)
            return ImageResult(data, int(height[0]), int(width[0]), int(channels[0]), FORMATS[code])
    return _with_pillow(data, opts)


def _whole_problem(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, codes: np.ndarray) -> str | None:
    """Why the one PNG or JPEG buf[starts[0]:ends[0]], its header read, is not whole, or None."""
    if not ends_whole(buf, starts, ends, codes)[0]:
        return f"truncated {FORMATS[int(codes[0])].upper()} file"
    # numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
    view = memoryview(buf)  # type: ignore[arg-type]
    return png_problem(view[: int(ends[0])], int(starts[0])) if codes[0] == PNG else None


def _with_pillow(data: bytes, opts: ImageOptions) -> ImageResult:
    """Any format Pillow reads, decoded (fully where the header cannot show truncation), and
    re-encoded as `opts` asks."""
    from PIL import Image  # only off the fast path: importing it is not free per image

    try:
        im: Image.Image = Image.open(io.BytesIO(data))
        fmt = im.format or "UNKNOWN"
        if not complete(data, _PILLOW_CODES.get(fmt, 0)):
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
    one Arrow buffer, and the signatures, headers and end markers of the whole batch read with
    numpy, then only each PNG's data checked one by one. Every other image (any format but PNG
    and JPEG, or all when re-encoding) goes through Pillow; the results are those of
    `process_image`.
    """
    valid = _valid(col)
    errors: dict[int, str] = {}
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        encoded = col.cast(pa.large_binary())
    elif read is None:
        encoded = binary(read_all(col.to_pylist(), base_dir, errors))
    else:
        encoded = read.cast(pa.large_binary())
        again = np.flatnonzero(valid & ~_valid(read)).tolist()
        if again:
            paths = col.to_pylist()
            parts = encoded.to_pylist()
            retried: dict[int, str] = {}
            for i, data in zip(again, read_all([paths[i] for i in again], base_dir, retried), strict=True):
                parts[i] = data
            errors = {again[j]: reason for j, reason in retried.items()}
            encoded = binary(parts)
    valid[list(errors)] = False
    offsets, buf = binary_parts(encoded)
    starts, ends = offsets[:-1], offsets[1:]
    codes = sniff(buf, starts, ends)
    height, width, channels, header = header_values(buf, starts, ends, codes)
    fast = valid & header & ((codes == PNG) | (codes == JPEG))
    if opts.encode is not None:
        fast[:] = False
    whole = ends_whole(buf, starts, ends, codes)
    # numpy declares ndarray.__buffer__ only for Python 3.12+, though arrays export buffers on 3.11.
    view = memoryview(buf)  # type: ignore[arg-type]
    begin, stop = starts.tolist(), ends.tolist()
    for i in np.flatnonzero(fast & ~whole).tolist():
        errors[i] = f"truncated {FORMATS[codes[i]].upper()} file"
    for i in np.flatnonzero(fast & whole & (codes == PNG)).tolist():
        problem = png_problem(view[: stop[i]], begin[i])
        if problem is not None:
            errors[i] = problem
    formats = {name: k for k, name in enumerate(FORMATS)}  # format -> its index in `fmt`
    fmt = codes.copy()
    replaced: dict[int, bytes] = {}
    for i in np.flatnonzero(valid & ~fast).tolist():
        try:
            if begin[i] == stop[i]:
                raise ValueError("empty file")
            r = _with_pillow(buf[begin[i] : stop[i]].tobytes(), opts)
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
        height=np.where(present, height, 0),
        width=np.where(present, width, 0),
        channels=np.where(present, channels, 0),
        format=pa.array([f.encode() for f in formats], pa.large_binary()).take(pa.array(fmt, mask=~present)),
        present=present,
        errors=errors,
    )


def _valid(col: pa.Array) -> np.ndarray:
    """A writable bool per element: not null."""
    if not col.null_count:
        return np.ones(len(col), bool)
    return np.array(col.is_valid().to_numpy(zero_copy_only=False), bool)


def _rebuild(encoded: pa.Array, replaced: dict[int, bytes], present: np.ndarray) -> pa.Array:
    """`encoded` with re-encoded rows swapped in and rows without an image made null."""
    offsets, buf = binary_parts(encoded)
    if not replaced:  # only nulls to add: the same bytes, a new validity
        lengths = np.where(present, np.diff(offsets), 0)
        keep = np.repeat(present, np.diff(offsets))
        return binary_array(buf[offsets[0] : offsets[-1]][keep], lengths, valid=present)
    return binary(
        [
            replaced.get(i, buf[offsets[i] : offsets[i + 1]].tobytes()) if present[i] else None
            for i in range(len(present))
        ]
    )
