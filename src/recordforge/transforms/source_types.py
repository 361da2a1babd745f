"""What every source shares: `SourceBatch`, the files it lists, its tagged outputs."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import apache_beam as beam
import pyarrow as pa

from recordforge import interrupts
from recordforge.errors import SourceError
from recordforge.files.storage import is_local, match
from recordforge.transforms.coders import PickleCoder

__all__ = [
    "expand_patterns",
    "FileInfo",
    "REJECTED",
    "SourceBatch",
    "SourceBatchCoder",
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
    # Rows already in the plan's Arrow schema (Examples read back: record_source.py), not conformed
    # again; `records`: each row's Example bytes where they pass through unchanged, else null.
    conformed: bool = False
    records: pa.Array | None = None


class SourceBatchCoder(PickleCoder):
    """A `SourceBatch`: a record batch with its file and first row."""

    def estimate_size(self, value: SourceBatch) -> int:
        return value.batch.nbytes + sum(a.nbytes for a in value.read.values()) + len(value.file) + 16


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
        interrupts.check()  # a safe point per pattern: listing a bucket can take minutes
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
