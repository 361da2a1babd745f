"""`recordforge plan`: what a conversion will read, write and cost, estimated before any data moves."""

from __future__ import annotations

import math
import os
import struct
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recordforge.conforming.conform import conform_batch
from recordforge.errors import RecordForgeError
from recordforge.files.storage import is_local, open_read
from recordforge.pipelines.resolve import Request, Run, resolve, split_share
from recordforge.records.encoding import ExampleEncoder
from recordforge.records.shard_format import shard_format
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.sources.probe import csv_reader, open_source, read_sample

__all__ = [
    "ConversionPlan",
    "SplitPlan",
    "estimate",
    "parquet_footer",
    "plan_lines",
    "plan_request",
    "plan_run",
]

SAMPLE_ROWS = 4096  # rows `plan` converts through the real encoder and compressor
# A conversion's own estimate, made before every run: a smaller sample (its cost, ~10 ms, is
# paid by every conversion; its bytes per row are within a few percent of the larger one's).
RUN_SAMPLE_ROWS = 1024
SAMPLE_IMAGES = 64
# A run's fixed cost locally (start-up, listing, the commit), and what the driver holds.
_FIXED_SECONDS = 1.5
_DRIVER_MB = 350
_WORKER_MB = 200
_SMALL_SHARD = 10 << 20
_LARGE_SHARD = 2 << 30
_MANY_SHARDS = 10_000


@dataclass(frozen=True)
class SplitPlan:
    """One split's (or the whole output's) estimate."""

    name: str
    rows: int | None
    output_bytes: int | None
    shards: int | None


@dataclass(frozen=True)
class ConversionPlan:
    """A conversion's estimate: what is exact says so (`rows_exact`), the rest is measured on a
    sample of the input converted through the real encoder and shard writer."""

    output: str
    source_format: str
    output_format: str
    compression: str
    files: int
    input_bytes: int | None
    rows: int | None
    rows_exact: bool
    splits: tuple[SplitPlan, ...]
    sample_rows: int
    output_bytes_per_row: float | None
    largest_record: int | None
    work_items: int | None
    workers: int
    seconds: float | None
    peak_memory_mb: int | None
    cost: dict[str, Any] | None = None  # on a runner that bills for the job (the runner adapter's)
    warnings: tuple[str, ...] = ()
    up_to_date: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def output_bytes(self) -> int | None:
        sizes = [s.output_bytes for s in self.splits]
        return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)

    @property
    def shards(self) -> int | None:
        counts = [s.shards for s in self.splits]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(output_bytes=self.output_bytes, shards=self.shards)
        return out

    def recorded(self) -> dict[str, Any]:
        """What metadata.json keeps of the estimate beside what happened: the deterministic part
        (the same input and flags give the same figures)."""
        return {
            "rows": self.rows,
            "rows_exact": self.rows_exact,
            "output_bytes": self.output_bytes,
            "shards": self.shards,
            "largest_record": self.largest_record,
            "sample_rows": self.sample_rows,
        }


def plan_request(request: Request) -> ConversionPlan:
    """The plan of the conversion `request` asks for: resolved as `convert` resolves it (raising
    where a run would fail before moving data), reading only."""
    return plan_run(resolve(request.options, request.config, every_core=request.every_core))


def plan_run(run: Run, *, timed: bool = True, sample_rows: int = SAMPLE_ROWS) -> ConversionPlan:
    """The estimate for a resolved run (which has checked everything a run checks before data
    moves). `timed`: also time the sample for a wall-time estimate (not kept in metadata)."""
    config, inputs = run.config, run.inputs
    notes: list[str] = []
    sample, sample_bytes, largest, seconds_per_row = _sample(run, notes, timed=timed, rows=sample_rows)
    per_row = sample_bytes / sample if sample else None
    rows, exact, items = _rows(run)
    splits = []
    for name, spec in run.shards.items():
        share = split_share(run.splits, run.shares, name)
        split_rows = None if rows is None else (rows if share == 1.0 else round(rows * share))
        size = None if split_rows is None or per_row is None else round(split_rows * per_row)
        splits.append(SplitPlan(name, split_rows, size, _shard_count(spec, split_rows, size)))
    workers = max(1, run.traits.workers or 1)
    busy = min(workers, items) if items else workers
    seconds = None
    if rows is not None and seconds_per_row is not None:
        seconds = round(_FIXED_SECONDS + rows * seconds_per_row / busy, 1)
    memory = None
    if per_row is not None:
        batch = config.batch_size * per_row * 4  # a batch read, conformed, encoded and buffered
        memory = round(_DRIVER_MB + (workers if workers > 1 else 0) * _WORKER_MB + workers * batch / 1e6)
    cost = run.runner.cost(rows=rows, seconds_per_row=seconds_per_row, items=items)
    plan = ConversionPlan(
        output=run.output,
        source_format=inputs.fmt,
        output_format=config.output_format,
        compression=run.compression,
        files=len(inputs.files) if inputs.folder is None else int(inputs.folder.count),
        input_bytes=_input_bytes(run),
        rows=rows,
        rows_exact=exact,
        splits=tuple(splits),
        sample_rows=sample,
        output_bytes_per_row=round(per_row, 2) if per_row is not None else None,
        largest_record=largest,
        work_items=items,
        workers=workers,
        seconds=seconds,
        peak_memory_mb=memory,
        cost=cost,
        up_to_date=run.up_to_date is not None,
        notes=tuple(notes),
    )
    return _with_warnings(plan, config.max_record_bytes)


def _with_warnings(plan: ConversionPlan, max_record_bytes: int) -> ConversionPlan:
    warn = []
    for split in plan.splits:
        if not split.shards or split.output_bytes is None:
            continue
        average = split.output_bytes / split.shards
        if split.shards > 1 and average < _SMALL_SHARD:
            warn.append(
                f"split {split.name}: {split.shards} shards of about {average / 1e6:.1f} MB: under 10 MiB "
                "each, readers open more files than they need (raise --shard_size or lower --num_shards)"
            )
        if average > _LARGE_SHARD:
            warn.append(
                f"split {split.name}: shards of about {average / 1e9:.1f} GB: over 2 GiB each "
                "(lower --shard_size or raise --num_shards)"
            )
    if (plan.shards or 0) > _MANY_SHARDS:
        warn.append(f"{plan.shards} shards: over {_MANY_SHARDS:,} files (raise --shard_size)")
    warn += plan.notes
    if max_record_bytes and plan.largest_record and plan.largest_record > max_record_bytes:
        warn.append(
            f"a sampled record is {plan.largest_record} bytes, over --max_record_bytes {max_record_bytes}: "
            "such rows are bad rows (rule record_size)"
        )
    return ConversionPlan(**{**_fields(plan), "warnings": tuple(warn)})


def _fields(plan: ConversionPlan) -> dict[str, Any]:
    return {name: getattr(plan, name) for name in plan.__dataclass_fields__}


def _shard_count(spec: ShardSpec, rows: int | None, size: int | None) -> int | None:
    """As the writers cut shards: placed and counted writers make `count`; the rolling writer a
    shard per `max_bytes` (or `max_records`) of records, none for an empty split."""
    if spec.sizing in (Sizing.PLACED, Sizing.COUNT):
        return spec.count
    if rows is None or size is None:
        return None
    if rows == 0:
        return 0
    by_records = math.ceil(rows / spec.max_records) if spec.max_records else 0
    by_bytes = math.ceil(size / spec.max_bytes) if spec.max_bytes else 1
    return max(1, by_records, by_bytes)


def _input_bytes(run: Run) -> int | None:
    if run.inputs.folder is not None and run.inputs.folder.sizes is not None:
        return int(sum(run.inputs.folder.sizes))
    sizes = [f.size for f in run.inputs.files]
    return None if any(s is None for s in sizes) else sum(s or 0 for s in sizes)


def _rows(run: Run) -> tuple[int | None, bool, int | None]:
    """(rows, exact, work items): Parquet's and ORC's from their footers, an Arrow file's from its
    batches, an image folder's from its listing; CSV and JSON Lines estimated from first lines."""
    inputs = run.inputs
    batch = run.config.batch_size
    if inputs.folder is not None:
        count = int(inputs.folder.count)
        return count, True, math.ceil(count / batch)
    if inputs.fmt in ("parquet", "delta"):  # a Delta snapshot is its Parquet files
        try:
            footers = [parquet_footer(f.path) for f in inputs.files]
        except (OSError, ValueError, pa.ArrowException):
            return None, False, len(inputs.files)  # an unreadable file: its reader reports it, or skips it
        rows = sum(m.num_rows for m in footers)
        return rows, True, sum(max(1, m.num_row_groups) for m in footers)
    if inputs.fmt in ("orc", "arrow"):
        try:
            counted = [_table_rows(f.path, inputs.fmt) for f in inputs.files]
        except (OSError, ValueError, pa.ArrowException):
            return None, False, len(inputs.files)
        if all(c is not None for c in counted):
            return sum(c[0] for c in counted if c), True, sum(c[1] for c in counted if c)
        return None, False, len(inputs.files)
    if inputs.fmt in ("csv", "jsonl"):
        total = 0
        for f in inputs.files:
            estimated = _line_rows(f.path, f.size, header=inputs.fmt == "csv")
            if estimated is None:
                return None, False, None
            total += estimated
        return total, False, len(inputs.files)
    return None, False, len(inputs.files)


def parquet_footer(path: str) -> pq.FileMetaData:
    """A Parquet file's footer, reading its last 8 bytes and the footer alone (pyarrow's own open
    reads a 64 KiB tail, row data with it in a small file)."""
    with open_read(path) as f:
        f.seek(-8, os.SEEK_END)
        tail = f.read(8)
        size = struct.unpack("<i", tail[:4])[0]
        if tail[4:] != b"PAR1" or size <= 0:
            return pq.ParquetFile(path).metadata  # not plain Parquet (encrypted footer): its own reader says
        f.seek(-8 - size, os.SEEK_END)
        footer = f.read(size)
    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer + tail))


def _table_rows(path: str, fmt: str) -> tuple[int, int] | None:
    """(rows, units of work) of an ORC file (its footer) or an Arrow IPC file (its batches'
    metadata); None for an Arrow stream, which has no footer to count from."""
    if fmt == "orc":
        import pyarrow.orc as orc

        f = orc.ORCFile(path)
        return f.nrows, max(1, f.nstripes)
    import pyarrow.ipc as ipc

    source = pa.memory_map(path) if is_local(path) else open_read(path)
    try:
        reader = ipc.open_file(source)
    except pa.ArrowInvalid:
        return None  # a stream: counted only by reading it
    batches = reader.num_record_batches
    return sum(reader.get_batch(i).num_rows for i in range(batches)), max(1, batches)


def _line_rows(path: str, size: int | None, *, header: bool) -> int | None:
    """A CSV or JSON Lines file's rows, from the bytes per line of its first MiB (uncompressed
    files only; a CSV file's header line is not a row)."""
    if size is None or path.lower().endswith((".gz", ".bz2", ".zst")):
        return None
    with open_source(path) as f:
        head = f.read(1 << 20)
    lines = head.count(b"\n")
    skip = 1 if header else 0
    if len(head) >= size:  # the whole file: counted
        return max(0, (lines if head.endswith(b"\n") else lines + 1) - skip)
    if not lines:
        return None
    return max(0, round(size / (len(head) / lines)) - skip)


def _sample(
    run: Run, notes: list[str], *, timed: bool, rows: int
) -> tuple[int, int, int | None, float | None]:
    """(rows, bytes written, largest record, seconds per row on one core) of a sample of the
    input conformed, encoded and written by the run's own shard format, into a local temporary
    file (the output is not touched)."""
    try:
        batch = _sample_batch(run, rows)
    except (RecordForgeError, OSError, ValueError, pa.ArrowException) as exn:
        notes.append(f"no sample could be read ({exn}): output bytes and time not estimated")
        return 0, 0, None, None
    if batch is None or batch.num_rows == 0:
        return 0, 0, None, None
    encoder = ExampleEncoder(run.plan)
    spec = next(iter(run.shards.values()))
    rejected: list[Any] = []

    def convert() -> tuple[int, int, int | None]:
        conformed = conform_batch(
            batch, run.plan, file=run.inputs.files[0].path, first_row=0, text_lists=run.inputs.fmt == "csv"
        )
        rejected[:] = conformed.rejected
        records = encoder.encode(conformed.batch)
        fmt = shard_format(spec)
        with tempfile.TemporaryDirectory(prefix="recordforge-plan-") as tmp:
            writer = fmt.open(os.path.join(tmp, "sample" + fmt.suffix))
            framed = fmt.frame(records)
            writer.write(framed, 0, len(records))
            shard, _ = writer.close()
        sizes = pc.binary_length(records)
        largest = pc.max(sizes).as_py() if len(records) else None
        return conformed.batch.num_rows, shard.bytes, largest

    try:
        rows, written, largest = convert()
    except (RecordForgeError, OSError, ValueError, pa.ArrowException) as exn:
        # The run's reader reports a file it cannot read its own way, where it reads it.
        notes.append(f"the sample could not be converted ({exn}): output bytes and time not estimated")
        return 0, 0, None, None
    seconds = None
    if timed and rows:
        start = time.perf_counter()
        convert()  # again, warm: the first call pays for imports and first-use setup
        seconds = (time.perf_counter() - start) / rows
    if rejected:
        first = rejected[0].error()
        notes.append(f"{len(rejected)} of the {batch.num_rows} sample rows are bad rows; the first: {first}")
    return rows, written, largest, seconds


def _sample_batch(run: Run, limit: int) -> pa.RecordBatch | None:
    inputs = run.inputs
    if inputs.folder is not None:
        from recordforge.transforms.image_folder import chunk_at

        folder = inputs.folder
        count = int(folder.count)
        step = max(1, count // SAMPLE_IMAGES)
        parts = [chunk_at(folder, i, 1, folder.labels) for i in range(0, count, step)][:SAMPLE_IMAGES]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0] if parts else None
    path = inputs.files[0].path
    if inputs.fmt == "csv":
        types = dict(run.plan.csv_column_types)
        with open_source(path) as f:
            reader = csv_reader(f, types)
            batches, rows = [], 0
            for b in reader:
                batches.append(b)
                rows += b.num_rows
                if rows >= limit:
                    break
        table = pa.Table.from_batches(batches, schema=reader.schema)
    else:
        # A Delta snapshot's rows are its Parquet files' (a partitioned table's partition columns
        # are the reader's to add: the sample then says it could not be converted).
        table = read_sample(path, "parquet" if inputs.fmt == "delta" else inputs.fmt, limit)
    table = table.slice(0, limit).combine_chunks()
    return table.to_batches()[0] if table.num_rows else None


def estimate(run: Run) -> ConversionPlan:
    """The estimate a conversion records beside what it did (no timing: deterministic)."""
    return plan_run(run, timed=False, sample_rows=RUN_SAMPLE_ROWS)


def plan_lines(plan: ConversionPlan) -> list[str]:
    """The plan as `recordforge plan` prints it."""
    mb = 1e6

    def size(n: int | None) -> str:
        return "?" if n is None else (f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / mb:.1f} MB")

    def count(n: int | None) -> str:
        return "?" if n is None else f"{n:,}"

    lines = [f"plan for {plan.output} ({plan.source_format} -> {plan.output_format}, {plan.compression})"]
    if plan.up_to_date:
        lines.append("  up to date: a run would convert nothing (--if_changed or --append)")
    how = (
        "exact, from the Parquet footers"
        if plan.rows_exact and plan.source_format == "parquet"
        else ("exact" if plan.rows_exact else "estimated from the first lines")
    )
    lines.append(
        f"  input: {count(plan.files)} files, {size(plan.input_bytes)}, {count(plan.rows)} rows ({how})"
    )
    for s in plan.splits:
        lines.append(
            f"  split {s.name}: {count(s.rows)} rows -> {size(s.output_bytes)} in {count(s.shards)} shards"
        )
    per_row = "?" if plan.output_bytes_per_row is None else f"{plan.output_bytes_per_row:.1f}"
    lines.append(
        f"  measured on {count(plan.sample_rows)} sample rows: {per_row} output bytes per row; "
        f"largest record {count(plan.largest_record)} bytes"
    )
    spread = "" if not plan.work_items else f", about {math.ceil(plan.work_items / plan.workers):,} each"
    lines.append(f"  work: {count(plan.work_items)} items over {plan.workers} workers{spread}")
    if plan.seconds is not None:
        lines.append(
            f"  on this machine: about {plan.seconds:.0f} s, "
            f"peak memory about {plan.peak_memory_mb} MB (rough)"
        )
    if plan.cost is not None:
        d = plan.cost
        lines.append(
            f"  {d['runner']}: {d['workers']} x {d['machine_type']} workers, "
            f"{d['worker_hours']:.2f} worker-hours, about ${d['cost_usd']:.2f} "
            f"({d['region']} list prices of {d['prices_date']}: {d['prices_source']})"
        )
    lines += [f"  warning: {w}" for w in plan.warnings]
    return lines
