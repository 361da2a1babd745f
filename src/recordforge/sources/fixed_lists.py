"""Parquet files with fixed-size-list columns read through variable-length lists, shapes restored."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["has_fixed_lists", "iter_batches", "readable"]

# The footer key under which Arrow's writer stores the Arrow schema; renamed (same length, so the
# footer's encoding holds) the reader takes the types from the Parquet schema alone.
_ARROW_SCHEMA = b"ARROW:schema"
_IGNORED = b"ARROW:ignore"


def has_fixed_lists(t: pa.DataType) -> bool:
    if pa.types.is_fixed_size_list(t):
        return True
    if pa.types.is_struct(t):
        return any(has_fixed_lists(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return has_fixed_lists(t.value_type)
    return False


def readable(pf: pq.ParquetFile, source: str | IO[bytes], **options: Any) -> pq.ParquetFile:
    """`pf`, or where its Arrow schema holds a fixed-size list, the same file (`source`, opened
    with `options`) read without the stored Arrow schema: pyarrow reads a fixed-size list with a
    null row as a list of the wrong size ("Expected all lists to be of size=3"), and as a
    variable-length list correctly. `iter_batches` casts the columns back."""
    if not any(has_fixed_lists(f.type) for f in pf.schema_arrow):
        return pf
    buf = io.BytesIO()
    pf.metadata.write_metadata_file(buf)
    raw = buf.getvalue()
    if raw.count(_ARROW_SCHEMA) != 1:
        return pf  # not the layout this relies on: the read fails with pyarrow's own message
    meta = pq.read_metadata(io.BytesIO(raw.replace(_ARROW_SCHEMA, _IGNORED)))
    return pq.ParquetFile(source, metadata=meta, **options)


def _restored(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Each column cast to its type in `schema` (the one the writer stored), where it converts:
    a list of N values (or a null) to a fixed-size list of N, seconds and zones as written."""
    arrays = []
    for name, col in zip(batch.schema.names, batch.columns, strict=True):
        want = schema.field(name).type if name in schema.names else col.type
        if col.type != want:
            try:
                col = pc.cast(col, want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                pass  # left variable-length: conforming checks each row's length against the shape
        arrays.append(col)
    return pa.RecordBatch.from_arrays(arrays, names=batch.schema.names)


def iter_batches(
    pf: pq.ParquetFile, source: str | IO[bytes], options: dict[str, Any], **read: Any
) -> Iterator[pa.RecordBatch]:
    """pf.iter_batches(**read), through `readable` where the file holds fixed-size lists."""
    reader = readable(pf, source, **options)
    if reader is pf:
        yield from pf.iter_batches(**read)
        return
    stored = pf.schema_arrow
    for batch in reader.iter_batches(**read):
        yield _restored(batch, stored)
