"""What every source shares: `SourceBatch`, the files it lists, its tagged outputs, reading ahead."""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import apache_beam as beam
import pyarrow as pa

from recordforge.errors import SourceError
from recordforge.storage import is_local, match
from recordforge.transforms.coders import SourceBatchCoder

__all__ = [
    "expand_patterns",
    "FileInfo",
    "read_ahead",
    "REJECTED",
    "SourceBatch",
    "UNREADABLE",
    "unreadable",
]

UNREADABLE = "unreadable"  # tagged output: JSON {"file", "error"} per file that could not be read
REJECTED = "rejected"  # tagged output: JSON lines of rows the source itself could not parse

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceBatch:
    """A record batch and where it came from, so that a bad row can be named."""

    file: str
    first_row: int  # 0-based index of batch's first row within the file
    batch: pa.RecordBatch
    text_lists: bool = False  # list features arrive as JSON text (CSV cells)
    # Image bytes the source has already read, by the name of the column of their paths (null
    # where it could not read a file); rejected rows still show the path (image_folder.py).
    read: dict[str, pa.Array] = field(default_factory=dict)


beam.coders.registry.register_coder(SourceBatch, SourceBatchCoder)


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int | None  # None: not listed (a local folder of images)
    modified: float = 0.0  # seconds since the epoch, as the filesystem reports it
    digest: str = ""  # of the names, for an input that is a folder of files


def expand_patterns(patterns: Iterable[str]) -> list[FileInfo]:
    """Expands every pattern now, at construction; one that matches nothing is an error."""
    out: dict[str, FileInfo] = {}
    for given in patterns:
        pattern = given
        if is_local(pattern):
            # Beam's LocalFileSystem globs within the pattern's directory part, so a pattern
            # without one (`part-*.parquet`) matched nothing; absolute paths also keep names in
            # errors and metadata the same whatever folder the job is started from.
            pattern = os.path.abspath(pattern)
        try:
            result = match(pattern)
        except Exception as exn:
            raise SourceError(f"cannot list input pattern {given!r}: {exn}") from exn
        files = [m for m in result if not m.path.endswith("/")]
        if not files:
            raise SourceError(f"input pattern {given!r} matched no files")
        for m in sorted(files, key=lambda m: m.path):
            out.setdefault(m.path, FileInfo(m.path, m.size, m.modified))
    return list(out.values())


def unreadable(path: str, error: str, **extra: object) -> beam.pvalue.TaggedOutput:
    """A tagged output naming a file (or part of one) that could not be read, and why."""
    _LOGGER.warning("skipping unreadable input %s: %s", path, error)
    return beam.pvalue.TaggedOutput(UNREADABLE, json.dumps({"file": path, "error": error, **extra}))


_T = TypeVar("_T")
_END = object()


def read_ahead(items: Iterator[_T], depth: int = 2) -> Iterator[_T]:
    """`items`, produced on a thread of their own up to `depth` ahead of the consumer. An exception
    in the producer is raised here, after the items produced before it; a consumer that stops
    early stops the producer (and closes `items`) before this generator ends."""
    ahead: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        ahead.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            ahead.put((_END, None))
        except BaseException as exn:  # handed to the consumer, which raises it
            ahead.put((_END, exn))
        finally:
            if stop.is_set() and hasattr(items, "close"):
                items.close()

    thread = threading.Thread(target=produce, name="recordforge-read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            item, exn = ahead.get()
            if exn is not None:
                raise exn
            if item is _END:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():  # let a producer blocked on a full queue see `stop`
            try:
                ahead.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()
