"""The placed writer (transforms/placed.py, through WriteTFRecords): shard s of S holds the
places [sN/S, (s+1)N/S): the records in input order (by position) or permuted (by a seed)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import BeamAssertException, assert_that
from conftest import DEFAULT_RUNNER

from recordforge.errors import RecordForgeError
from recordforge.output.destination import Kept
from recordforge.output.placed_pieces import PlacedKeep, layout_digest
from recordforge.output.shard_files import write_shard
from recordforge.records.shard_format import TFRecordFormat
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.tfrecord import ShardInfo, iter_records
from recordforge.transforms.sinks import WriteTFRecords

# Two files of 4 batches of 100 records, created out of order; records name their position.
# Edge cases among them: an empty record, bytes that are not UTF-8, a zero byte.
N = 800
RECORDS = [b"", b"\xff\xfe\x00", b"0"] + [f"record {i}".encode() * (i % 5) for i in range(3, N)]
BATCHES = [
    (("data", f"f{i // 4}.parquet", (i % 4) * 100), RECORDS[i * 100 : (i + 1) * 100]) for i in range(8)
]


def _write(
    tmp_path: Path, spec: ShardSpec, check: Callable[[list[list[bytes]]], None], *, spill: bool
) -> Path:
    out = tmp_path / "out"
    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
        batches = p | beam.Create([(key, pa.array(r, pa.large_binary())) for key, r in reversed(BATCHES)])
        shards = batches | WriteTFRecords(str(out), spec, spill=spill)

        def read(got: list[list[ShardInfo]]) -> None:
            shards = sorted(got[0], key=lambda s: s.path)
            if len(shards) != spec.count:
                raise BeamAssertException(f"{len(shards)} shards, not {spec.count}")
            records = [list(iter_records(s.path, "gzip", check_crc=True)) for s in shards]
            if [len(r) for r in records] != [s.records for s in shards]:
                raise BeamAssertException("shards not described as written")
            check(records)

        assert_that(shards | beam.combiners.ToList(), read)
    return out


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("count", [1, 3, 7, N + 5])
@pytest.mark.parametrize("spill", [False, True])
def test_by_position_shard_s_holds_its_run_of_the_input(tmp_path: Path, count: int, spill: bool) -> None:
    def check(shards: list[list[bytes]]) -> None:
        expected = [RECORDS[s * N // count : (s + 1) * N // count] for s in range(count)]
        if shards != expected:
            raise BeamAssertException(f"shards of {[len(s) for s in shards]} records")

    _write(tmp_path, ShardSpec(Sizing.PLACED, "gzip", count=count), check, spill=spill)


def test_by_position_a_shard_of_whole_batches_is_written_as_those_batches(tmp_path: Path) -> None:
    # 4 shards of 2 batches: each shard is the bytes of its batches written one after the other.
    out = _write(tmp_path, ShardSpec(Sizing.PLACED, "gzip", count=4), lambda _: None, spill=True)
    for s, digest in enumerate(_digests(out).values()):
        arrays = [pa.array(r, pa.large_binary()) for _, r in BATCHES[2 * s : 2 * s + 2]]
        temp, _ = write_shard(str(tmp_path / f"expected-{s}"), arrays, TFRecordFormat("gzip"))
        assert temp.sha256 == digest


def test_by_seed_the_records_are_a_balanced_permutation_and_the_same_bytes_spilled_or_not(
    tmp_path: Path,
) -> None:
    seen: list[list[list[bytes]]] = []

    def check(shards: list[list[bytes]]) -> None:
        if sorted(r for s in shards for r in s) != sorted(RECORDS):
            raise BeamAssertException("records lost or doubled")
        if [len(s) for s in shards] != [N // 4] * 4 or [r for s in shards for r in s] == RECORDS:
            raise BeamAssertException("unbalanced, or not shuffled")

    spec = ShardSpec(Sizing.PLACED, "gzip", count=4, seed=7)
    one = _digests(_write(tmp_path / "a", spec, check, spill=True))
    assert one == _digests(_write(tmp_path / "b", spec, check, spill=False))
    other = ShardSpec(Sizing.PLACED, "gzip", count=4, seed=8)
    assert one != _digests(_write(tmp_path / "c", other, seen.append, spill=False))


def test_the_placed_writer_refuses_a_rolling_spec(tmp_path: Path) -> None:
    from recordforge.output.shard_files import ShardFiles
    from recordforge.transforms.placed import write_placed

    files = ShardFiles.beside(str(tmp_path / "data"), TFRecordFormat("none"))
    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p, pytest.raises(ValueError, match="not count"):
        write_placed(p | beam.Create([]), files, ShardSpec(Sizing.COUNT, "none", count=2), spill=False)


def _place(out: Path, spec: ShardSpec, batches: list, **kwargs: object) -> None:
    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
        keyed = p | beam.Create([(key, pa.array(r, pa.large_binary())) for key, r in batches])
        _ = keyed | WriteTFRecords(str(out), spec, **kwargs)  # type: ignore[arg-type]


def _records(folder: Path, kind: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob(f"{kind}-*.json"))]


@pytest.mark.parametrize("spill", [False, True])
def test_a_rerun_keeps_finished_shards_and_writes_only_the_others(tmp_path: Path, spill: bool) -> None:
    spec = ShardSpec(Sizing.PLACED, "gzip", count=4)
    whole = _digests(_write(tmp_path / "whole", spec, lambda _: None, spill=spill))
    # A killed run's record: its layout, and shards 0 and 2 (batches 0-1 and 4-5) finished.
    pieces = tmp_path / "pieces"
    _place(tmp_path / "first", spec, BATCHES, spill=spill, pieces=str(pieces))
    (recorded,) = {json.dumps(r) for r in _records(pieces, "placed")}  # one layout, however many workers
    batches = [[f, first, len(r)] for (_, f, first), r in sorted(BATCHES, key=lambda b: b[0])]
    assert json.loads(recorded) == {"writer": "data", "count": 4, "layout": batches}
    assert sorted(r["shard"] for r in _records(pieces, "shard")) == [0, 1, 2, 3]
    kept = []
    for s in (0, 2):
        arrays = [pa.array(r, pa.large_binary()) for _, r in BATCHES[2 * s : 2 * s + 2]]
        temp, _ = write_shard(str(tmp_path / f"kept-{s}.part"), arrays, TFRecordFormat("gzip"))
        kept.append(
            (s, {"tmp": temp.tmp, "records": temp.records, "bytes": temp.bytes, "sha256": temp.sha256})
        )
    skipped = tuple((f, first, 100) for (_, f, first), _ in (BATCHES[0], BATCHES[1], BATCHES[4], BATCHES[5]))
    keep = PlacedKeep(4, layout_digest(batches), tuple(kept), skipped)
    rest = [b for i, b in enumerate(BATCHES) if i in (2, 3, 6, 7)]
    again = tmp_path / "again"
    _place(tmp_path / "rerun", spec, rest, spill=spill, pieces=str(again), kept=Kept(placed=keep))
    assert _digests(tmp_path / "rerun") == whole
    assert sorted(r["shard"] for r in _records(again, "shard")) == [1, 3]  # the kept ones not rewritten


def test_a_rerun_whose_counts_are_not_the_killed_runs_publishes_nothing(tmp_path: Path) -> None:
    spec = ShardSpec(Sizing.PLACED, "gzip", count=4)
    other = layout_digest([["f0.parquet", 0, 99]])
    keep = PlacedKeep(4, other, ((0, {"tmp": "x", "records": 1, "bytes": 1, "sha256": "0"}),))
    with pytest.raises(RecordForgeError, match="records per batch differ"):
        _place(tmp_path / "out", spec, BATCHES, spill=False, kept=Kept(placed=keep))
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("data-*"))
