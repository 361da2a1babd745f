"""`recordforge export`: a bundle's records back to Parquet parts, on every core, published safely."""
# Two passes. 1: every shard through tools/scan.py (all cores, bounded memory, each shard's size,
# sha256 and record count checked against the manifest); each chunk of records is decoded in C
# (records/wire.py), turned into the source's columns (columns.py) and staged as an Arrow IPC
# file named by (shard, first record). 2: the staged files, in bundle order, written as parts.
# Where every column's type follows from the schema alone, pass 2 runs during pass 1: a thread
# writes each staged file as soon as the ones before it are written (`_Streamer`). Otherwise
# (decimals `as: string`, fixed shapes: their type depends on every chunk) it runs after it,
# the parts written by a process each.

from __future__ import annotations

import contextlib
import functools
import logging
import math
import multiprocessing
import os
import posixpath
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from recordforge.errors import CorruptFile, RecordForgeError, UsageError
from recordforge.exporting.columns import (
    BadRecord,
    Decimals,
    Tree,
    arrow_schema,
    column_tree,
    merge_decimals,
    retyped,
    to_record_batch,
)
from recordforge.exporting.destination import ours, publish, temporary_folder
from recordforge.files import layout
from recordforge.files.storage import delete_tree, is_local, join, open_write, read_bytes
from recordforge.reading.tf_data import load_bundle
from recordforge.records.array_records import reading
from recordforge.records.chunks import RecordChunk, data_crc_mismatches
from recordforge.records.wire import decode_batch
from recordforge.records.wire_keys import KeyTable
from recordforge.schemas.kinds import DType
from recordforge.schemas.loader import schema_from_dict
from recordforge.schemas.model import Feature, Schema
from recordforge.tools import scan
from recordforge.tools.scan import ShardResult, malloc_keeps_memory, scan_shards
from recordforge.version import __version__

__all__ = ["export"]

_LOGGER = logging.getLogger(__name__)

FORMATS = ("parquet",)
# Arrow bytes per part and per row group: parts large enough for any reader, and a row group's
# rows held in memory once per writing process. The last row group is encoded after the last
# chunk is staged: 32 MiB (the bench table's 180,000 rows) keeps that tail short.
_PART_BYTES = 512 << 20
_MIN_PART_BYTES = 32 << 20
_ROW_GROUP_BYTES = 32 << 20
# A column chunk's values are dictionary-encoded until its dictionary passes this size, then
# written plain. pyarrow's default (1 MiB) hashes values that do not repeat (random numbers) by
# the hundred thousand before it gives up, and the pages it wrote so are larger than plain ones:
# on the bench bundle 64 KiB writes Parquet in 0.49 s of CPU instead of 0.64 s, and smaller
# files. Columns of a few thousand distinct values (categories, codes) keep their dictionaries.
_DICTIONARY_BYTES = 64 << 10
_WRITE_BUFFER = 8 << 20


@dataclass(frozen=True)
class _Job:
    """What each scanning process needs: the columns, where to stage, each shard's number."""

    tree: Tree
    stage: str
    shards: dict[str, int]  # shard file name -> its place in the bundle's order


@dataclass(frozen=True)
class _Staged:
    shard: int
    first_record: int
    rows: int
    path: str
    size: int


@dataclass
class _Stager:
    """The accumulator of the scan: each chunk decoded and staged; the first bad record kept."""

    job: _Job
    files: list[_Staged] = field(default_factory=list)
    decimals: Decimals = field(default_factory=dict)
    bad: dict[int, tuple[int, str]] = field(default_factory=dict)  # shard -> (record, what)
    keys: KeyTable = field(default_factory=KeyTable)

    def add(self, chunk: RecordChunk, shard: str) -> None:
        index = self.job.shards[shard]
        if index in self.bad or not len(chunk):
            return
        crc = data_crc_mismatches(chunk)
        batch = decode_batch(chunk.data, chunk.starts, chunk.ends, self.keys, padded=chunk.padded)
        try:
            if len(crc):
                raise BadRecord(int(crc[0]), "corrupt data (CRC mismatch)")
            if batch.not_examples:
                r = batch.not_examples[0]
                raise BadRecord(r, batch.errors.get(r, "not a tf.train.Example"))
            table, decimals = to_record_batch(batch, self.job.tree)
        except BadRecord as exn:
            self._refuse(index, chunk.first_record + exn.record, exn.what)
            return
        path = _staged_path(self.job.stage, index, chunk.first_record)
        with pa.OSFile(path + ".tmp", "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_batch(table)
        size = os.path.getsize(path + ".tmp")
        os.replace(path + ".tmp", path)  # whole when it appears: _Streamer may read it at once
        self.files.append(_Staged(index, chunk.first_record, table.num_rows, path, size))
        self.decimals = merge_decimals(self.decimals, decimals)

    def _refuse(self, shard: int, record: int, what: str) -> None:
        if shard not in self.bad or record < self.bad[shard][0]:
            self.bad[shard] = (record, what)

    def merge(self, other: _Stager) -> None:
        self.files += other.files
        self.decimals = merge_decimals(self.decimals, other.decimals)
        for shard, (record, what) in other.bad.items():
            self._refuse(shard, record, what)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "keys": None}  # names seen: rebuilt where it is read

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({**state, "keys": KeyTable()})


def export(
    output: str,
    dest: str,
    *,
    to: str = "parquet",
    split: str | None = None,
    overwrite: bool = False,
    workers: int | None = None,
) -> dict[str, Any]:
    """Every record of the published bundle `output` (or of its split `split`) as rows of the
    source's columns (docs/export.md), written to DEST as part-00000.parquet, ... and an
    `_export.json` manifest, which it returns. Refuses an existing DEST without `overwrite`,
    and one holding files it did not write; a damaged shard or record raises CorruptFile naming
    it, and nothing is published."""
    if to not in FORMATS:
        raise UsageError(f"--to {to!r}: one of {', '.join(FORMATS)}")
    start = time.monotonic()
    bundle = load_bundle(output, split=split)
    meta = bundle["metadata"]
    if "sequence" in meta:
        raise UsageError(f"{output}: a bundle of SequenceExamples cannot be exported to a table")
    ours(dest, overwrite=overwrite)  # refused before any work
    schema = _schema(bundle)
    tree = column_tree(schema)
    shards = [s for s in meta["shards"] if split is None or s.get("split") == split]
    paths = [(path, reading(meta)) for path in bundle["files"]]
    names = {posixpath.basename(path): i for i, (path, _) in enumerate(paths)}
    if len(names) != len(paths):
        raise RecordForgeError(f"{output}: two shards share a file name")
    workers = workers or len(os.sched_getaffinity(0))
    tmp = temporary_folder(dest)
    stage = tempfile.mkdtemp(prefix="export-", dir=tmp if _mkdir(tmp) else None)
    streamer = (
        _Streamer(stage, tmp, arrow_schema(tree, {}), [int(s["records"]) for s in shards])
        if _types_known(tree)
        else None
    )
    try:
        job = _Job(tree, stage, names)
        with malloc_keeps_memory():
            results = scan_shards(
                paths,
                functools.partial(_Stager, job),
                what="exported",
                total_bytes=sum(int(s["bytes"]) for s in shards),
                workers=workers,
                started=streamer.start if streamer is not None else None,
            )
            staged = _checked(results, shards)
            table_schema = arrow_schema(tree, staged.decimals)
            if streamer is not None:
                parts = streamer.finish()
            else:
                parts = _write_parts(
                    sorted(staged.files, key=lambda s: (s.shard, s.first_record)), table_schema, tmp, workers
                )
        shutil.rmtree(stage, ignore_errors=True)
        rows = sum(p["rows"] for p in parts)
        expected = sum(int(s["records"]) for s in shards)
        if rows != expected:  # the invariant the manifest is published under
            raise RecordForgeError(
                f"{output}: exported {rows} rows, the manifest holds {expected}; nothing published"
            )
        manifest = {
            "recordforge_version": __version__,
            "source": output,
            "version": meta.get("version"),
            "split": split,
            "format": to,
            "rows": rows,
            "schema": table_schema.to_string(show_schema_metadata=False),
            "files": parts,
        }
        publish(tmp, dest, manifest, overwrite=overwrite)
    except BaseException:
        if streamer is not None:
            streamer.stop()
        shutil.rmtree(stage, ignore_errors=True)
        delete_tree(tmp)
        raise
    _LOGGER.info("exported %d rows to %s in %.1f s", rows, dest, time.monotonic() - start)
    return manifest


def _schema(bundle: dict[str, Any]) -> Schema:
    """The bundle's schema, from the schema.yaml beside its shards."""
    path = join(bundle["root"], layout.SCHEMA_YAML)
    try:
        return schema_from_dict(yaml.safe_load(read_bytes(path)), origin=path)
    except (ValueError, yaml.YAMLError) as exn:
        raise CorruptFile(path, f"not the bundle's schema ({exn})") from exn


def _staged_path(stage: str, shard: int, first_record: int) -> str:
    return os.path.join(stage, f"{shard:06d}-{first_record:012d}.arrow")


def _types_known(tree: Tree) -> bool:
    """Whether every column's type follows from the schema alone (columns.column_type): no
    decimal `as: string` (its scale is the most digits any value has) and no fixed shape (a
    list where some record lacks it)."""
    for node in tree.values():
        if isinstance(node, Feature):
            if node.dtype is DType.DECIMAL and node.decimal_as != "scaled_int":
                return False
            if not (node.is_scalar or node.is_variable or node.is_ragged):
                return False
        elif not _types_known(node):
            return False
    return True


class _Streamer(threading.Thread):
    """Pass 2 during pass 1: the staged files written to parts in bundle order as the scan's
    processes stage them, each removed once written. Shard i's files are those from record 0
    to `counts[i]` (the manifest's counts: a shard that holds other counts is refused by
    `_checked`, and the rows written compared with the manifest's before anything is published)."""

    def __init__(self, stage: str, folder: str, schema: pa.Schema, counts: list[int]) -> None:
        super().__init__(name="export-parts", daemon=True)
        self.stage, self.folder, self.schema, self.counts = stage, folder, schema, counts
        self.scanned = threading.Event()  # every chunk is staged: a file not there will not come
        self.stopped = threading.Event()  # the export failed: write nothing more
        self.parts: list[dict[str, Any]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            tables = _Lookahead(self._tables())
            while not self.parts or tables.more():
                name = f"part-{len(self.parts):05d}.parquet"
                rows, size = _write_part(tables, join(self.folder, name), self.schema, _PART_BYTES)
                self.parts.append({"file": name, "rows": rows, "bytes": size})
        except BaseException as exn:  # raised by finish()
            self.error = exn

    def _tables(self) -> Iterator[pa.Table]:
        for shard, count in enumerate(self.counts):
            first = 0
            while first < count:
                path = _staged_path(self.stage, shard, first)
                while not os.path.exists(path):
                    if self.stopped.is_set() or (self.scanned.is_set() and not os.path.exists(path)):
                        return  # a shard short of its count: _checked says which
                    self.stopped.wait(0.002)
                table = _read_staged(path, self.schema)
                os.remove(path)
                first += table.num_rows
                yield table

    def finish(self) -> list[dict[str, Any]]:
        """The parts, once every staged file is written."""
        self.scanned.set()
        self.join()
        if self.error is not None:
            raise self.error
        return self.parts

    def stop(self) -> None:
        self.stopped.set()
        if self.is_alive():
            self.join()


class _Lookahead:
    """An iterator that can say whether it holds another item (waiting for it if need be)."""

    def __init__(self, items: Iterator[pa.Table]) -> None:
        self.items = items
        self.held: list[pa.Table] = []

    def more(self) -> bool:
        if not self.held:
            self.held = [t for t in [next(self.items, None)] if t is not None]
        return bool(self.held)

    def __iter__(self) -> Iterator[pa.Table]:
        return self

    def __next__(self) -> pa.Table:
        if self.more():
            return self.held.pop()
        raise StopIteration


def _mkdir(folder: str) -> bool:
    """Makes a local folder (the staging area goes inside it); False for an object store."""
    if not is_local(folder):
        return False
    os.makedirs(folder)
    return True


@dataclass
class _Checked:
    files: list[_Staged]
    decimals: Decimals


def _checked(results: list[ShardResult], shards: list[dict[str, Any]]) -> _Checked:
    """The staged chunks, once every shard is whole and as the manifest says; else CorruptFile."""
    files: list[_Staged] = []
    decimals: Decimals = {}
    for i, (result, shard) in enumerate(zip(results, shards, strict=True)):
        path = result.path
        if result.missing:
            raise CorruptFile(path, "missing (the manifest lists it)")
        if result.error is not None:
            at = f" at byte {result.error_offset}" if result.error_offset is not None else ""
            raise CorruptFile(path, f"{result.error}{at}")
        acc: _Stager = result.acc
        if i in acc.bad:
            record, what = acc.bad[i]
            raise CorruptFile(path, f"record {record}: {what}")
        if result.size != int(shard["bytes"]) or result.sha256 != shard["sha256"]:
            raise CorruptFile(
                path,
                f"{result.size} bytes with sha256 {result.sha256[:16]}..., the manifest says "
                f"{shard['bytes']} bytes with {shard['sha256'][:16]}...",
            )
        if result.records != int(shard["records"]):
            raise CorruptFile(path, f"{result.records} records, the manifest says {shard['records']}")
        files += [f for f in acc.files if f.shard == i]
        decimals = merge_decimals(decimals, acc.decimals)
    return _Checked(files, decimals)


def _groups(files: list[_Staged], workers: int) -> list[list[_Staged]]:
    """Consecutive staged files per part: parts of at most _PART_BYTES, and one per worker when
    there is enough to share (at least _MIN_PART_BYTES each)."""
    total = sum(f.size for f in files)
    count = max(1, math.ceil(total / _PART_BYTES), min(workers, total // _MIN_PART_BYTES))
    target = total / count
    groups: list[list[_Staged]] = [[]]
    size = 0
    for f in files:
        if groups[-1] and size + f.size / 2 > target * len(groups):
            groups.append([])
        groups[-1].append(f)
        size += f.size
    return groups


def _write_parts(files: list[_Staged], schema: pa.Schema, folder: str, workers: int) -> list[dict[str, Any]]:
    groups = _groups(files, workers)
    names = [f"part-{i:05d}.parquet" for i in range(len(groups))]
    jobs = [([f.path for f in g], join(folder, name), schema) for g, name in zip(groups, names, strict=True)]
    if len(jobs) == 1 or workers == 1:
        done = [_write_staged(*job) for job in jobs]
    else:
        context = multiprocessing.get_context(scan.start_method())
        with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
            done = list(pool.map(_write_staged, *zip(*jobs, strict=True)))
    return [
        {"file": name, "rows": rows, "bytes": size} for name, (rows, size) in zip(names, done, strict=True)
    ]


def _write_staged(paths: list[str], dest: str, schema: pa.Schema) -> tuple[int, int]:
    return _write_part((_read_staged(path, schema) for path in paths), dest, schema)


def _read_staged(path: str, schema: pa.Schema) -> pa.Table:
    """A staged file's rows, as `schema` (decimals at the common scale, fixed shapes as lists)."""
    with pa.memory_map(path) as source:
        table = pa.ipc.open_file(source).read_all()
    if table.schema != schema:
        columns = [c.combine_chunks() for c in table.columns]
        table = pa.table([retyped(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)
    return table


def _write_part(
    tables: Iterable[pa.Table], dest: str, schema: pa.Schema, limit: float = math.inf
) -> tuple[int, int]:
    """Tables of `schema`, in order, as one Parquet file, until it holds `limit` bytes of Arrow
    data (an iterator keeps the tables after that): (rows, bytes)."""
    rows = 0
    pending: list[pa.Table] = []
    size = total = 0
    counted: _Counted | None = None
    with contextlib.ExitStack() as stack:
        if is_local(dest):  # written by Arrow's C++ alone: no Python call, no GIL taken
            os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
            sink: pa.NativeFile = stack.enter_context(pa.OSFile(dest, "wb"))
        else:
            counted = _Counted(stack.enter_context(open_write(dest)))
            sink = pa.PythonFile(counted, mode="w")
        # Buffered in C++: a few large writes instead of a few small ones a page (each waiting
        # for the GIL where the file is a Python object: a thread of the process that reads the
        # shards holds it between its calls).
        stream = stack.enter_context(pa.BufferedOutputStream(sink, _WRITE_BUFFER))
        writer = stack.enter_context(
            pq.ParquetWriter(stream, schema, dictionary_pagesize_limit=_DICTIONARY_BYTES)
        )
        for table in tables:
            pending.append(table)
            size += table.nbytes
            total += table.nbytes
            rows += table.num_rows
            if size >= _ROW_GROUP_BYTES:
                writer.write_table(pa.concat_tables(pending), row_group_size=1 << 30)
                pending, size = [], 0
            if total >= limit:
                break
        if pending:
            writer.write_table(pa.concat_tables(pending), row_group_size=1 << 30)
    return rows, counted.written if counted is not None else os.path.getsize(dest)


class _Counted:
    """A file object that counts the bytes written through it (Parquet's size, without a stat)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.written = 0
        self.closed = False

    def write(self, data: Any) -> int:
        self.written += len(data)
        return int(self.sink.write(data) or len(data))

    def flush(self) -> None:
        self.sink.flush()

    def tell(self) -> int:
        return self.written

    def close(self) -> None:
        self.closed = True
