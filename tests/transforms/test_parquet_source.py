"""The Parquet source: ReadParquet on its own in a TestPipeline."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from traits_cases import CASES, traits_case
from waiting import wait_until

from recordforge.transforms import parquet_source, row_groups
from recordforge.transforms.parquet_source import ReadParquet


@pytest.mark.parametrize("case", CASES)
def test_read_parquet_gives_every_row_once_in_batches_that_know_where_they_start(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(400))}), path, row_group_size=300)
    read = pipeline | ReadParquet([str(path)], batch_size=128, traits=traits_case(case, tmp_path))
    spans = read["batches"] | beam.Map(lambda b: (b.file, b.first_row, b.batch.column("id").to_pylist()))
    starts = [0, 128, 256, 300]  # row group 0 (300 rows) in batches of 128, then row group 1
    ends = [128, 256, 300, 400]
    assert_that(
        spans, equal_to([(str(path), s, list(range(s, e))) for s, e in zip(starts, ends, strict=True)])
    )
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_read_parquet_lists_an_unreadable_file_when_asked(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    good, bad = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pq.write_table(pa.table({"id": [1, 2]}), good)
    bad.write_bytes(good.read_bytes()[:20])
    traits = traits_case(case, tmp_path)
    read = pipeline | ReadParquet([str(tmp_path / "*.parquet")], skip_unreadable=True, traits=traits)
    ids = read["batches"] | beam.FlatMap(lambda b: b.batch.column("id").to_pylist())
    assert_that(ids, equal_to([1, 2]), label="rows")
    files = read["unreadable"] | beam.Map(lambda line: json.loads(line)["file"])
    assert_that(files, equal_to([str(bad)]), label="unreadable")
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_a_rerun_does_not_read_work_items_whose_batches_are_all_finished(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    """`finished` (a killed run's batches, pieces.py): a work item all of whose batches are
    there, with as many rows, is not read; one with a batch missing or of another size is read
    whole (the conversion drops its finished batches downstream)."""
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": list(range(700))}), path, row_group_size=300)
    p = str(path)
    # Row groups [0, 300) and [300, 600) in batches of 128 rows; [600, 700) in one.
    finished = {(p, 0): 128, (p, 128): 128, (p, 256): 44, (p, 300): 128, (p, 428): 100, (p, 600): 100}
    traits = traits_case(case, tmp_path)
    read = pipeline | ReadParquet([p], batch_size=128, finished=finished, traits=traits)
    starts = read["batches"] | beam.Map(lambda b: b.first_row)
    # The first and last groups are skipped. Local workers read whole row groups: the second
    # is read whole, its (428, 100) naming the wrong rows (128). Elsewhere groups are cut into
    # pieces of a batch each here: its finished first piece is skipped too.
    want = [300, 428, 556] if traits.local else [428, 556]

    def check(got: list[int]) -> None:
        assert sorted(got) == want, got

    assert_that(starts, check)
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize("case", CASES)
def test_every_row_of_many_groups_and_files_comes_once(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    # One worker reads the next item's first batch ahead while the item before ends (below).
    paths = [str(tmp_path / f"{name}.parquet") for name in "ab"]
    for n, path in enumerate(paths):
        pq.write_table(pa.table({"id": list(range(n * 1000, n * 1000 + 700))}), path, row_group_size=200)
    read = pipeline | ReadParquet(paths, batch_size=128, traits=traits_case(case, tmp_path))
    ids = read["batches"] | beam.FlatMap(
        lambda b: [(b.file, b.first_row + i, v) for i, v in enumerate(b.batch.column("id").to_pylist())]
    )
    want = [(p, row, n * 1000 + row) for n, p in enumerate(paths) for row in range(700)]
    assert_that(ids, equal_to(want))
    pipeline.run().wait_until_finish()


def test_a_worker_alone_decodes_the_next_items_first_batch_before_it_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without claims, items come in their listed order: the next item's first batch decodes on
    the read-ahead thread while this one's last is used. Items in another order come out the
    same, each decoded once for its own reader."""
    paths = [str(tmp_path / f"{name}.parquet") for name in "ab"]
    for path in paths:
        pq.write_table(pa.table({"id": list(range(500))}), path, row_group_size=200)
    # Whole row groups, as local workers are given them (sharing.known_items).
    items = [i for p in paths for i in row_groups.work_items(p, 128, shared=True, skip_unreadable=False)]
    assert len(items) == 6
    decoded: list[tuple[str, int]] = []
    read_rows = parquet_source.read_rows

    def recorded(pf: pq.ParquetFile, group: int, **kwargs: Any) -> Iterator[pa.RecordBatch]:
        for batch in read_rows(pf, group, **kwargs):
            decoded.append((kwargs["source"].name, group))
            yield batch

    monkeypatch.setattr(parquet_source, "read_rows", recorded)

    def rows(fn: parquet_source._ReadParquetFn, item: tuple[Any, ...]) -> list[int]:
        return [v for b in fn.process(item) for v in b.batch.column("id").to_pylist()]

    fn = parquet_source._ReadParquetFn(None, 128).share(items)
    fn.setup()
    fn.start_bundle()
    for n, item in enumerate(items):
        path, group, first = item
        count = min(200, 500 - first)
        assert rows(fn, item) == list(range(first, first + count))
        if n + 1 < len(items):  # the next item's first batch, decoded before it is asked for
            after = (items[n + 1][0], items[n + 1][1])
            assert wait_until(lambda after=after: after in decoded) and decoded[-1] == after
    # Every batch decoded once: groups of 200, 200 and 100 rows in batches of 128.
    own = Counter({(p, g): n for p in paths for g, n in ((0, 2), (1, 2), (2, 1))})
    assert Counter(decoded) == own

    decoded.clear()
    for item in reversed(items):  # never the one guessed: each guess is dropped, none is given
        assert rows(fn, item) == list(range(item[2], min(item[2] + 200, 500)))
    fn.teardown()
    # Each item's own batches, and at most a first batch for each of the 5 wrong guesses.
    extra = Counter(decoded) - own
    assert not own - Counter(decoded) and sum(extra.values()) <= 5
