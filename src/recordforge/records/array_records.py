"""The ArrayRecord container: the options RecordForge writes and reads it with, and local copies of
shards on object stores (the `array_record` library reads and writes local files only)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from recordforge.errors import CorruptFile, RecordForgeError
from recordforge.files.storage import is_local, open_read, open_write

__all__ = [
    "ARRAY_RECORD",
    "COMPRESSIONS",
    "READ_OPTIONS",
    "SIGNATURE",
    "batches",
    "cached_copy",
    "local_copy",
    "open_reader",
    "open_writer",
    "read_or_refuse",
    "reading",
    "upload",
    "writer_options",
]

ARRAY_RECORD = "array_record"  # the output format's name, TFDS's name for it, and how tools read it
# Riegeli's file signature: every ArrayRecord file starts with it.
SIGNATURE = b"\x83\xaf\x70\xd1\x0d\x88\x4a\x3f"
# What --compression means for ArrayRecord shards: riegeli compresses each chunk itself.
COMPRESSIONS = {"none": "uncompressed", "zstd": "zstd:3"}
# Random access: no read-ahead and no thread pool, so that reading one record reads one chunk
# (the settings array_record's own documentation gives for random access).
READ_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"
_SEQUENTIAL = "readahead_buffer_size:4M,max_parallelism:0"
_BATCH = 1024  # records per sequential read
_COPY_CHUNK = 8 << 20


def reading(meta: dict[str, Any]) -> str:
    """How a bundle's shards are read, from its metadata.json: "array_record", "webdataset", or
    the TFRecord compression (what the tools' readers take)."""
    if meta.get("format") in (ARRAY_RECORD, "webdataset"):
        return str(meta["format"])
    return str(meta["compression"])


def writer_options(compression: str) -> str:
    """One record per chunk (group_size:1), so that any record is read by decoding its own chunk
    alone, as TFDS and Grain expect; one thread, as a Beam worker is one process of many."""
    return f"group_size:1,{COMPRESSIONS[compression]},max_parallelism:1"


def _module() -> Any:
    try:
        from array_record.python import array_record_module
    except ImportError as exn:
        raise RecordForgeError(
            "ArrayRecord needs the array-record package: pip install 'array-record==0.8.6'"
        ) from exn
    return array_record_module


def open_writer(local_path: str, options: str) -> Any:
    writer = _module().ArrayRecordWriter(local_path, options)
    if not writer.ok():
        raise OSError(f"{local_path}: cannot be opened for writing as an ArrayRecord file")
    return writer


def open_reader(local_path: str, options: str = READ_OPTIONS) -> Any:
    with open(local_path, "rb") as f:
        head = f.read(len(SIGNATURE))
    if head != SIGNATURE:
        raise CorruptFile(local_path, "not an ArrayRecord file (no riegeli signature)")
    reader = read_or_refuse(local_path, "its index", _module().ArrayRecordReader, local_path, options)
    if not reader.ok():
        raise CorruptFile(local_path, "cannot be read as an ArrayRecord file")
    return reader


def upload(local_path: str, path: str, on_raw: Callable[[bytes], None]) -> None:
    """Copies a local file to `path` (any filesystem), every byte through `on_raw` (to hash)."""
    with open(local_path, "rb") as src, open_write(path) as dst:
        while data := src.read(_COPY_CHUNK):
            on_raw(data)
            dst.write(data)


@contextlib.contextmanager
def local_copy(path: str, on_raw: Callable[[bytes], None] | None = None) -> Iterator[str]:
    """A local path holding the file's bytes: the file itself where it is local (read through
    `on_raw` when given), else a temporary copy, deleted on exit."""
    if is_local(path):
        if on_raw is not None:
            with open(path, "rb") as f:
                while data := f.read(_COPY_CHUNK):
                    on_raw(data)
        yield path
        return
    fd, local = tempfile.mkstemp(suffix=".array_record")
    try:
        with os.fdopen(fd, "wb") as dst, open_read(path) as src:
            while data := src.read(_COPY_CHUNK):
                if on_raw is not None:
                    on_raw(data)
                dst.write(data)
        yield local
    finally:
        with contextlib.suppress(OSError):
            os.unlink(local)


def cached_copy(path: str, cache_dir: str) -> str:
    """A local copy of a remote shard in `cache_dir`, made once (written beside, then renamed, so
    that processes sharing the folder never read a partial copy); a local path as it is."""
    if is_local(path):
        return path
    local = os.path.join(cache_dir, path.split("://", 1)[-1].replace("/", "_"))
    if not os.path.exists(local):
        os.makedirs(cache_dir, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as dst, open_read(path) as src:
                shutil.copyfileobj(src, dst, _COPY_CHUNK)
            os.replace(tmp, local)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return local


def batches(local_path: str, start: int = 0, stop: int | None = None) -> Iterator[list[bytes]]:
    """The records [start, stop) of a local ArrayRecord file, in order, a batch at a time.
    Raises CorruptFile naming the first record whose chunk riegeli refuses, after the records
    before it."""
    reader = open_reader(local_path, _SEQUENTIAL)
    try:
        end = reader.num_records() if stop is None else stop
        for at in range(start, end, _BATCH):
            last = min(end, at + _BATCH)
            try:
                batch = read_or_refuse(local_path, f"records at index {at}-{last - 1}", reader.read, at, last)
            except CorruptFile:
                # Record by record, to name the first one refused.
                for i in range(at, last):
                    yield [read_or_refuse(local_path, f"record at index {i}", reader.read, i, i + 1)[0]]
                raise
            yield batch
    finally:
        reader.close()


def read_or_refuse(local_path: str, what: str, read: Callable[..., Any], *args: Any) -> Any:
    """`read(*args)`, riegeli's errors for a damaged file (RuntimeError "Corrupted Riegeli...",
    ValueError) raised as CorruptFile naming the file and `what` was read."""
    try:
        return read(*args)
    except (RuntimeError, ValueError) as exn:
        text = " ".join(str(exn).split()) or type(exn).__name__
        raise CorruptFile(local_path, f"{what} cannot be read ({text})") from exn
