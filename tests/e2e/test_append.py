"""--append: day 1 publishes three files, day 2 adds a fourth; only the fourth is converted, the
published shards are listed again where they are, and the whole reads as a full build does."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import canonical, tf_records
from forked_runs import ForkedRuns
from independent import file_records

import recordforge
from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.output import crashpoints
from recordforge.tools.verify import verify

SCHEMA = "examples/taxi.yaml"
FLOATS = frozenset({"fare_amount", "tip_amount", "trip_distance", "pickup_lat_lon"})


@pytest.fixture(scope="module")
def forked() -> Iterator[ForkedRuns]:
    runs = ForkedRuns()
    yield runs
    runs.close()


def _day(src: Path, i: int) -> None:
    pq.write_table(taxi_table(700, seed=i, first_id=i * 700), src / f"t{i}.parquet", row_group_size=300)


def _records(out: Path) -> collections.Counter:
    return collections.Counter(canonical(r, FLOATS) for r in tf_records(str(out)))


def _shard_files(out: Path, meta: dict) -> dict[str, tuple[int, bytes]]:
    return {
        s["file"]: (os.stat(out / s["file"]).st_ino, (out / s["file"]).read_bytes()) for s in meta["shards"]
    }


def _same_second_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run's version made in the same second, each later one sorting before the earlier
    ones (their random parts decrease): an append's shards sort before its base's by path."""
    names = (f"v-20260101T000000Z-{n:08x}" for n in range(0xFFFFFFFF, 0, -1))
    monkeypatch.setattr("recordforge.pipelines.resolve.new_version", lambda: next(names))


def _ids_in_manifest_order(out: Path, split: str | None = None) -> list[int]:
    records = _split_records(out, split) if split else tf_records(str(out))
    return [r["trip_id"][0] for r in records]


@pytest.mark.parametrize("flags", [{}, {"splits": "train=3,eval=1"}, {"deterministic": True}])
def test_append_converts_only_the_new_file_and_keeps_the_old_shards(
    tmp_path: Path, flags: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    _same_second_versions(monkeypatch)
    src, out, full = tmp_path / "src", tmp_path / "out", tmp_path / "full"
    src.mkdir()
    for i in range(3):
        _day(src, i)
    pattern = str(src / "*.parquet")
    day1 = recordforge.convert(pattern, str(out), SCHEMA, append=True, shard_size="20KB", **flags)
    assert "appended" not in day1 and day1["num_records"] == 2100  # nothing published: a plain build
    old = _shard_files(out, day1)
    splits = ["train", "eval"] if "splits" in flags else [None]
    ids_before = {split: _ids_in_manifest_order(out, split) for split in splits}

    _day(src, 3)
    day2 = recordforge.convert(pattern, str(out), SCHEMA, append=True, shard_size="20KB", **flags)
    appended = day2["appended"]
    assert appended["base_version"] == day1["version"]
    assert appended["converted"]["files"] == 1 and appended["converted"]["rows_read"] == 700
    assert appended["reused"] == {"shards": len(day1["shards"]), "rows": 2100}
    assert day2["rows_read"] == day2["num_records"] == 2800 and day2["rows_rejected"] == 0
    assert [s["path"] for s in day2["sources"]] == sorted(str(p) for p in src.glob("*.parquet"))
    # The old shards are listed again, the same files (inode and bytes), never copied.
    assert {s["file"]: s for s in day2["shards"] if s["file"] in old} == {
        s["file"]: s for s in day1["shards"]
    }
    assert {f: v for f, v in _shard_files(out, day2).items() if f in old} == old
    new = [s for s in day2["shards"] if s["file"] not in old]
    assert new and all(s["file"].startswith(day2["version"] + "/") for s in new)
    # The manifest lists the base's shards first, in the base's order, then the new ones in
    # path order, though the new version's name sorts first.
    assert day2["version"] < day1["version"]
    assert day2["shards"] == [*day1["shards"], *sorted(new, key=lambda s: s["file"])]
    # So a read in manifest order gives day one's records as before, then the new file's.
    for split in splits:
        ids = _ids_in_manifest_order(out, split)
        kept = len(ids_before[split])
        assert ids[:kept] == ids_before[split], split
        assert all(i >= 2100 for i in ids[kept:]), split
    assert sum(len(_ids_in_manifest_order(out, split)) - len(ids_before[split]) for split in splits) == 700
    assert verify(str(out)) == []

    # The records equal a fresh full build's, split by split when there are splits.
    fresh = recordforge.convert(pattern, str(full), SCHEMA, shard_size="20KB", **flags)
    assert day2["input_fingerprint"] == fresh["input_fingerprint"]
    if "splits" in flags:
        assert day2["split_counts"] == {
            name: {"records": c["records"], "shards": day2["split_counts"][name]["shards"]}
            for name, c in fresh["split_counts"].items()
        }
        for split in ("train", "eval"):
            got = collections.Counter(
                json.dumps(sorted((k, repr(v)) for k, v in r.items())) for r in _split_records(out, split)
            )
            want = collections.Counter(
                json.dumps(sorted((k, repr(v)) for k, v in r.items())) for r in _split_records(full, split)
            )
            assert got == want, split
    else:
        assert _records(out) == _records(full)
    # RecordForge's own reader lists every shard, old and new.
    from recordforge.reading.tf_data import load_bundle

    assert load_bundle(str(out))["files"] == [str(out / s["file"]) for s in day2["shards"]]

    # Nothing new: nothing to do, nothing written.
    again = recordforge.convert(pattern, str(out), SCHEMA, append=True, shard_size="20KB", **flags)
    assert again["skipped"] and again["version"] == day2["version"]


def _split_records(out: Path, split: str) -> list[dict]:
    from conftest import example_to_dict

    from recordforge.reading.tf_data import load_bundle

    bundle = load_bundle(str(out), split=split)
    comp = bundle["metadata"]["compression"]
    return [example_to_dict(r) for f in bundle["files"] for r in file_records(f, comp)]


def test_append_refuses_a_changed_old_file_a_new_schema_and_other_settings(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(2):
        _day(src, i)
    pattern = str(src / "*.parquet")
    recordforge.convert(pattern, str(out), SCHEMA)
    _day(src, 2)
    with pytest.raises(RecordForgeError, match=r"settings differ .*compression: None published, 'zlib' now"):
        recordforge.convert(pattern, str(out), SCHEMA, append=True, compression="zlib")
    schema = tmp_path / "schema.yaml"
    schema.write_text(Path(SCHEMA).read_text().replace("name: passenger_count", "name: passengers", 1))
    with pytest.raises(RecordForgeError, match=r"schema differs .*feature 'passengers' added"):
        recordforge.convert(pattern, str(out), str(schema), append=True)
    os.utime(src / "t0.parquet", (1, 1))
    with pytest.raises(RecordForgeError, match=r"^--append: .*t0.parquet changed since .*--overwrite$"):
        recordforge.convert(pattern, str(out), SCHEMA, append=True)
    with pytest.raises(RecordForgeError, match="--append does not combine with --shuffle"):
        recordforge.convert(pattern, str(out), SCHEMA, append=True, shuffle=True)


def test_an_append_whose_totals_break_the_invariant_publishes_nothing(tmp_path: Path) -> None:
    """The append's own count check (old shards + new = the total, in transforms/bundle.py's
    `_write_bundle`): a published manifest whose rows_read disagrees with its shards makes the
    appended totals break rows_read == rows_written + rows_rejected, and the append refuses.
    Mutation this catches: make that check `if False:` (or delete it); the append then
    publishes totals that do not add up. Put it back to pass."""
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    _day(src, 0)
    pattern = str(src / "*.parquet")
    recordforge.convert(pattern, str(out), SCHEMA, append=True)
    manifest = out / layout.METADATA
    good = manifest.read_text()
    day1 = json.loads(good)
    # The version's own copy is the one an append reads as its base; both are edited alike.
    copies = [manifest, out / day1["version"] / layout.METADATA]
    for path in copies:
        path.write_text(json.dumps({**day1, "rows_read": day1["rows_read"] + 1}))
    _day(src, 1)
    with pytest.raises(
        RuntimeError, match=r"the appended counts break rows_read == rows_written \+ rows_rejected"
    ):
        recordforge.convert(pattern, str(out), SCHEMA, append=True)
    assert json.loads(manifest.read_text())["version"] == day1["version"]
    assert sorted(p.name for p in out.glob("v-*")) == [day1["version"]]  # the failed run's folder gone
    for path in copies:
        path.write_text(good)
    assert verify(str(out)) == []


def test_an_append_killed_before_its_commit_leaves_day_one_published(
    forked: ForkedRuns, tmp_path: Path
) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(3):
        _day(src, i)
    argv = ["convert", "--source", str(src / "*.parquet"), "--output", str(out), "--schema", SCHEMA,
            "--append"]  # fmt: skip
    (first,) = forked.together([(argv, 0.0)])
    assert first.code == 0, first.stderr
    day1 = json.loads((out / layout.METADATA).read_text())
    old = _shard_files(out, day1)
    _day(src, 3)
    for point in ("shards_published", "manifest_written", "staged"):
        (killed,) = forked.together([(argv, 0.0)], envs=[{crashpoints.ENV: point}])
        assert killed.code == -9, killed.stderr
        assert json.loads((out / layout.METADATA).read_text()) == day1
        assert _shard_files(out, day1) == old
        # Killed at "staged", the top-level files staged beside their names are left for the
        # next holder of the lock to delete; the published bundle is whole all the same.
        assert [p for p in verify(str(out)) if ".tmp-" not in p] == []
    (rerun,) = forked.together([(argv, 0.0)])
    assert rerun.code == 0, rerun.stderr
    assert "appended: converted 1 new file (700 rows)" in rerun.stdout
    day2 = json.loads((out / layout.METADATA).read_text())
    assert day2["num_records"] == 2800 and _shard_files(out, day1) == old
    # The base version is referenced by the published manifest: it stays, whatever runs next.
    (later,) = forked.together([(argv, 0.0)])
    assert later.code == 0 and "no new input file" in later.stdout, later.stdout
    assert (out / day1["version"]).is_dir() and verify(str(out)) == []


def test_a_killed_deterministic_append_resumes_to_the_same_bytes(forked: ForkedRuns, tmp_path: Path) -> None:
    """--append --deterministic killed at its 3rd new shard (one worker): the rerun keeps the
    finished new shards and publishes what an uninterrupted append publishes, byte for byte;
    day one's shards are left as they are."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        _day(src, i)

    def argv(out: Path) -> list[str]:
        return ["convert", "--source", str(src / "*.parquet"), "--output", str(out), "--schema", SCHEMA,
                "--append", "--deterministic", "--shard_size", "16KiB",
                "--direct_num_workers", "1"]  # fmt: skip

    def shards(meta: dict, *, new: bool) -> list[tuple[str, str]]:
        """(name in its version folder, sha256) of the run's own shards, or of the base's."""
        return [
            (s["file"].split("/", 1)[1], s["sha256"])
            for s in meta["shards"]
            if s["file"].startswith(meta["version"] + "/") == new
        ]

    whole, out = tmp_path / "whole", tmp_path / "out"
    day1 = forked.together([(argv(whole), 0.0), (argv(out), 0.0)])
    assert [o.code for o in day1] == [0, 0], day1
    old = _shard_files(out, json.loads((out / layout.METADATA).read_text()))
    for i in range(3, 6):
        _day(src, i)
    env = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: "3"}
    appended, killed = forked.together([(argv(whole), 0.0), (argv(out), 0.0)], envs=[{}, env])
    assert appended.code == 0 and killed.code == -9, (appended, killed)
    (rerun,) = forked.together([(argv(out), 0.0)])
    assert rerun.code == 0, rerun.stderr
    meta, expected = (json.loads((o / layout.METADATA).read_text()) for o in (out, whole))
    assert meta["resumed"]["shards"] == 3 and meta["appended"]["converted"]["files"] == 3
    assert len(shards(meta, new=True)) > 3 and shards(meta, new=True) == shards(expected, new=True)
    assert shards(meta, new=False) == shards(expected, new=False)
    assert {f: v for f, v in _shard_files(out, meta).items() if f in old} == old  # inodes and bytes
    assert _records(out) == _records(whole) and verify(str(out)) == []
