"""The one protocol of every TFRecord writer (transforms/shard_files.py), on real files: temporary
names, publishing, descriptions as written, cleanup after failures, and nothing written outside
the writer's folder."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import BeamAssertException, assert_that
from conftest import DEFAULT_RUNNER

from recordforge.output import shard_files
from recordforge.output.shard_files import ShardFiles, TempShard
from recordforge.output.shard_plans import Join, Limits
from recordforge.records.shard_format import TFRecordFormat
from recordforge.records.shard_spec import DEFAULT_SHARD_SIZE, ShardSpec, Sizing
from recordforge.records.tfrecord import ShardInfo, describe_shard, iter_records
from recordforge.transforms import rolling, shuffle
from recordforge.transforms.rolling import _Roller
from recordforge.transforms.sinks import WriteTFRecords

SUFFIX = {"gzip": ".tfrecord.gz", "zlib": ".tfrecord.deflate", "none": ".tfrecord"}
FORMAT = {"gzip": TFRecordFormat("gzip"), "zlib": TFRecordFormat("zlib"), "none": TFRecordFormat("none")}
TEMP_DIR = re.compile(r"^_tmp-[0-9a-f]{12}$")


def _records(n: int, seed: int) -> list[bytes]:
    # Edge cases among them: an empty record, bytes that are not UTF-8, a zero byte.
    out = [b"", b"\xff\xfe\x00", b"0"]
    out += [hashlib.sha256(f"{seed}-{i}".encode()).digest() * (i % 7) for i in range(n - 3)]
    return out[:n]


def _array(records: list[bytes]) -> pa.Array:
    return pa.array(records, pa.large_binary())


def _snapshot(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file below `root` with its mtime and bytes."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = Path(d, f)
            out[str(p.relative_to(root))] = (p.stat().st_mtime_ns, p.read_bytes())
    return out


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """The writer's folder, with neighbours that must never be touched: a sibling folder, a file
    beside it and an older temporary folder of someone else's."""
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data-00000-of-00001.tfrecord.gz").write_bytes(b"not ours")
    (tmp_path / "notes.txt").write_text("mine")
    folder = tmp_path / "v"
    (folder / "_tmp-0123456789ab").mkdir(parents=True)
    (folder / "_tmp-0123456789ab" / "x.part").write_bytes(b"a neighbour's")
    return folder


def test_names_follow_one_scheme(tmp_path: Path) -> None:
    files = ShardFiles.beside(str(tmp_path / "data"), FORMAT["gzip"])
    assert Path(files.temp_dir).parent == tmp_path and TEMP_DIR.match(Path(files.temp_dir).name)
    assert ShardFiles.beside(files.prefix, files.format).temp_dir != files.temp_dir
    a, b = files.temp("part"), files.temp("part")
    assert a != b and Path(a).parent == Path(files.temp_dir)
    assert re.fullmatch(r"part-[0-9a-f]{32}\.part", Path(a).name)
    assert re.fullmatch(r"batch-[0-9a-f]{32}\.arrow", Path(files.temp("batch", ".arrow")).name)
    assert files.final(3, 12) == f"{tmp_path}/data-00003-of-00012.tfrecord.gz"
    assert shard_files.shard_prefix(str(tmp_path) + "/", "train") == f"{tmp_path}/train"
    assert not list(tmp_path.iterdir())  # naming writes nothing


@pytest.mark.parametrize("compression", ["gzip", "zlib", "none"])
def test_published_shards_are_described_as_written_and_the_temp_folder_goes(
    target: Path, compression: str
) -> None:
    before = _snapshot(target.parent)
    files = ShardFiles.beside(str(target / "data"), FORMAT[compression])
    batches = [[_records(50, 1), _records(7, 2)], [], [_records(1, 3)]]
    temps = [files.write("shard", [_array(b) for b in arrays]) for arrays in batches]
    assert all(Path(t.tmp).parent == Path(files.temp_dir) for t in temps)
    shards = files.publish(temps)
    again = files.publish(temps)  # a retried publish
    assert shards == again
    assert [Path(s.path).name for s in shards] == [
        f"data-0000{i}-of-00003{SUFFIX[compression]}" for i in range(3)
    ]
    for s, arrays in zip(shards, batches, strict=True):
        assert s == describe_shard(s.path, compression)
        assert list(iter_records(s.path, compression, check_crc=True)) == [r for a in arrays for r in a]
    after = _snapshot(target.parent)
    added = sorted(set(after) - set(before))
    assert added == sorted(f"v/{Path(s.path).name}" for s in shards)
    assert {k: after[k] for k in before} == before  # the neighbours, byte for byte


def test_a_shard_that_is_gone_is_never_published(tmp_path: Path) -> None:
    files = ShardFiles.beside(str(tmp_path / "data"), FORMAT["none"])
    temps = [files.write("shard", [_array(_records(5, i))]) for i in range(2)]
    os.unlink(temps[1].tmp)
    with pytest.raises(RuntimeError, match="1 shard"):
        files.publish(temps)


def test_slots_are_published_with_empty_shards_for_the_missing(tmp_path: Path) -> None:
    files = ShardFiles.beside(str(tmp_path / "data"), FORMAT["gzip"])
    written = [(2, files.write("shard-00002", [_array(_records(9, 0))]))]
    shards = files.publish_slots(4, written)
    assert [s.records for s in shards] == [0, 0, 9, 0]
    assert all(s == describe_shard(s.path, "gzip") for s in shards)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"data-0000{i}-of-00004.tfrecord.gz" for i in range(4)
    ]
    with pytest.raises(RuntimeError, match="written twice"):
        files.publish_slots(4, written * 2)


def _failing(after: int) -> Iterator[pa.Array]:
    for i in range(after):
        yield _array(_records(20, i))
    raise OSError("injected: the source failed mid-shard")


def test_a_failed_write_leaves_no_file(target: Path) -> None:
    before = _snapshot(target.parent)
    files = ShardFiles.beside(str(target / "data"), FORMAT["gzip"])
    with pytest.raises(OSError, match="injected"):
        files.write("shard", _failing(3))
    assert _snapshot(target.parent) == before
    assert files.cleanup() == 0


def test_a_failing_file_system_leaves_no_file(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fails after some bytes: the half-written file is deleted."""
    from recordforge.records.streams import HashingFile

    real = HashingFile.write
    room = [100]

    def write(self: HashingFile, data: Any) -> None:
        if self.bytes + len(data) > room[0]:
            raise OSError("injected: no space left on device")
        real(self, data)

    monkeypatch.setattr(HashingFile, "write", write)
    before = _snapshot(target.parent)
    files = ShardFiles.beside(str(target / "data"), FORMAT["none"])
    with pytest.raises(OSError, match="no space"):
        files.write("shard", [_array(_records(50, i)) for i in range(3)])
    roller = _Roller(files.temp_dir, FORMAT["none"], Limits(max_bytes=10**6, max_records=0))
    with pytest.raises(OSError, match="no space"):
        list(roller.add(("data", "f", 0), _array(_records(3000, 0))))
    room[0] = 0  # not even a header
    with pytest.raises(OSError, match="no space"):
        rolling._join(
            Join(0, ()),  # an empty shard: still a file to write
            files.temp_dir,
            FORMAT["gzip"],
            Limits(max_bytes=0, max_records=0, num_shards=2),
        )
    assert _snapshot(target.parent) == before


def test_a_failed_spill_leaves_no_file(target: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_: Any, **__: Any) -> Any:
        raise OSError("injected: the spill failed")

    monkeypatch.setattr(pa.ipc, "new_stream", fail)
    before = _snapshot(target.parent)
    files = ShardFiles.beside(str(target / "data"), FORMAT["none"])
    with pytest.raises(OSError, match="spill"):
        shuffle._write_array(files.temp("batch", ".arrow"), _array(_records(5, 0)))
    assert _snapshot(target.parent) == before


# Every writer of WriteTFRecords, through a pipeline: what it leaves is the shards, nothing else.
WRITERS = {
    "by_size": {"sizing": Sizing.BYTES, "max_bytes": 3000},
    "by_records": {"sizing": Sizing.RECORDS, "max_records": 70, "max_bytes": DEFAULT_SHARD_SIZE},
    "count": {"sizing": Sizing.COUNT, "count": 3},
    "count_more_than_batches": {"sizing": Sizing.COUNT, "count": 9},
    "deterministic": {"sizing": Sizing.PLACED, "count": 3},
    "shuffle": {"sizing": Sizing.PLACED, "count": 3, "seed": 42},
}
FILES = {"a.parquet": [0, 100, 200], "b.parquet": [0, 50]}  # first rows of each file's batches


def _batches() -> list[tuple[tuple[str, str, int], pa.Array]]:
    out = []
    for f, (name, starts) in enumerate(FILES.items()):
        for i, start in enumerate(starts):
            out.append(
                (("data", name, start), _array(_records(100 if i < len(starts) - 1 else 50, 10 * f + i)))
            )
    return out


def _check(expected: list[bytes], compression: str, count: int | None) -> Any:
    def check(shards: list[ShardInfo]) -> None:
        shards = sorted(shards, key=lambda s: s.path)
        n = len(shards)
        if count is not None and n != count:
            raise BeamAssertException(f"{n} shards, not {count}")
        names = [os.path.basename(s.path) for s in shards]
        if names != [f"data-{i:05d}-of-{n:05d}{SUFFIX[compression]}" for i in range(n)]:
            raise BeamAssertException(f"names {names}")
        got = []
        for s in shards:
            if s != describe_shard(s.path, compression):
                raise BeamAssertException(f"{s} is not the file as written")
            got += list(iter_records(s.path, compression, check_crc=True))
        if sorted(got) != sorted(expected):
            raise BeamAssertException("records lost or doubled")

    return check


@pytest.mark.parametrize("writer", list(WRITERS))
def test_every_writer_leaves_its_shards_and_nothing_else(target: Path, writer: str) -> None:
    flags = WRITERS[writer]
    compression = "zlib" if writer == "count" else "gzip"
    batches = _batches()
    before = _snapshot(target.parent)
    with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
        pcoll = p | "Batches" >> beam.Create(batches)
        spec = ShardSpec(compression=compression, **flags)
        shards = pcoll | WriteTFRecords(str(target), spec, spill=True)
        count = flags.get("count") or None
        expected = [r for _, a in batches for r in a.to_pylist()]
        assert_that(
            shards | beam.combiners.ToList(), lambda got: _check(expected, compression, count)(got[0])
        )
    after = _snapshot(target.parent)
    assert {k: after[k] for k in before} == before
    added = sorted(set(after) - set(before))
    assert added and all(re.fullmatch(r"v/data-\d{5}-of-\d{5}\.tfrecord\.(gz|deflate)", a) for a in added), (
        added
    )


def test_the_shuffled_and_deterministic_writers_write_the_same_bytes_twice(tmp_path: Path) -> None:
    def write(folder: Path, flags: dict) -> dict[str, bytes]:
        with test_pipeline.TestPipeline(runner=DEFAULT_RUNNER) as p:
            spec = ShardSpec(compression="gzip", **flags)
            _ = p | beam.Create(_batches()) | WriteTFRecords(str(folder), spec, spill=False)
        return {f.name: f.read_bytes() for f in sorted(folder.iterdir())}

    for name in ("deterministic", "shuffle"):
        one = write(tmp_path / f"{name}1", WRITERS[name])
        assert one == write(tmp_path / f"{name}2", WRITERS[name]) and len(one) == 3


def test_a_temp_shard_is_a_plain_description() -> None:
    """What the publish step receives from every writer: small, picklable, comparable."""
    import pickle

    t = TempShard("/x/_tmp-0/part-0.part", 3, 10, "0" * 64)
    assert pickle.loads(pickle.dumps(t)) == t
