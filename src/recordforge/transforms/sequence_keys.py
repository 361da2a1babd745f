"""A sequence's key as the shuffle sees it: conformed rows, their key hash, and their partition."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from recordforge.arrays import binary_parts
from recordforge.files import layout
from recordforge.files.storage import open_write, read_bytes
from recordforge.output.shard_files import abandon, temp_path
from recordforge.records.encoding import ExampleEncoder
from recordforge.schemas.model import Schema
from recordforge.schemas.plan import Plan, compile_schema
from recordforge.transforms.examples import NAMESPACE, REJECTED, conform_rows
from recordforge.transforms.source_types import SourceBatch

__all__ = [
    "BUCKET_BITS",
    "FILE",
    "HASH",
    "KEY",
    "PARTITION_BYTES",
    "ROW",
    "Fragment",
    "KeyRows",
    "key_hashes",
    "load_rows",
    "partitions_for",
]

BUCKET_BITS = 10  # records leave in 2^10 constant ranges of the key hash (sequences.py)
PARTITION_BYTES = 64 << 20  # of input per partition: what a worker holds of it at once
# Columns the rows carry through the shuffle beside their conformed features.
HASH, KEY, ROW, FILE = "__hash", "__key", "__row", "__file"
_MULTIPLIER = np.uint64(0x100000001B3)  # FNV's 64-bit prime: the polynomial's base


def partitions_for(input_bytes: int) -> int:
    """Partitions for an input of `input_bytes`: a power of two, at least 4, one per
    PARTITION_BYTES of input, so that a worker holds about that much at a time however large
    the input is."""
    wanted = max(4, -(-input_bytes // PARTITION_BYTES))
    return 1 << (wanted - 1).bit_length()


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 with full avalanche (wraps by design)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def key_hashes(keys: pa.Array) -> np.ndarray:
    """A 64-bit hash of every key's canonical bytes, vectorised: the bytes as a polynomial in
    _MULTIPLIER modulo 2^64 (each byte + 1, so that zero bytes count), its length mixed in,
    through splitmix64's finaliser. Integer arithmetic alone: the same on every machine."""
    offsets, data = binary_parts(keys)
    lengths = np.diff(offsets)
    if not len(lengths):
        return np.zeros(0, np.uint64)
    values = data[offsets[0] : offsets[-1]].astype(np.uint64) + np.uint64(1)
    # Each byte's distance from the end of its key, and _MULTIPLIER to that power.
    ends = np.repeat(offsets[1:] - offsets[0], lengths)
    distance = ends - 1 - np.arange(len(values))
    powers = np.ones(int(lengths.max()), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(1, len(powers)):
            powers[k] = powers[k - 1] * _MULTIPLIER
        terms = values * powers[distance]
        # Keys are encoded Examples, never empty: every reduceat index starts a key of its own.
        sums = np.add.reduceat(terms, (offsets[:-1] - offsets[0]).astype(np.int64))
        return _mix(sums ^ (lengths.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))


@dataclass(frozen=True)
class Fragment:
    """The rows of one source batch that fall in one partition, as they go through the shuffle:
    `rows` (conformed features, then HASH, KEY and ROW) or, spilled, the name of the file holding
    them; `hashes` and `counts`: each distinct key hash among them and its rows, so that a
    group's size is known before any of its rows is read back."""

    file: str
    rows: pa.RecordBatch | str
    hashes: np.ndarray
    counts: np.ndarray


def load_rows(fragment: Fragment) -> pa.RecordBatch:
    if isinstance(fragment.rows, pa.RecordBatch):
        return fragment.rows
    return pa.ipc.open_stream(pa.BufferReader(read_bytes(fragment.rows))).read_next_batch()


def _spill(rows: pa.RecordBatch, spill_dir: str) -> str:
    """The rows to a fresh file of `spill_dir` (Arrow IPC); a failure deletes it."""
    path = temp_path(spill_dir, "rows", layout.SPILL_SUFFIX)
    try:
        with open_write(path) as f, pa.ipc.new_stream(f, rows.schema) as writer:
            writer.write_batch(rows)
    except BaseException:
        abandon(path)
        raise
    return path


class _KeyRowsFn(beam.DoFn):
    """Conforms a source batch and cuts its good rows by partition (the top bits of their key
    hash); bad rows leave as JSON lines, as ToExamples writes them. With `spill_dir`, each
    fragment's rows wait for the shuffle in a file there, and the shuffle holds its name."""

    def __init__(
        self, plan: Plan, strict: bool, partitions: int, spill_dir: str | None, progress: str | None
    ) -> None:
        self._plan = plan
        self._strict = strict
        self._bits = partitions.bit_length() - 1
        self._spill_dir = spill_dir
        self._progress = progress
        self._rows_read = Metrics.counter(NAMESPACE, "rows_read")
        self._rows_rejected = Metrics.counter(NAMESPACE, "rows_rejected")

    def setup(self) -> None:
        spec = self._plan.schema.sequence
        assert spec is not None
        by_name = {f.name: f for f in self._plan.features}
        key_plan = compile_schema(Schema(tuple(by_name[k] for k in spec.key)))
        self._key_encoder = ExampleEncoder(key_plan)
        self._key_columns = [c.name for c in key_plan.columns]

    def process(self, element: SourceBatch) -> Iterator[Any]:
        batch = element.batch
        result = yield from conform_rows(
            element,
            self._plan,
            strict=self._strict,
            namespace=NAMESPACE,
            counters=(self._rows_read, self._rows_rejected),
            progress=self._progress,
        )
        if result is None:
            return
        good = result.batch
        if not good.num_rows:
            return
        rows = np.setdiff1d(np.arange(batch.num_rows), result.rejected_rows) + element.first_row + 1
        keys = self._key_encoder.encode(good.select(self._key_columns))
        hashes = key_hashes(keys)
        extra = {HASH: pa.array(hashes), KEY: keys, ROW: pa.array(rows.astype(np.int64))}
        good = pa.RecordBatch.from_arrays(
            [*good.columns, *extra.values()], names=[*good.schema.names, *extra]
        )
        parts = (
            (hashes >> np.uint64(64 - self._bits)).astype(np.int64)
            if self._bits
            else np.zeros(len(hashes), np.int64)
        )
        order = np.argsort(parts, kind="stable")
        ends = np.searchsorted(parts[order], np.arange((1 << self._bits) + 1))
        for part in np.flatnonzero(np.diff(ends)).tolist():
            taken = order[ends[part] : ends[part + 1]]
            # Its own buffers: a slice would carry (pickle, spill) the whole batch's.
            piece = good.take(pa.array(taken))
            distinct, counts = np.unique(hashes[taken], return_counts=True)
            held: pa.RecordBatch | str = piece if self._spill_dir is None else _spill(piece, self._spill_dir)
            # (partition, the fragment's rows, or their file, with their keys' row counts)
            yield part, Fragment(element.file, held, distinct, counts.astype(np.int64))


class KeyRows(beam.PTransform):
    """Conforms source batches and cuts their good rows by partition of their key's hash.

    In: `SourceBatch`es. Out: `rows`, `(partition, Fragment)` (each fragment a batch's rows of
    one partition, or with `spill_dir` the file they wait in, with their keys' row counts); and
    `rejected`, one JSON line per row that fails conforming (with `strict`, a DataError instead).
    Metrics: `recordforge/rows_read`, `rows_rejected`, `rejected_<rule>`."""

    def __init__(
        self, plan: Plan, *, strict: bool, partitions: int, spill_dir: str | None, progress: str | None
    ) -> None:
        super().__init__()
        self._fn = _KeyRowsFn(plan, strict, partitions, spill_dir, progress)

    def expand(self, batches: beam.PCollection[SourceBatch]) -> beam.pvalue.DoOutputsTuple:
        return batches | "Key" >> beam.ParDo(self._fn).with_outputs(REJECTED, main="rows")
