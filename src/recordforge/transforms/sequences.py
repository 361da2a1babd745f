"""ToSequences: source record batches to serialized tf.train.SequenceExamples, rows grouped by key.

Rows meet their group through the runner's own shuffle (a GroupByKey), in partitions: a row goes
to the partition its key's 64-bit hash falls in (equal ranges of the hash space, one per
PARTITION_BYTES of input), so a group is never cut across partitions and a worker holds one
partition at a time. Before a partition's rows are read back, the sizes of its groups are known
(each fragment carries its keys' row counts): a group of more than `max_group_rows` rows is never
gathered (sequence_groups.OverLimit). In a partition, rows are sorted by (key hash, key bytes,
order, step bytes): groups and steps come out in one order whatever files, batches or workers the
rows came through. The records leave in 2^BUCKET_BITS ranges of the hash, a constant (finer when
there are more partitions than that): where a deterministic sink places them, and the batches it
writes, depend on the rows, not on how many partitions they met in.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import typehints
from apache_beam.metrics import Metrics

from recordforge.arrays import binary_parts
from recordforge.conforming.conform import BadRow
from recordforge.conforming.splits import SplitSpec, assign_by_hash
from recordforge.records.encoding import ExampleEncoder
from recordforge.records.sequence_encoding import SequenceEncoder
from recordforge.schemas.kinds import DType
from recordforge.schemas.model import Schema
from recordforge.schemas.plan import Plan, compile_schema
from recordforge.schemas.sequence import sequence_plans
from recordforge.schemas.sequence_spec import CHUNK_FEATURE, POLICY_RULES, Longer
from recordforge.transforms.coders import declare_element_type
from recordforge.transforms.examples import NAMESPACE, REJECTED
from recordforge.transforms.rejects import rejected_line
from recordforge.transforms.sequence_groups import (
    Dropped,
    Groups,
    OverLimit,
    dead_letters,
    group_sizes,
    keep_last_reason,
    sort_rows,
)
from recordforge.transforms.sequence_keys import (
    BUCKET_BITS,
    FILE,
    HASH,
    KEY,
    ROW,
    Fragment,
    KeyRows,
    load_rows,
)

__all__ = ["COUNTS", "ToSequences"]

_LOGGER = logging.getLogger(__name__)

COUNTS = "counts"
_INTERNAL = {HASH, KEY, ROW, FILE}


class _EncodePartitionFn(beam.DoFn):
    """Reads one partition's rows (over-limit groups apart), sorts them, checks and cuts their
    groups, and encodes their sequences."""

    def __init__(
        self, plan: Plan, strict: bool, splits: SplitSpec | None, partitions: int, max_record_bytes: int = 0
    ) -> None:
        self._plan = plan
        self._max_record_bytes = max_record_bytes
        self._strict = strict
        self._splits = splits
        self._bits = partitions.bit_length() - 1
        self._sequences = Metrics.counter(NAMESPACE, "sequences_written")
        self._rows_rejected = Metrics.counter(NAMESPACE, "rows_rejected")

    def setup(self) -> None:
        spec = self._plan.schema.sequence
        assert spec is not None
        self._spec = spec
        plans = sequence_plans(self._plan.schema)
        self._encoder = SequenceEncoder(plans)
        self._steps_encoder = ExampleEncoder(plans.steps)
        by_name = {f.name: f for f in self._plan.features}
        self._context_encoders = {
            name: ExampleEncoder(compile_schema(Schema((by_name[name],)))) for name in spec.context
        }
        self._context_columns = [c.name for c in plans.context.columns if c.name != CHUNK_FEATURE]
        self._step_columns = [c.name for c in plans.steps.columns]
        # Conformed strings are bytes; a dead letter shows them as the text they were read as.
        self._strings = {f.name for f in self._plan.features if f.dtype is DType.STRING and not f.hashed}

    def process(self, element: tuple[int, Iterable[Fragment]]) -> Iterator[Any]:
        part, fragments = element
        # The group sizes first (the fragments' counts, no rows read): which groups to hold.
        hashes, counts = group_sizes([f.hashes for f in fragments], [f.counts for f in fragments])
        # By hash: a key sharing its 64-bit hash with a group over the limit (as likely as any
        # 64-bit collision among a partition's keys) would be treated as part of it.
        over = hashes[counts > self._spec.max_group_rows]
        limit = OverLimit(
            self._spec,
            dict(zip(over.tolist(), counts[counts > self._spec.max_group_rows].tolist(), strict=True)),
            self._steps_encoder,
            self._step_columns,
        )
        files: list[str] = []
        held = []
        for fragment in fragments:  # one at a time: a runner may page them in
            files.append(fragment.file)
            rows = load_rows(fragment)
            rows = rows.append_column(FILE, pa.array(np.full(rows.num_rows, len(files) - 1, np.int64)))
            table = pa.Table.from_batches([rows])
            if over.size:
                beyond = np.isin(rows.column(HASH).to_numpy(), over)
                if beyond.any():
                    for dropped in limit.add(table.filter(pa.array(beyond))):
                        yield from self._rejected(dropped, files)
                    table = table.filter(pa.array(~beyond))
            held.append(table)
        kept = limit.kept()
        if kept is not None:
            held.append(kept)
        if not held:
            return
        table = pa.concat_tables(held).combine_chunks()
        del held
        yield from self._encode(
            part, files, sort_rows(table, self._spec.order, self._steps_encoder, self._step_columns)
        )

    def _encode(self, part: int, files: list[str], table: pa.Table) -> Iterator[Any]:
        spec = self._spec
        groups = Groups(table, spec, self._context_encoders)
        kept = np.ones(table.num_rows, dtype=bool)
        for g, (column, rule, reason) in sorted(groups.bad.items()):
            rows = np.arange(groups.starts[g], groups.starts[g] + groups.sizes[g])
            kept[rows] = False
            yield from self._rejected(Dropped(table, rows, column, rule, reason), files)
        chunk = np.zeros(table.num_rows, dtype=np.int64)
        if spec.max_length is not None and spec.longer is Longer.KEEP_LAST:
            dropped = kept & (groups.position < groups.sizes[groups.group_of] - spec.max_length)
            kept &= ~dropped
            reason = keep_last_reason(spec.max_length)
            rule = "sequence_keep_last"
            yield from self._rejected(
                Dropped(table, np.flatnonzero(dropped), spec.order, rule, reason), files
            )
        elif spec.chunked:
            assert spec.max_length is not None
            chunk = groups.position // spec.max_length
        rows = np.flatnonzero(kept)
        if not rows.size:
            return
        group, chunk = groups.group_of[rows], chunk[rows]
        new = np.ones(rows.size, dtype=bool)
        new[1:] = (group[1:] != group[:-1]) | (chunk[1:] != chunk[:-1])
        starts = np.flatnonzero(new)
        offsets = np.append(starts, rows.size).astype(np.int64)
        first = pa.array(rows[starts])
        context = table.select(self._context_columns).take(first)
        if spec.chunked:
            context = context.append_column(CHUNK_FEATURE, pa.array(chunk[starts]))
        records = self._encoder.encode(
            context.combine_chunks().to_batches()[0],
            table.select(self._step_columns).take(pa.array(rows)).combine_chunks().to_batches()[0],
            offsets,
        )
        if self._max_record_bytes:
            sizes = np.diff(binary_parts(records)[0])
            over = sizes > self._max_record_bytes
            if over.any():
                # A sequence too large for TensorFlow's readers: every row of it is a bad row.
                for i in np.flatnonzero(over).tolist():
                    limit = self._max_record_bytes
                    reason = f"its sequence is {int(sizes[i])} bytes, over --max_record_bytes {limit}"
                    seq_rows = rows[offsets[i] : offsets[i + 1]]
                    yield from self._rejected(
                        Dropped(table, seq_rows, spec.order, "record_size", reason), files
                    )
                keep = pa.array(~over)
                records, first = records.filter(keep), first.filter(keep)
                rows = rows[np.repeat(~over, np.diff(offsets))]
                if not len(records):
                    return
        self._sequences.inc(len(records))
        # Sequences and the rows in them, summed where the bundle is written.
        yield beam.pvalue.TaggedOutput(COUNTS, (len(records), int(rows.size)))
        hashes = table.column(HASH).take(first).to_numpy()
        buckets = (hashes >> np.uint64(64 - BUCKET_BITS)).astype(np.int64)
        # A partition finer than a bucket is its part of the bucket: the batches still follow
        # the hash order, and are the same for the same number of partitions.
        sub = part & ((1 << (self._bits - BUCKET_BITS)) - 1) if self._bits > BUCKET_BITS else 0
        which = (
            np.zeros(len(records), np.int64)
            if self._splits is None
            else assign_by_hash(table.column(KEY).take(first).combine_chunks(), self._splits)
        )
        ends = np.searchsorted(buckets, np.arange((1 << BUCKET_BITS) + 1))  # sequences are in hash order
        for bucket in np.flatnonzero(np.diff(ends)).tolist():
            span = np.arange(ends[bucket], ends[bucket + 1])
            for k, split in enumerate(self._splits.names if self._splits is not None else ("",)):
                chosen = span[which[span] == k]
                if chosen.size:
                    # ((split, bucket name, part of the bucket), its SequenceExamples in hash order)
                    yield (split, f"sequences-{bucket:05d}", sub), records.take(pa.array(chosen))

    def _rejected(self, dropped: Dropped, files: list[str]) -> Iterator[Any]:
        """One dead letter per row of a rejected group (or dropped step): its file and row, the
        group's reason, and the row as conformed, strings as text (the source row went through
        the shuffle as its conformed values only)."""
        if not dropped.rows.size:
            return
        for file_index, row, record in dead_letters(dropped, _INTERNAL, self._strings):
            bad = BadRow(
                files[file_index],
                row,
                dropped.column,
                dropped.rule,
                dropped.reason,
                record.get(dropped.column),
            )
            if self._strict and dropped.rule not in POLICY_RULES:
                raise bad.error()
            self._rows_rejected.inc()
            Metrics.counter(NAMESPACE, f"rejected_{dropped.rule}").inc()
            yield beam.pvalue.TaggedOutput(REJECTED, rejected_line(bad, record))


class ToSequences(beam.PTransform):
    """Conforms source batches, groups their rows by the schema's `sequence:` key and encodes
    one tf.train.SequenceExample per group (or per chunk of `max_length` steps).

    In: `SourceBatch`es. Out: a dict of PCollections: `examples`, `((split, bucket name, part),
    records)`, a large_binary array of serialized SequenceExamples per bucket and split, in the
    bucket's group order (split "" without `splits`; a group's split is its key's salted hash);
    `rejected`, one JSON line per bad row: rows that fail conforming (as ToExamples) and every row
    of a rejected group (context differing between rows, shorter than `min_length`, longer than
    `max_length` with `longer: reject`, more than `max_group_rows` rows that cannot be cut) or
    dropped by `longer: keep_last`, each with its file, row, rule and reason; `counts`,
    (sequences, rows in them) per partition. Rows read = rows in written sequences + rows
    rejected. With `strict=True` the first bad row or group fails the pipeline with a DataError;
    rows the declared length policy leaves out (POLICY_RULES) are dead letters all the same.
    `partitions` (a power of two; `partitions_for` the input's bytes): how many groups of rows
    the shuffle makes, each held by one worker at a time. `spill_dir` (for a runner that holds a
    grouping in memory, RunnerTraits.spill): the rows wait for the shuffle in files there, and
    the shuffle holds their names; the caller deletes it once the records are written.
    `progress`: RunnerTraits.progress, where the rows read are counted. A sequence encoded larger
    than `max_record_bytes` (0: no limit) has every row rejected, rule `record_size`.
    Metrics: `recordforge/rows_read`, `rows_rejected`, `rejected_<rule>`, `sequences_written`.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        strict: bool = True,
        splits: SplitSpec | None = None,
        partitions: int = 4,
        spill_dir: str | None = None,
        progress: str | None = None,
        max_record_bytes: int = 0,
    ) -> None:
        super().__init__()
        if partitions < 1 or partitions & (partitions - 1):
            raise ValueError(f"partitions must be a power of two, not {partitions}")
        if plan.schema.sequence is None:
            raise ValueError("ToSequences needs a schema with a `sequence:` block")
        if splits is not None and (splits.column is not None or splits.key_feature is not None):
            raise ValueError("sequences are split by their key's hash: a split column or key does not apply")
        self._plan = plan
        self._strict = strict
        self._splits = splits
        self._partitions = partitions
        self._spill_dir = spill_dir
        self._progress = progress
        self._max_record_bytes = max_record_bytes

    def expand(self, batches: beam.PCollection) -> dict[str, beam.PCollection]:
        keyed = batches | "KeyRows" >> KeyRows(
            self._plan,
            strict=self._strict,
            partitions=self._partitions,
            spill_dir=self._spill_dir,
            progress=self._progress,
        )
        # rows: (partition, Fragment: conformed rows, or their file, and their keys' row counts)
        encoded = (
            keyed.rows
            | "GroupPartitions" >> beam.GroupByKey()
            | "EncodeSequences"
            >> beam.ParDo(
                _EncodePartitionFn(
                    self._plan, self._strict, self._splits, self._partitions, self._max_record_bytes
                )
            ).with_outputs(REJECTED, COUNTS, main="examples")
        )
        declare_element_type(encoded.examples, typehints.Tuple[typehints.Any, pa.Array])
        rejected = (keyed[REJECTED], encoded[REJECTED]) | "AllRejected" >> beam.Flatten()
        return {"examples": encoded.examples, REJECTED: rejected, COUNTS: encoded[COUNTS]}
