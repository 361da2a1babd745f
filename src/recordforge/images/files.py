"""Reading image files: manifest paths resolved, local files by system calls, remote ones on threads."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np
import pyarrow as pa

from recordforge.arrays import binary_array
from recordforge.files.storage import is_local, join, read_bytes

__all__ = ["IMAGE_EXTENSIONS", "binary", "manifest_dir", "read_all", "read_local_files", "resolve"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp")
_THREADS = 16  # remote reads are I/O: overlap them (an object store answers in tens of milliseconds)
_READ_SIZE = 1 << 16


def resolve(path: str, base_dir: str) -> str:
    """A manifest's relative path is relative to the manifest's folder."""
    if not is_local(path) or path.startswith("/"):
        return path
    return join(base_dir, path) if base_dir else path


def manifest_dir(manifest: str) -> str:
    return posixpath.dirname(manifest) if is_local(manifest) else manifest.rsplit("/", 1)[0]


def _read(path: str) -> bytes:
    if is_local(path):
        data = next(_read_local([path]))
        if isinstance(data, Exception):
            raise data
        return data
    return read_bytes(path)


def read_all(items: list[str | None], base_dir: str, errors: dict[int, str]) -> list[bytes | None]:
    """The bytes of every path (None for a null, or for a file that cannot be read: its reason
    goes to `errors`). Local files in order, remote ones on threads."""
    paths = [None if p is None else resolve(p, base_dir) for p in items]
    loaded: Iterable[bytes | Exception]
    if any(not is_local(p) for p in paths if p is not None):
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

    Bare system calls: opening through Beam's filesystems or open() spends more per file in
    lookups and wrappers than reading a small image takes."""
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
        data: bytes | Exception
        try:
            data = read(fd, _READ_SIZE)
            # A regular file reads short only at its end: a short read needs no second call to
            # see the end (a system call costs more than copying a small image). Were a read
            # ever cut short elsewhere, the end-of-file check rejects the image as truncated.
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
    start, size = 0, 0
    run: list[bytes | None] = []
    for got in _read_local(paths):
        data = got if isinstance(got, bytes) else None
        length = len(data) if data is not None else 0
        if run and size + length > batch_bytes:
            yield start, binary(run)
            start, size, run = start + len(run), 0, []
        run.append(data)
        size += length
    if run:
        yield start, binary(run)


def binary(items: list[bytes | None]) -> pa.Array:
    """A large_binary array of `items` (None: null), built from one join of the bytes."""
    valid = np.fromiter((x is not None for x in items), bool, len(items))
    # All valid: no None in `items`, which is used as it is rather than copied.
    parts = [x if x is not None else b"" for x in items] if not valid.all() else cast("list[bytes]", items)
    lengths = np.fromiter(map(len, parts), np.int64, len(parts))
    return binary_array(np.frombuffer(b"".join(parts), np.uint8), lengths, valid=valid)
