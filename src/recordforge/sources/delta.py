"""A Delta Lake table as one snapshot's Parquet files, and what its log says happened since a version."""
# The `deltalake` package (delta-rs) reads the log: which data files make up version N, their
# partition values and deletion vectors. The files themselves are read as Parquet by ReadParquet.
# A table that is not local (gs://, ...) has the part of its log that version N needs copied to a
# local folder first, through the run's own filesystems, and delta-rs reads that copy: delta-rs
# has storage clients of its own, with their own credentials and endpoints, which would read the
# log with other credentials than the run reads the data files with (or not at all: they ignore
# STORAGE_EMULATOR_HOST, and list a bucket with the XML API an emulator may lack).
# What changed between two versions is read from the log's commits (_delta_log/NNN.json): an
# append adds files and removes none; a DELETE, UPDATE, MERGE or OPTIMIZE removes (rewrites) files.

from __future__ import annotations

import json
import os
import posixpath
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from recordforge.errors import SourceError
from recordforge.files.storage import exists, is_local, list_files, open_read, open_write, read_bytes

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


@contextmanager
def _open_table(table: str, version: int | None) -> Iterator[Any]:
    """delta-rs's DeltaTable of `table` at `version`; of a local copy of its log where the table
    is not local (valid within the block)."""
    try:
        from deltalake import DeltaTable
    except ImportError as exn:
        raise SourceError(
            "--format delta needs the `deltalake` package: pip install 'recordforge[delta]'"
        ) from exn
    at = f" at version {version}" if version is not None else ""
    with tempfile.TemporaryDirectory(prefix="recordforge-delta-log-") as staged:
        try:
            log = table if is_local(table) else _stage_log(table, staged, version)
            dt = DeltaTable(log, version=version)
        except SourceError:
            raise
        except Exception as exn:
            raise SourceError(
                f"{table}: cannot read the Delta table{at}: {' '.join(str(exn).split())}"
            ) from exn
        yield dt


# A log file's version: NNN.json (a commit), NNN.checkpoint.parquet, NNN.checkpoint.<part>.<parts>.parquet
# or NNN.checkpoint.<uuid>.(json|parquet) (checkpoints), NNN.crc; other names (_last_checkpoint,
# temporary files) have none.
_LOG_FILE = re.compile(r"(\d{20})\.(json|crc|checkpoint\..*)$")


def _stage_log(table: str, folder: str, version: int | None) -> str:
    """Copies into `folder` what delta-rs reads of `table`'s log for `version` (None: the latest):
    the latest checkpoint at or before it and the commits after that one up to it (every commit
    from 0 where there is no checkpoint), and a v2 checkpoint's sidecars. Returns the local table
    folder. A long log's older commits, checkpoints and `_last_checkpoint` are not copied: delta-rs
    lists the folder to find what it holds."""
    prefix = f"{table}/{_LOG}/"
    files = [p for p in list_files(f"{table}/{_LOG}") if p.startswith(prefix)]
    versions: dict[str, int] = {}
    for path in files:
        found = _LOG_FILE.fullmatch(path[len(prefix) :])
        if found:
            versions[path] = int(found.group(1))
    commits = [v for p, v in versions.items() if p.endswith(".json") and ".checkpoint." not in p]
    if not commits:
        raise SourceError(f"{table}: no Delta log commits in {prefix}")
    target = max(commits) if version is None else version
    checkpoints = [v for p, v in versions.items() if ".checkpoint." in p and v <= target]
    start = max(checkpoints, default=0)
    wanted = [p for p, v in versions.items() if start <= v <= target]
    wanted += [p for p in files if p[len(prefix) :].startswith("_sidecars/")]
    local = os.path.join(folder, "table")
    for path in wanted:
        with open_write(os.path.join(local, _LOG, *path[len(prefix) :].split("/"))) as f:
            f.write(read_bytes(path))
    return local


def snapshot(table: str, version: int | None = None) -> Snapshot:
    """The table at `version` (None: the latest). A table whose snapshot holds deletion vectors
    (rows deleted without rewriting their files) is refused in one line."""
    table = table.rstrip("/")
    with _open_table(table, version) as dt:
        return _snapshot(table, dt)


def _snapshot(table: str, dt: Any) -> Snapshot:
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
