"""The rolling writer (transforms/rolling.py): parts as bundles leave them, then the three
planners (by bytes, by records, by count) joining them; and the whole writer in a pipeline."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import BeamAssertException, assert_that
from conftest import DEFAULT_RUNNER, tf_raw_records
from record_cases import sample_records

from recordforge.output.shard_plans import FULL_FRACTION, Limits, Part, plan
from recordforge.records.shard_format import TFRecordFormat
from recordforge.records.shard_spec import ShardSpec, Sizing
from recordforge.records.tfrecord import ShardInfo, iter_records
from recordforge.transforms.rolling import _join, _publish, _Roller, _RollingWriteFn
from recordforge.transforms.sinks import WriteTFRecords

# Parts and the planners, step by step: parts as a runner's bundles would leave them.


def _bundles(tmp: Path, sizes: list[int], limits: Limits, compression: str) -> tuple[list, list[bytes]]:
    """Parts as a runner with bundles of `sizes` batches of 100 records would leave them."""
    parts, everything, key = [], [], 0
    for bundle in sizes:
        roller = _Roller(str(tmp), TFRecordFormat(compression), limits)
        for _ in range(bundle):
            batch = sample_records(100, key)
            everything += batch
            parts += roller.add((key,), pa.array(batch, pa.large_binary()))
            key += 1
        last = roller.close()
        parts += [last] if last else []
    return parts, everything


def _shards(tmp_path: Path, sizes: list[int], limits: Limits, compression: str = "gzip") -> tuple[list, list]:
    tmp = tmp_path / "_tmp"
    tmp.mkdir()
    parts, everything = _bundles(tmp, sizes, limits, compression)
    joined = [_join(j, str(tmp), TFRecordFormat(compression), limits) for j in plan(b"", parts, limits)]
    shards = _publish(b"", parts, joined, str(tmp_path / "data"), TFRecordFormat("gzip"), str(tmp), limits)
    assert not tmp.exists()
    written = [r for s in shards for r in iter_records(s.path, compression, check_crc=True)]
    assert sorted(written) == sorted(everything)  # nothing lost, nothing twice
    for s in shards:
        assert s.records == sum(1 for _ in iter_records(s.path, compression))
        assert s.bytes == os.path.getsize(s.path)
    return shards, parts


# By bytes.


def test_many_small_bundles_make_shards_of_the_target_size(tmp_path: Path) -> None:
    limits = Limits(max_bytes=60_000, max_records=0)
    shards, parts = _shards(tmp_path, [1, 2, 1, 3, 1, 1, 2, 1, 4, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1], limits)
    assert len(parts) > 3 * len(shards)
    short = [s.bytes for s in shards if not FULL_FRACTION * 60_000 <= s.bytes <= 1.25 * 60_000]
    assert len(short) <= 1 and all(b < 60_000 for b in short), [s.bytes for s in shards]
    for s in shards:
        gzip.decompress(Path(s.path).read_bytes())  # one valid member, checksums right


def test_large_bundles_keep_their_full_parts_untouched(tmp_path: Path) -> None:
    limits = Limits(max_bytes=40_000, max_records=0)
    shards, parts = _shards(tmp_path, [12, 12], limits)
    full = {p.sha256 for p in parts if limits.full(p.records, p.bytes)}
    assert full and full <= {s.sha256 for s in shards}
    assert sum(1 for s in shards if s.bytes < FULL_FRACTION * 40_000) <= 1


# By records: the short parts of every bundle (of every worker) rewritten by one join.


def test_joining_by_records_is_exact(tmp_path: Path) -> None:
    limits = Limits(max_bytes=10**9, max_records=250)
    shards, parts = _shards(tmp_path, [1, 1, 2, 1, 3, 1], limits)
    counts = sorted(s.records for s in shards)
    assert counts[1:] == [250] * (len(counts) - 1) and sum(counts) == 900


# By bytes again: what joining leaves is read by tf.data, and retries are harmless.


def test_joined_shards_are_read_by_tf_data(tmp_path: Path) -> None:

    limits = Limits(max_bytes=30_000, max_records=0)
    shards, _ = _shards(tmp_path, [1, 1, 1, 1, 1, 1], limits)
    for s in shards:
        got = tf_raw_records([s.path], "GZIP")
        assert got == list(iter_records(s.path, "gzip", check_crc=True))


def _attempt(fn: _RollingWriteFn, batches: list[tuple]) -> list:
    """One bundle attempt: what a runner would commit if this attempt succeeded."""
    fn.start_bundle()
    out = [p for b in batches for p in fn.process(b)]
    return out + [w.value for w in fn.finish_bundle()]


def test_a_bundle_or_a_join_run_twice_writes_each_record_once(tmp_path: Path) -> None:
    limits = Limits(max_bytes=25_000, max_records=0)
    tmp = tmp_path / "_tmp"
    tmp.mkdir()
    fn = _RollingWriteFn(str(tmp), TFRecordFormat("gzip"), limits)
    bundles = [
        [((k,), pa.array(sample_records(100, k), pa.large_binary())) for k in range(b, b + 2)]
        for b in (0, 2, 4)
    ]
    parts = []
    for batches in bundles:
        _attempt(fn, batches)  # an attempt that failed after writing: its outputs are discarded
        parts += _attempt(fn, batches)  # the retry the runner commits
    joins = list(plan(b"", parts, limits))
    assert joins
    for j in joins:
        _join(j, str(tmp), TFRecordFormat("gzip"), limits)  # a join attempt whose result is lost
    joined = [_join(j, str(tmp), TFRecordFormat("gzip"), limits) for j in joins]
    shards = _publish(b"", parts, joined, str(tmp_path / "data"), TFRecordFormat("gzip"), str(tmp), limits)
    again = _publish(b"", parts, joined, str(tmp_path / "data"), TFRecordFormat("gzip"), str(tmp), limits)
    assert shards == again and not tmp.exists()  # the orphans of failed attempts went with it
    written = sorted(r for s in shards for r in iter_records(s.path, "gzip", check_crc=True))
    assert written == sorted(r for k in range(6) for r in sample_records(100, k))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(Path(s.path).name for s in shards)


# By count.


@pytest.mark.parametrize("count", [2, 3, 40])
def test_a_fixed_count_is_that_many_shards_in_input_order_within_a_segment_of_each_other(
    tmp_path: Path, count: int
) -> None:
    limits = Limits(max_bytes=0, max_records=0, num_shards=count)
    shards, parts = _shards(tmp_path, [3, 1, 2, 5, 1], limits)
    assert len(parts) == 5 and len(shards) == count
    assert [Path(s.path).name for s in shards] == [
        f"data-{i:05d}-of-{count:05d}.tfrecord.gz" for i in range(count)
    ]
    # Read in name order, the shards are the input in order; empty shards (more shards than
    # segments) come last.
    everything = [r for key in range(12) for r in sample_records(100, key)]  # as _bundles made them
    assert [r for s in shards for r in iter_records(s.path, "gzip")] == everything
    filled = [s for s in shards if s.records]
    assert all(s.records for s in shards[: len(filled)])
    segment = max(seg.bytes for p in parts for seg in p.segments)
    sizes = [s.bytes for s in filled]
    assert max(sizes) - min(sizes) <= 2 * segment


def test_a_fixed_count_of_one_keeps_a_lone_part_untouched(tmp_path: Path) -> None:
    shards, parts = _shards(tmp_path, [4], Limits(max_bytes=0, max_records=0, num_shards=1))
    assert [(s.records, s.sha256) for s in shards] == [(p.records, p.sha256) for p in parts]


# The whole writer in a pipeline, one test per planner: 12 batches of 100 records.
BATCHES = [(("data", f"f{i // 4}.parquet", (i % 4) * 100), sample_records(100, i)) for i in range(12)]
EVERYTHING = [r for _, batch in BATCHES for r in batch]


def _write(tmp_path: Path, spec: ShardSpec, check: object) -> None:
    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
        batches = p | beam.Create([(key, pa.array(batch, pa.large_binary())) for key, batch in BATCHES])
        shards = batches | WriteTFRecords(str(tmp_path / "out"), spec, spill=False)
        assert_that(shards | beam.combiners.ToList(), lambda got: check(sorted(got[0], key=lambda s: s.path)))


def _read(shards: list[ShardInfo], compression: str) -> list[list[bytes]]:
    n = len(shards)
    names = [os.path.basename(s.path) for s in shards]
    suffix = {"gzip": ".tfrecord.gz", "none": ".tfrecord"}[compression]
    if names != [f"data-{i:05d}-of-{n:05d}{suffix}" for i in range(n)]:
        raise BeamAssertException(f"names {names}")
    out = [list(iter_records(s.path, compression, check_crc=True)) for s in shards]
    if [len(records) for records in out] != [s.records for s in shards]:
        raise BeamAssertException("shards not described as written")
    return out


def test_the_writer_by_bytes_cuts_at_the_target(tmp_path: Path) -> None:
    target = 20_000

    def check(shards: list[ShardInfo]) -> None:
        got = _read(shards, "none")
        if sorted(r for records in got for r in records) != sorted(EVERYTHING):
            raise BeamAssertException("records lost or doubled")
        short = [s.bytes for s in shards if s.bytes < FULL_FRACTION * target]
        if len(shards) < 3 or len(short) > 1:
            raise BeamAssertException(f"sizes {[s.bytes for s in shards]}")

    _write(tmp_path, ShardSpec(Sizing.BYTES, "none", max_bytes=target), check)


@pytest.mark.parametrize("per_shard", [1, 250, 1200, 5000])
def test_the_writer_by_records_puts_exactly_k_in_every_shard_but_one(tmp_path: Path, per_shard: int) -> None:
    def check(shards: list[ShardInfo]) -> None:
        got = _read(shards, "gzip")
        if sorted(r for records in got for r in records) != sorted(EVERYTHING):
            raise BeamAssertException("records lost or doubled")
        counts = sorted(s.records for s in shards)
        full, rest = divmod(len(EVERYTHING), per_shard)
        if counts != sorted([per_shard] * full + ([rest] if rest else [])):
            raise BeamAssertException(f"counts {counts}")

    spec = ShardSpec(Sizing.RECORDS, "gzip", max_records=per_shard, max_bytes=1 << 30)
    _write(tmp_path, spec, check)


@pytest.mark.parametrize("count", [1, 4, 30])
def test_the_writer_by_count_makes_that_many_shards_in_input_order(tmp_path: Path, count: int) -> None:
    def check(shards: list[ShardInfo]) -> None:
        got = _read(shards, "gzip")
        if len(shards) != count or [r for records in got for r in records] != EVERYTHING:
            raise BeamAssertException(f"{len(shards)} shards, or not the input in order")

    _write(tmp_path, ShardSpec(Sizing.COUNT, "gzip", count=count), check)


def test_the_rolling_writer_refuses_a_placed_spec(tmp_path: Path) -> None:
    from recordforge.output.shard_files import ShardFiles
    from recordforge.transforms.rolling import WriteRollingShards

    files = ShardFiles.beside(str(tmp_path / "data"), TFRecordFormat("none"))
    with pytest.raises(ValueError, match="not placed"):
        WriteRollingShards(files, ShardSpec(Sizing.PLACED, "none", count=2))


@pytest.mark.parametrize(
    "spec",
    [
        ShardSpec(Sizing.RECORDS, "gzip", max_records=90, max_bytes=1 << 30),
        ShardSpec(Sizing.BYTES, "none", max_bytes=8_000),
        ShardSpec(Sizing.COUNT, "gzip", count=5),
    ],
    ids=["records", "bytes", "count"],
)
def test_parts_cut_from_one_batch_are_shards_in_input_order(tmp_path: Path, spec: ShardSpec) -> None:
    """One large batch, and a small one after it: the parts that start in the large batch share
    its key, and follow each other by where in it they start (their file names are random)."""
    records = sample_records(1000, 0) + sample_records(10, 1)

    def check(shards: list[ShardInfo]) -> None:
        got = _read(shards, spec.compression)
        if len(shards) < 4 or [r for shard in got for r in shard] != records:
            raise BeamAssertException(f"{len(shards)} shards, or not the input in order")

    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
        batches = p | beam.Create(
            [
                (("data", "f.parquet", 0), pa.array(records[:1000], pa.large_binary())),
                (("data", "f.parquet", 1000), pa.array(records[1000:], pa.large_binary())),
            ]
        )
        shards = batches | WriteTFRecords(str(tmp_path / "out"), spec, spill=False)
        assert_that(shards | beam.combiners.ToList(), lambda got: check(sorted(got[0], key=lambda s: s.path)))


# Recording pieces for a rerun (pieces.py): each closed part leaves a record of what it holds.


def _records_in(folder: Path) -> list[dict]:
    import json

    return [json.loads(p.read_text()) for p in sorted(folder.glob("part-*.json"))]


@pytest.mark.parametrize("fmt", [TFRecordFormat("gzip"), TFRecordFormat("none", index=True)])
def test_a_recording_roller_cuts_parts_only_when_full_or_open_too_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: TFRecordFormat
) -> None:
    import recordforge.transforms.rolling as rolling

    tmp, pieces = tmp_path / "_tmp", tmp_path / "_pieces"
    tmp.mkdir()
    pieces.mkdir()
    limits = Limits(max_bytes=0, max_records=250)
    batches = [((("", "f", k * 100)), pa.array(sample_records(100, k), pa.large_binary())) for k in range(5)]
    roller = _Roller(str(tmp), fmt, limits, pieces=(str(pieces), "data"))
    parts = [p for key, records in batches for p in roller.add(key, records)]
    # Full parts only (250 records each), as without recording: a run not killed pays nothing.
    assert [p.records for p in parts] == [250, 250]
    records = _records_in(pieces)
    assert sorted(r["records"] for r in records) == [250, 250]
    assert sorted(k for r in records for k in map(tuple, r["keys"])) == [
        ("", "f", 0, 0, 100), ("", "f", 100, 0, 100), ("", "f", 200, 0, 50),
        ("", "f", 200, 50, 100), ("", "f", 300, 0, 100), ("", "f", 400, 0, 100),
    ]  # fmt: skip
    assert all((r["index"] is not None) == fmt.index for r in records)
    assert all(os.path.exists(r["index"]) for r in records if r["index"])
    # A part open longer than _PIECE_S is cut at the next segment, though short.
    monkeypatch.setattr(rolling, "_PIECE_S", 0.0)
    short = list(roller.add(("", "g", 0), pa.array(sample_records(10, 9), pa.large_binary())))
    assert [p.records for p in short] == [10] and short[0].segments
    (kept,) = [r for r in _records_in(pieces) if r["records"] == 10]
    assert Part.from_record(kept) == short[0]  # a rerun hands it back as it was


def test_records_kept_parts_hold_are_not_written_again() -> None:
    from recordforge.transforms.rolling import _unheld

    key = ("", "f", 0)
    records = pa.array([b"r%d" % i for i in range(10)], pa.large_binary())
    held = {key: ((0, 3), (5, 7))}
    out = [(k, r.to_pylist(), at) for k, r, at in _unheld((key, records), held)]
    assert out == [(key, [b"r3", b"r4"], 3), (key, [b"r7", b"r8", b"r9"], 7)]
    assert [at for _, _, at in _unheld((("", "g", 0), records), held)] == [0]  # not held: whole
    assert list(_unheld((key, records), {key: ((0, 10),)})) == []
