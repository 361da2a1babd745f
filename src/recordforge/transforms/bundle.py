"""WriteBundle: the self-describing files next to the shards, written last, `_SUCCESS` at the end."""

from __future__ import annotations

import datetime
import json
import logging
import posixpath
import uuid
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from recordforge import __version__
from recordforge.schemas.export import tfmd_text
from recordforge.schemas.loader import dump_schema
from recordforge.schemas.plan import Plan
from recordforge.tfrecord import Compression, ShardInfo

__all__ = ["BundleSpec", "WriteBundle", "SUCCESS", "METADATA", "FEATURE_SPEC", "SCHEMA_PBTXT"]

_LOGGER = logging.getLogger(__name__)

SUCCESS = "_SUCCESS"
METADATA = "metadata.json"
FEATURE_SPEC = "feature_spec.json"
SCHEMA_PBTXT = "schema.pbtxt"
SCHEMA_YAML = "schema.yaml"


@dataclass(frozen=True)
class BundleSpec:
    """What the bundle records about the run, known at construction."""

    output: str
    plan: Plan
    source_format: str
    sources: tuple[tuple[str, int], ...]  # (path, size in bytes)
    compression: str
    command: tuple[str, ...] = ()


def write_atomically(path: str, data: bytes) -> None:
    """Writes to a temporary name beside `path`, then renames, so a reader never sees half a file."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(tmp) as f:
        f.write(data)
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])


def metadata_dict(spec: BundleSpec, shards: list[ShardInfo], rows_read: int) -> dict[str, Any]:
    shards = sorted(shards, key=lambda s: s.path)
    written = sum(s.records for s in shards)
    schema = spec.plan.schema
    return {
        "recordforge_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(spec.command),
        "source_format": spec.source_format,
        "sources": [{"path": p, "bytes": b} for p, b in spec.sources],
        "schema_origin": schema.origin,
        "schema_fingerprint": spec.plan.fingerprint,
        "schema_notes": list(schema.notes),
        "columns": {f.name: f.source_column for f in schema.features},
        "null_policies": {f.name: f.nulls.value for f in schema.features},
        "compression": spec.compression,
        "tf_compression_type": Compression.tf(spec.compression),
        "rows_read": rows_read,
        "rows_written": written,
        "rows_rejected": rows_read - written,
        "num_records": written,
        "shards": [
            {"file": posixpath.basename(s.path), "records": s.records, "bytes": s.bytes,
             "sha256": s.sha256}
            for s in shards
        ],
    }


def _write_bundle(shards: list[ShardInfo], rows_read: int, spec: BundleSpec) -> str:
    meta = metadata_dict(spec, shards, rows_read)
    if meta["rows_written"] != rows_read:
        raise RuntimeError(
            f"{spec.output}: read {rows_read} rows but the shards hold {meta['rows_written']} "
            "records; refusing to publish an incomplete dataset"
        )
    out = spec.output.rstrip("/")
    files = {
        SCHEMA_PBTXT: tfmd_text(spec.plan).encode(),
        SCHEMA_YAML: dump_schema(
            spec.plan.schema, header=f"# RecordForge schema ({spec.plan.schema.origin})\n"
        ).encode(),
        FEATURE_SPEC: json.dumps(spec.plan.feature_spec, indent=2).encode(),
        METADATA: json.dumps(meta, indent=2).encode(),
    }
    for name, data in files.items():
        write_atomically(f"{out}/{name}", data)
    write_atomically(f"{out}/{SUCCESS}", b"")  # last: its presence means the rest is complete
    _LOGGER.info("%s: %d records in %d shards", out, meta["num_records"], len(meta["shards"]))
    return out


class WriteBundle(beam.PTransform):
    """Writes schema.pbtxt, schema.yaml, feature_spec.json, metadata.json, then `_SUCCESS`.

    In: the `ShardInfo`s of the written shards; `rows_read` is a PCollection holding one int.
    Out: the output path, once. Fails if the shards do not hold every row that was read.
    """

    def __init__(self, spec: BundleSpec, rows_read: beam.PCollection[int]) -> None:
        super().__init__()
        self._spec = spec
        self._rows_read = rows_read

    def expand(self, shards: beam.PCollection[ShardInfo]) -> beam.PCollection[str]:
        return (
            shards
            | "CollectShards" >> beam.combiners.ToList()
            | "Write" >> beam.Map(
                _write_bundle, beam.pvalue.AsSingleton(self._rows_read), spec=self._spec
            )
        )
