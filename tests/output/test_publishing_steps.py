"""The publishing protocol's steps one by one (publishing.py), on a local disk and on gs://. Whole
runs, kills and races are in tests/e2e/test_publishing*.py and test_crash_points.py (whose module
name this one may not share: the test folders are not packages)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recordforge.errors import SourceError
from recordforge.files import layout, storage
from recordforge.output.publishing import (
    check_inputs_unchanged,
    drop_empty_rejected,
    first_missing,
    publish_shards,
    replaced_version,
    undo_dry_run,
)

_V1, _V2 = "v-20260101T000000Z-0000000a", "v-20260102T000000Z-0000000b"


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "out")
    return request.getfixturevalue("gcs_bucket") + "/out"


def test_publish_shards_moves_checks_and_cleans_up_and_may_be_repeated(root: str) -> None:
    temp = layout.temp_dir(root)
    moves = []
    for i, data in enumerate([b"", b"\x00\xff", b"0"]):
        tmp = layout.temp_file(temp, f"part-{i}")
        storage.write_atomically(tmp, data)
        moves.append((tmp, layout.shard_name(layout.shard_prefix(root, "data"), i, 3, ".tfrecord")))
    storage.write_atomically(layout.temp_file(temp, "discarded"), b"an attempt the runner dropped")
    publish_shards(moves, temp)
    publish_shards(moves, temp)  # a retried step
    assert storage.list_files(root) == [final for _, final in moves]
    assert [storage.read_bytes(final) for _, final in moves] == [b"", b"\x00\xff", b"0"]


def test_publish_shards_fails_when_a_shard_is_lost(root: str) -> None:
    temp = layout.temp_dir(root)
    final = layout.shard_name(layout.shard_prefix(root, "data"), 0, 1, ".tfrecord")
    with pytest.raises(
        RuntimeError, match="1 shard\\(s\\) lost before publishing, first .*data-00000-of-00001"
    ):
        publish_shards([(layout.temp_file(temp, "never-written"), final)], temp)


def test_inputs_changed_since_listed_are_refused(root: str) -> None:
    path = layout.join(root, "in", "a.csv")
    storage.write_atomically(path, b"x\n1\n2\n")
    listed = storage.stat(path)
    sources = [(path, listed.size, listed.modified), (layout.join(root, "images"), None, 0.0)]
    check_inputs_unchanged(sources)  # a source without a size is not looked up
    storage.write_atomically(path, b"x\n1\n")  # cut short
    with pytest.raises(SourceError, match="a.csv: the input changed while it was being read"):
        check_inputs_unchanged(sources)
    storage.delete_files([path])
    with pytest.raises(SourceError, match="a.csv: the input disappeared"):
        check_inputs_unchanged(sources)


@pytest.mark.parametrize(
    ("contents", "left"),
    [
        ([b"", b""], []),  # nothing rejected: the files and their folder go
        ([b"{}\n", b""], [0]),  # the empty one goes, the other stays
        ([b"{}\n", b"{}\n"], [0, 1]),
    ],
)
def test_drop_empty_rejected(root: str, contents: list[bytes], left: list[int]) -> None:
    files = [
        layout.shard_name(layout.rejected_prefix(root), i, len(contents), layout.REJECTED_SUFFIX)
        for i in range(len(contents))
    ]
    for path, data in zip(files, contents, strict=True):
        storage.write_atomically(path, data)
    drop_empty_rejected(root, files)
    assert storage.list_files(root) == [files[i] for i in left]
    if storage.is_local(root) and not left:
        assert not os.path.exists(layout.join(root, layout.REJECTED_DIR))


@pytest.mark.parametrize(
    ("manifest", "version", "replaced"),
    [
        (None, _V2, None),
        (b"not json", _V2, None),
        (json.dumps({"version": "mine"}).encode(), _V2, None),  # not RecordForge's
        (json.dumps({"version": _V1}).encode(), _V2, _V1),
        # A retried commit finds its own version and keeps what that one replaced.
        (json.dumps({"version": _V2, "previous_version": _V1}).encode(), _V2, _V1),
        (json.dumps({"version": _V2, "previous_version": None}).encode(), _V2, None),
    ],
)
def test_replaced_version(root: str, manifest: bytes | None, version: str, replaced: str | None) -> None:
    if manifest is not None:
        storage.write_atomically(layout.join(root, layout.METADATA), manifest)
    assert replaced_version(root, version) == replaced


def test_a_dry_run_removes_its_version_and_the_folders_it_made(tmp_path: Path) -> None:
    output = str(tmp_path / "a" / "b" / "out")
    made = first_missing(output)
    assert made == str(tmp_path / "a")
    storage.write_atomically(layout.join(output, _V1, "transform_fn", "x"), b"x")
    undo_dry_run(output, _V1, made)
    assert list(tmp_path.iterdir()) == []


def test_a_dry_run_leaves_folders_it_did_not_make_and_anything_else(tmp_path: Path) -> None:
    output = tmp_path / "out"
    (output / "notes").mkdir(parents=True)
    assert first_missing(str(output)) is None
    storage.write_atomically(layout.join(str(output), _V1, "x"), b"x")
    undo_dry_run(str(output), _V1, None)
    assert [p.name for p in output.iterdir()] == ["notes"]
