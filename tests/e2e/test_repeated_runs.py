"""One conversion repeated, with the CPUs idle and busy: one digest per mode where the docs promise
byte-identical shards (README, "Output"), and the same records where they promise only those."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from forked_runs import ForkedRuns
from independent import file_records

from demo.sampledata import taxi_table

SCHEMA = "examples/taxi.yaml"
# The modes README.md promises the same bytes for: the default path on a small input (one
# worker, rolling writer), and placed shards (--deterministic) on one worker and on two.
IDENTICAL = {
    "default": [],
    "deterministic-1": ["--deterministic", "--direct_num_workers", "1"],
    "deterministic-2": [
        "--deterministic",
        "--direct_num_workers",
        "2",
        "--direct_running_mode",
        "multi_processing",
    ],
}
# Rolling shards on two workers: the same records, in an order that depends on which worker
# took which work item (docs/performance.md, "GZIP bytes that differed between runs").
TWO_WORKERS = ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"]


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12,000 rows in 3 files of 4 row groups: work items for two workers to share."""
    src = tmp_path_factory.mktemp("src")
    for i in range(3):
        pq.write_table(
            taxi_table(4000, seed=i, first_id=i * 4000), src / f"t{i}.parquet", row_group_size=1000
        )
    return src


def _spin(stop: multiprocessing.synchronize.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


class _BusyCpus:
    """One spinning process per core while inside."""

    def __enter__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._procs = [context.Process(target=_spin, args=(self._stop,)) for _ in range(os.cpu_count() or 2)]
        for p in self._procs:
            p.start()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def _convert(forked: ForkedRuns, src: Path, out: Path, flags: list[str]) -> tuple[str, list[bytes]]:
    """The sha256 of the shards in order, and their records."""
    argv = ["convert", "--source", str(src / "*.parquet"), "--output", str(out), "--schema", SCHEMA,
            "--batch_size", "1024", *flags]  # fmt: skip
    (outcome,) = forked.together([(argv, 0.0)])
    assert outcome.code == 0, outcome.stderr[-3000:]
    meta = json.loads((out / "metadata.json").read_text())
    files = [out / s["file"] for s in sorted(meta["shards"], key=lambda s: s["file"])]
    digest = hashlib.sha256()
    records: list[bytes] = []
    for f in files:
        digest.update(f.read_bytes())
        records += [r for r in file_records(str(f), meta["compression"])]
    return digest.hexdigest(), records


def _repeat(forked: ForkedRuns, src: Path, root: Path, flags: list[str], runs: int) -> dict[str, list[bytes]]:
    """{digest: records} over `runs` conversions, the second half of them with every core busy."""
    seen: dict[str, list[bytes]] = {}
    for i in range(runs):
        out = root / f"out-{i}"
        if i < runs // 2:
            digest, records = _convert(forked, src, out, flags)
        else:
            with _BusyCpus():
                digest, records = _convert(forked, src, out, flags)
        seen.setdefault(digest, records)
    return seen


@pytest.mark.parametrize("mode", list(IDENTICAL))
def test_a_repeated_conversion_gives_one_digest(
    forked: ForkedRuns, source: Path, tmp_path: Path, mode: str
) -> None:
    """Six runs on every `make test` (three idle, three busy); `make stress` runs 200."""
    seen = _repeat(forked, source, tmp_path, IDENTICAL[mode], 6)
    assert len(seen) == 1, f"{len(seen)} digests in 6 runs"


def test_two_rolling_workers_write_the_same_records(forked: ForkedRuns, source: Path, tmp_path: Path) -> None:
    seen = _repeat(forked, source, tmp_path, TWO_WORKERS, 6)
    orders = {tuple(records) for records in seen.values()}
    assert len(orders) == len(seen)  # where the bytes differ, the order of the records does
    assert len({tuple(sorted(records)) for records in seen.values()}) == 1


@pytest.mark.stress
@pytest.mark.parametrize("mode", list(IDENTICAL))
def test_200_conversions_give_one_digest(forked: ForkedRuns, source: Path, tmp_path: Path, mode: str) -> None:
    seen = _repeat(forked, source, tmp_path, IDENTICAL[mode], 200)
    assert len(seen) == 1, f"{len(seen)} digests in 200 runs"
