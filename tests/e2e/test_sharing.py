"""Work sharing between local workers: every row is read exactly once, whoever reads it, and a worker
that is done early takes over work the others have not reached."""

from __future__ import annotations

import glob
import json
import multiprocessing
import pickle
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.utils.windowed_value import WindowedValue
from independent import file_records

from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.convert import build, run
from recordforge.pipelines.resolve import request_from_argv, resolve
from recordforge.records.tfrecord import detect_compression
from recordforge.runners.session import runner_traits
from recordforge.transforms.csv_ranges import whole
from recordforge.transforms.csv_source import _ReadCsvFn
from recordforge.transforms.image_folder import ImageFolder, _carried, _LocalChunkFn
from recordforge.transforms.parquet_source import _ReadParquetFn
from recordforge.transforms.sharing import Claims
from recordforge.transforms.source_types import SourceBatch

TWO_WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


def _claim_all(folder: str, names: list[str], queue: Any) -> None:
    claims = Claims(folder)
    queue.put([n for n in names if claims.claim(n)])


def test_each_name_is_claimed_by_exactly_one_process(tmp_path: Path) -> None:
    names = [f"item-{i}" for i in range(300)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_claim_all, args=(str(tmp_path), names, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    won = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert Counter(n for w in won for n in w) == Counter(names)  # each once, none missing
    assert Claims(str(tmp_path)).claimed("item-7") and not Claims(str(tmp_path)).claimed("other")


def _claims(tmp_path: Path) -> str:
    """A run's claims folder, as `runners.session` makes it."""
    (tmp_path / "claims").mkdir(exist_ok=True)
    return str(tmp_path / "claims")


def _workers(fn: Any, n: int) -> list[Any]:
    """`n` copies of one DoFn, as n worker processes would unpickle it."""
    fns = [pickle.loads(pickle.dumps(fn)) for _ in range(n)]
    for fn in fns:
        fn.setup()
        fn.start_bundle()
    return fns


def _values(outputs: Iterator[Any]) -> Iterator[Any]:
    for out in outputs:
        yield out.value if isinstance(out, WindowedValue) else out


def _ids(batches: list[SourceBatch]) -> list[int]:
    return [i for b in batches for i in b.batch.column("id").to_pylist()]


def test_an_idle_worker_takes_the_tail_of_a_row_group_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array(range(1000), pa.int64())}), path, row_group_size=400)
    items = [(str(path), 0, 0), (str(path), 1, 400), (str(path), 2, 800)]
    a, b = _workers(_ReadParquetFn(None, 50, claims=_claims(tmp_path)), 2)
    # a holds row group 0 and has read 3 of its 8 batches when b is done with row group 1.
    a_out = a.process(items[0], items)
    got_a = [next(a_out) for _ in range(3)]
    got_b = list(b.process(items[1], items))
    assert _ids(got_b) == list(range(400, 800))
    # b's end of bundle: row group 2 (nobody started it), then batches of row group 0 from its
    # end, one at a time while a goes on from its side.
    b_end = _values(b.finish_bundle())
    got_b += [next(b_end) for _ in range(4)]  # all of row group 2 (200 rows)
    assert _ids(got_b[-4:]) == list(range(800, 1000))
    running = [(a_out, got_a), (b_end, got_b)]
    while running:  # a batch each in turn, as two equally fast workers would
        for gen, got in list(running):
            batch = next(gen, None)
            if batch is None:
                running.remove((gen, got))
            else:
                got.append(batch)
    assert list(_values(a.finish_bundle())) == []  # nothing left for a
    assert sorted(_ids(got_a) + _ids(got_b)) == list(range(1000))  # every row once
    # They met in the middle of what was left: a took batches 3-5, b batches 7 and 6.
    assert sorted(set(_ids(got_b)) & set(range(400))) == list(range(300, 400))
    assert _ids(got_a) == list(range(300))
    first_rows = {b.first_row: b.batch.num_rows for b in got_a + got_b}
    assert all(first_rows[r] == 50 for r in range(0, 1000, 50))  # batches keep their rows' place


@pytest.mark.parametrize("claims", [None, "never made"])
def test_without_a_claims_folder_each_worker_reads_its_own_part(tmp_path: Path, claims: str | None) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": pa.array(range(100), pa.int64())}), path, row_group_size=50)
    items = [(str(path), 0, 0), (str(path), 1, 50)]
    # No folder named, or one named that the run did not make (run without `runners.session`).
    fn = _ReadParquetFn(None, 20, claims=claims and str(tmp_path / claims))
    fn.setup()
    fn.start_bundle()
    assert _ids(list(fn.process(items[0], items))) == list(range(50))
    assert list(fn.finish_bundle()) == []  # nothing taken over: row group 1 is someone else's


def test_csv_files_and_image_chunks_are_claimed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = []
    for i in range(3):
        path = tmp_path / f"f{i}.csv"
        path.write_text("id\n" + "".join(f"{i * 10 + k}\n" for k in range(10)))
        files.append(whole(str(path)))  # a file read whole: one work item
    a, b = _workers(_ReadCsvFn({"id": pa.int64()}, 1 << 20, claims=_claims(tmp_path)), 2)
    got_a = list(a.process(files[0], files))
    got_b = list(b.process(files[1], files)) + list(_values(b.finish_bundle()))  # and file 2
    got_a += list(_values(a.finish_bundle()))
    assert sorted(_ids(got_a)) == list(range(10)) and sorted(_ids(got_b)) == list(range(10, 30))

    # An object store's listing (sizes listed), its chunks carrying their part of it.
    groups = [("gs://b/root/x", [f"img{k:02d}.png" for k in range(16)], "x", "")]
    folder = ImageFolder("gs://b/root", groups, ["x"], [], [100] * 16, 0.0)
    chunks = [_carried(folder, (first, 4)) for first in (0, 4, 8, 12)]
    c, d = _workers(_LocalChunkFn(folder, 1 << 20, held=False, claims=_claims(tmp_path)), 2)
    got_c = list(c.process(chunks[0], chunks)) + list(c.process(chunks[2], chunks))
    got_d = list(d.process(chunks[1], chunks)) + list(_values(d.finish_bundle()))
    got_c += list(_values(c.finish_bundle()))
    assert [b.first_row for b in got_c] == [0, 8] and [b.first_row for b in got_d] == [4, 12]
    assert [p for b in got_d for p in b.batch.column("path").to_pylist()] == [
        f"gs://b/root/x/img{k:02d}.png" for k in (*range(4, 8), *range(12, 16))
    ]
    # A chunk that another worker claimed in its end of bundle is not read again by its owner.
    e, f = _workers(_LocalChunkFn(folder, 1 << 20, held=False, claims=_claims(tmp_path)), 2)
    assert [b.first_row for b in e.process(chunks[0], chunks)] == [0]
    assert sorted(b.first_row for b in _values(e.finish_bundle())) == [4, 8, 12]
    assert list(f.process(chunks[1], chunks)) == [] and list(f.finish_bundle()) == []


def _records(output: Path) -> tuple[Counter, list[int]]:
    meta = json.loads((output / "metadata.json").read_text())
    paths = [str(output / s["file"]) for s in meta["shards"]]
    records = Counter(r for p in paths for r in file_records(p, detect_compression(p)))
    return records, sorted(s["records"] for s in meta["shards"])


def _one_and_two_workers(args: list[str], tmp_path: Path) -> tuple[Counter, Counter, list[int], str]:
    """Records written by one in-process worker and by two forked ones (in a fresh process, the
    only kind that forks), the two-worker run's rows per shard and its log (--debug)."""
    run([*args, "--output", str(tmp_path / "one")])
    two = tmp_path / "two"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "recordforge",
            "convert",
            *args,
            "--output",
            str(two),
            *TWO_WORKERS,
            "--debug",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one_records, _ = _records(tmp_path / "one")
    two_records, shard_rows = _records(two)
    return one_records, two_records, shard_rows, proc.stderr


def test_two_workers_share_an_uneven_file(tmp_path: Path) -> None:
    # One big row group and three small ones: the worker given two small ones is done long before
    # the one reading the big group, and takes over the end of it.
    path = tmp_path / "uneven.parquet"
    writer = pq.ParquetWriter(path, pa.schema([("id", pa.int64()), ("v", pa.float64())]))
    start = 0
    for rows in (40000, 10, 10, 10):
        ids = pa.array(range(start, start + rows), pa.int64())
        writer.write_table(
            pa.table({"id": ids, "v": pa.array([i * 0.5 for i in range(start, start + rows)])})
        )
        start += rows
    writer.close()
    args = ["--source", str(path), "--batch_size", "100"]
    one_records, two_records, _, log = _one_and_two_workers(args, tmp_path)
    assert sum(one_records.values()) == 40030
    assert two_records == one_records  # every record once, byte for byte
    # The worker done with the small groups took over the end of the big one.
    taken = re.findall(r"took over the last (\d+) batches of \S+ row group 0", log)
    assert len(taken) == 1 and int(taken[0]) > 10, log[-3000:]


def test_two_workers_share_an_image_folder(tmp_path: Path) -> None:
    from demo.sampledata import mnist_folder

    written = mnist_folder(str(tmp_path / "digits"), per_class=350)  # two chunks: 4096 and 104 names
    args = ["--source", str(tmp_path / "digits"), "--format", "images"]
    one_records, two_records, _, _ = _one_and_two_workers(args, tmp_path)
    assert sum(one_records.values()) == len(written) == 4200
    assert two_records == one_records  # every image once, byte for byte


def test_two_workers_share_csv_files(tmp_path: Path) -> None:
    # Three files of different lengths: each is read whole by the worker that claims it.
    for i, rows in enumerate((3000, 20, 500)):
        lines = ["id,name"] + [f"{i * 10000 + r},n{r}" for r in range(rows)]
        (tmp_path / f"part{i}.csv").write_text("\n".join(lines) + "\n")
    args = ["--source", str(tmp_path / "part*.csv")]
    one_records, two_records, shard_rows, _ = _one_and_two_workers(args, tmp_path)
    assert sum(one_records.values()) == 3520
    assert two_records == one_records  # every row once, byte for byte
    assert sum(shard_rows) == 3520


# Beam's own local runner: a runner that does not share work, as Dataflow and Dask do not.
STOCK_RUNNER = "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"


@pytest.mark.parametrize(
    ("flags", "local"),
    [
        ([], True),  # one worker: as several, without splitting CSV files (RunnerTraits.workers)
        (TWO_WORKERS, True),
        (["--direct_num_workers=2"], True),  # in_memory: in-process workers, with claims too
        (["--runner=DirectRunner"], False),
        ([STOCK_RUNNER, "--direct_num_workers=2"], False),
    ],
)
def test_how_workers_get_the_input(parquet_source: str, flags: list[str], local: bool) -> None:
    """RecordForge's local runner reads row groups listed at construction, known to each worker
    from the start (no stage before the reads, no Reshuffle); any other runner lists them on
    workers and reshuffles them. The readers are told the runner's traits, nothing else."""
    options = request_from_argv(["--source", parquet_source, "--output", "/unused", *flags]).options
    assert runner_traits(options).local == local
    pipeline = beam.Pipeline(options=options)
    build(
        pipeline,
        resolve(
            pipeline.options, ConvertConfig(sources=(parquet_source,), output="/unused"), look_at_output=False
        ),
    )
    names = {t.unique_name for t in pipeline.to_runner_api().components.transforms.values()}
    assert ("Read/Spread" in names) == ("Read/Files" in names) == (not local)
    reads: list[Any] = []

    class Find(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node: Any) -> None:
            if node.full_label.startswith("Read/Read/"):
                reads.append(node.transform.fn)

    pipeline.visit(Find())
    # Three files of 700 rows in groups of 300, in path order.
    files = sorted(glob.glob(parquet_source))
    groups = [(path, i, 300 * i) for path in files for i in range(3)]
    assert [r._known for r in reads] == [groups if local else None]
