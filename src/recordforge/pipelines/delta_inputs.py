"""--format delta resolved: one snapshot's data files, the table's schema, and what --append may add."""

from __future__ import annotations

import logging
import os
from typing import Any

from recordforge.errors import RecordForgeError, SourceError
from recordforge.files.storage import is_local
from recordforge.pipelines.config import ConvertConfig
from recordforge.schemas import Plan, compile_schema, load_schema
from recordforge.schemas.infer import infer_schema
from recordforge.schemas.loader import dump_schema
from recordforge.sources.delta import Snapshot, changes_since, snapshot
from recordforge.sources.probe import never_null_columns, parquet_footers
from recordforge.transforms.source_types import FileInfo, expand_patterns

__all__ = ["check_delta_append", "delta_inputs", "partition_values"]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the messages users know


def delta_inputs(config: ConvertConfig) -> tuple[list[FileInfo], Plan, Snapshot]:
    """The snapshot --delta_version names (default: the latest), its data files as listed now
    (a file the log names but storage lacks is an error) and the declared or inferred plan: the
    table's columns, partition columns among them, dense where no file's statistics hold a null."""
    if len(config.sources) != 1:
        raise RecordForgeError("--format delta reads one table: give its folder as the only --source")
    snap = snapshot(config.sources[0], config.delta_version)
    if not snap.files:
        raise SourceError(f"{snap.table}: version {snap.version} of the Delta table holds no data files")
    files = expand_patterns([f.uri for f in snap.files])
    _LOGGER.info("Delta table %s, version %d: %d data files", snap.table, snap.version, len(files))
    if config.schema_path:
        return files, compile_schema(load_schema(config.schema_path)), snap
    footers = parquet_footers([f.path for f in files])
    schema = infer_schema(snap.schema, origin=snap.table, never_null=never_null_columns(footers))
    _LOGGER.info(
        "No --schema given: inferred from the Delta table's schema (written to the bundle as "
        "schema.yaml; pass it with --schema to pin it):\n%s",
        dump_schema(schema),
    )
    return files, compile_schema(schema), snap


def partition_values(snap: Snapshot, files: list[FileInfo]) -> dict[str, dict[str, Any]]:
    """Each listed file's partition values, by the path its batches name (local paths absolute,
    as expand_patterns lists them)."""
    typed = {_key(uri): values for uri, values in snap.partition_values().items()}
    return {info.path: typed[_key(info.path)] for info in files}


def _key(path: str) -> str:
    return os.path.abspath(path) if is_local(path) else path


def check_delta_append(snap: Snapshot, published: dict[str, Any], redo: str) -> None:
    """--append over a Delta table converts only files added since the published version: refused
    when the published version records no table version, or when the log shows files removed or
    rewritten since (DELETE, UPDATE, MERGE, OPTIMIZE) or the schema changed."""
    before = published.get("delta")
    if not isinstance(before, dict) or "version" not in before:
        raise RecordForgeError(f"--append: the published version records no Delta table version; {redo}")
    was = int(before["version"])
    if snap.version < was:
        raise RecordForgeError(
            f"--append: the Delta table is at version {snap.version}, older than the published {was}; {redo}"
        )
    _, reason = changes_since(snap.table, was, snap.version)
    if reason is not None:
        raise RecordForgeError(
            f"--append: the Delta table's {reason} after the published version {was}, so the "
            f"published records no longer match the table; {redo}"
        )
