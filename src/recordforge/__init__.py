"""RecordForge: schema-driven conversion of tables and images to sharded TFRecords on Apache Beam."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

# google-cloud-storage fetches each bucket's metadata in a background thread, only to label
# OpenTelemetry spans: a request RecordForge never needs (and whose service account may lack
# storage.buckets.get), and a thread per bucket in every worker that can block on a slow server.
# Off unless the user's environment sets it.
os.environ.setdefault("DISABLE_GCS_PYTHON_CLIENT_OTEL_BUCKET_METADATA", "1")

from recordforge.version import __version__

__all__ = [
    "__version__",
    "add_conversion",
    "convert",
    "data_source",
    "export",
    "head",
    "image_grid",
    "inspect",
    "load_bundle",
    "plan",
    "read",
    "stats",
    "verify",
    "version_path",
]

if TYPE_CHECKING:
    import apache_beam as beam
    import tensorflow as tf

    from recordforge.pipelines.embedding import Conversion
    from recordforge.reading.random_access import DataSource


def convert(
    source: str | Sequence[str], output: str, schema: str | None = None, **flags: Any
) -> dict[str, Any]:
    """Converts `source` (a pattern, an image folder, or a list of them) to TFRecords and a bundle
    at `output`, as `recordforge convert` does, and returns the published metadata.json.

    Flags are the CLI's by name, as Python values: `convert("t/*.parquet", "out", num_shards=4,
    overwrite=True, splits="train=8,eval=2")`; Beam's pipeline options too
    (`direct_num_workers=2`). A misspelt name or a value of the wrong type raises `UsageError`; a
    bad row (without --max_rejected) raises `DataError`, a bad schema `SchemaError`, an input that
    matches nothing `SourceError`: all `recordforge.errors.RecordForgeError`, each with the one
    line the CLI prints."""
    from recordforge.pipelines.convert import convert as _convert
    from recordforge.pipelines.resolve import request_from_kwargs

    return _convert(request_from_kwargs(source, output, schema, flags))[1]


def plan(source: str | Sequence[str], output: str, schema: str | None = None, **flags: Any) -> dict[str, Any]:
    """What `convert(source, output, schema, **flags)` would read, write and cost, as `recordforge
    plan --json` prints it, without converting: rows per split (exact from Parquet footers),
    output bytes and shards (measured on a sample converted by the real encoder and writer),
    work items and workers, time and memory on this machine, and on Dataflow workers and cost.
    Raises what `convert` would raise before moving data."""
    from recordforge.pipelines.planning import plan_request
    from recordforge.pipelines.resolve import request_from_kwargs

    return plan_request(request_from_kwargs(source, output, schema, flags)).to_dict()


def add_conversion(
    pipeline: beam.Pipeline,
    source: str | Sequence[str],
    output: str,
    schema: str | None = None,
    **flags: Any,
) -> Conversion:
    """Adds a conversion to a Beam pipeline of one's own; run that pipeline inside the returned
    conversion's `publishing()` to publish the bundle, then `published()` gives metadata.json:

        conversion = recordforge.add_conversion(p, "t/*.parquet", "out", schema="s.yaml")
        with conversion.publishing():
            p.run().wait_until_finish()
    """
    from recordforge.pipelines.embedding import add_conversion as _add

    return _add(pipeline, source, output, schema, **flags)


def read(
    path: str,
    *,
    batch_size: int | None = None,
    decode_images: bool = False,
    split: str | None = None,
) -> tf.data.Dataset:
    """A tf.data.Dataset of parsed feature dicts from a RecordForge output folder (imports TF);
    `decode_images=True` gives image features as uint8 [height, width, channels] tensors."""
    from recordforge.reading.tf_data import read as _read

    return _read(path, batch_size=batch_size, decode_images=decode_images, split=split)


def data_source(path: str, split: str | None = None, *, cache_dir: str | None = None) -> DataSource:
    """Random access to a bundle's records (ArrayRecord or indexed TFRecord shards): `len()`,
    `[i]` and `__getitems__` give serialized tf.train.Examples in the order of a sequential read,
    as Grain's RandomAccessDataSource; `.parse(record)` gives numpy arrays. No TensorFlow."""
    from recordforge.reading.random_access import DataSource as _DataSource

    return _DataSource(path, split, cache_dir=cache_dir)


def export(
    output: str, dest: str, *, to: str = "parquet", split: str | None = None, overwrite: bool = False
) -> dict[str, Any]:
    """Every record of the bundle at `output` (or of one split) back to a table at `dest`
    (part-*.parquet) with the source's column names and types (docs/export.md), as `recordforge
    export` does; returns the export's manifest. A damaged bundle raises CorruptFile."""
    from recordforge.exporting.parquet import export as _export

    return _export(output, dest, to=to, split=split, overwrite=overwrite)


def load_bundle(path: str) -> dict[str, Any]:
    """The bundle's metadata and feature spec; no TensorFlow needed."""
    from recordforge.reading.tf_data import load_bundle as _load

    return _load(path)


def inspect(path: str, *, split: str | None = None, n: int = 5) -> dict[str, Any]:
    """Schema, counts per shard and the first `n` records of an output, or `head` of a file."""
    from recordforge.tools.describe import inspect as _inspect

    return _inspect(path, split=split, n=n)


def head(path: str, n: int = 5) -> dict[str, Any]:
    """First records of any TFRecord file, with a feature spec inferred from a sample."""
    from recordforge.tools.describe import head as _head

    return _head(path, n)


def verify(path: str) -> list[str]:
    """Problems found in an output folder, one line each; empty when it is complete and intact."""
    from recordforge.tools.verify import verify as _verify

    return _verify(path)


def stats(path: str) -> dict[str, Any]:
    """Per-feature statistics of every record of an output or file."""
    from recordforge.tools.stats import stats as _stats

    return _stats(path)


def image_grid(path: str, png_path: str, *, n: int = 16) -> dict[str, Any]:
    """A labelled PNG grid of the first `n` images."""
    from recordforge.tools.grid import image_grid as _grid

    return _grid(path, png_path, n=n)


def version_path(path: str) -> str:
    """The folder of an output's published version (`transform_fn/` and the shards are there)."""
    from recordforge.reading.tf_data import version_path as _version_path

    return _version_path(path)
