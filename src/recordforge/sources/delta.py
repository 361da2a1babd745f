"""A Delta Lake table as one snapshot's Parquet files, and what its log says happened since a version."""
# The `deltalake` package (delta-rs) reads the log: which data files make up version N, their
# partition values and deletion vectors. The files themselves are read as Parquet by ReadParquet.
# What changed between two versions is read from the log's commits (_delta_log/NNN.json): an
# append adds files and removes none; a DELETE, UPDATE, MERGE or OPTIMIZE removes (rewrites) files.

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from recordforge.errors import SourceError
from recordforge.files.storage import exists, is_local, open_read

__all__ = ["DeltaFile", "Snapshot", "changes_since", "is_delta_table", "snapshot"]

_LOG = "_delta_log"


@dataclass(frozen=True)
class DeltaFile:
    """One data file of a snapshot: its URI, size, rows, and partition values (as the log has them)."""

    uri: str
    size: int
    rows: int | None
    partition: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """Version `version` of the table at `table`: its data files, its Arrow schema, and the
    partition columns (their values are in the log, not in the files)."""

    table: str
    version: int
    files: tuple[DeltaFile, ...]
    schema: pa.Schema
    partition_columns: tuple[str, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What metadata.json records of it."""
        return {"table": self.table, "version": self.version, "files": len(self.files)}

    def partition_values(self) -> dict[str, dict[str, Any]]:
        """Each file's partition values, typed by the table's schema, by file URI."""
        out: dict[str, dict[str, Any]] = {}
        for f in self.files:
            values = {}
            for name, text in f.partition:
                kind = self.schema.field(name).type
                values[name] = None if text is None else pa.scalar(text, pa.string()).cast(kind).as_py()
            out[f.uri] = values
        return out


def is_delta_table(path: str) -> bool:
    """Whether `path` is a folder holding a Delta log."""
    table = path.rstrip("/")
    return exists(_commit_path(table, 0)) or exists(f"{table}/{_LOG}/_last_checkpoint")


def _commit_path(table: str, version: int) -> str:
    return f"{table}/{_LOG}/{version:020d}.json"


def _open_table(table: str, version: int | None) -> Any:
    try:
        from deltalake import DeltaTable
    except ImportError as exn:
        raise SourceError(
            "--format delta needs the `deltalake` package: pip install 'recordforge[delta]'"
        ) from exn
    try:
        return DeltaTable(table, version=version)
    except Exception as exn:
        at = f" at version {version}" if version is not None else ""
        raise SourceError(f"{table}: cannot read the Delta table{at}: {' '.join(str(exn).split())}") from exn


def snapshot(table: str, version: int | None = None) -> Snapshot:
    """The table at `version` (None: the latest). A table whose snapshot holds deletion vectors
    (rows deleted without rewriting their files) is refused in one line."""
    table = table.rstrip("/")
    dt = _open_table(table, version)
    at = int(dt.version())
    actions = pa.table(dt.get_add_actions(flatten=True))
    deletion = [
        n for n in actions.column_names if n.startswith("deletionVector") or n.startswith("deletion_vector")
    ]
    features = dt.protocol().reader_features or []
    with_vectors = any(actions.column(n).null_count < actions.num_rows for n in deletion)
    if with_vectors or ("deletionVectors" in features and not deletion and actions.num_rows):
        raise SourceError(
            f"{table}: version {at} has deletion vectors, which RecordForge does not apply; purge them "
            "(REORG TABLE ... APPLY (PURGE), or OPTIMIZE) or pass --delta_version of a version without them"
        )
    partition_columns = tuple(dt.metadata().partition_columns)
    schema = pa.schema(dt.schema().to_arrow())
    files = []
    rows = actions.column("num_records").to_pylist() if "num_records" in actions.column_names else None
    for i, (rel, size) in enumerate(
        zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True)
    ):
        values = tuple(
            (c, actions.column(f"partition.{c}")[i].as_py())
            for c in partition_columns
            if f"partition.{c}" in actions.column_names
        )
        values = tuple((c, None if v is None else str(v)) for c, v in values)
        files.append(DeltaFile(_absolute(table, rel), int(size), None if rows is None else rows[i], values))
    return Snapshot(table, at, tuple(sorted(files, key=lambda f: f.uri)), schema, partition_columns)


def _absolute(table: str, rel: str) -> str:
    """A data file's URI: the log's paths are relative to the table (URL-encoded) or absolute."""
    from urllib.parse import unquote

    if "://" in rel:
        return rel
    path = unquote(rel)
    return (
        posixpath.join(table, path)
        if not is_local(table)
        else str(posixpath.normpath(posixpath.join(table, path)))
    )


def changes_since(table: str, published: int, now: int) -> tuple[list[str], str | None]:
    """The data files added after version `published` up to `now`, from the log's commits, and
    what makes an append of them wrong (None: nothing): a commit that removes or rewrites files
    (DELETE, UPDATE, MERGE, OPTIMIZE), changes the schema, or is missing from the log."""
    table = table.rstrip("/")
    added: list[str] = []
    for version in range(published + 1, now + 1):
        path = _commit_path(table, version)
        try:
            with open_read(path) as f:
                lines = f.read().decode().splitlines()
        except Exception:  # noqa: BLE001 - cleaned from the log: what changed cannot be told
            return added, f"the log no longer holds version {version} ({path})"
        operation = "?"
        for line in lines:
            action = json.loads(line) if line.strip() else {}
            if "commitInfo" in action:
                operation = str(action["commitInfo"].get("operation", "?"))
            if "remove" in action:
                return added, f"version {version} ({operation}) removed or rewrote data files"
            if "metaData" in action:
                return added, f"version {version} ({operation}) changed the table's metadata or schema"
            if "add" in action:
                added.append(_absolute(table, action["add"]["path"]))
    return added, None
