"""The publishing protocol's steps one by one (publishing.py), on a local disk and on gs://. Whole
runs, kills and races are in tests/e2e/test_publishing*.py and test_crash_points.py (whose module
name this one may not share: the test folders are not packages)."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from recordforge.errors import SourceError
from recordforge.files import layout, storage
from recordforge.output import crashpoints
from recordforge.output.publishing import (
    check_inputs_unchanged,
    commit_version,
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


class _Killed(Exception):
    """Raised at a crash point in place of the SIGKILL a run gets there."""


# The protocol's steps from the shards to the last top-level copy, in the order they must come.
_STEPS = ("shards_published", "manifest_written", "staged", "committed", "copied")


def _publish(
    root: str, version: str, monkeypatch: pytest.MonkeyPatch, kill_at: str | None = None
) -> list[str]:
    """Publishes `version` (three shards, the small files, its manifest) as a run does, from its
    temporary shards to the commit, raising at `kill_at`; returns the crash points reached."""
    reached: list[str] = []

    def reach(point: str) -> None:
        reached.append(point)
        if point == kill_at:
            raise _Killed(point)

    monkeypatch.setattr(crashpoints, "reached", reach)
    vroot = layout.version_root(root, version)
    temp = layout.temp_dir(vroot)
    moves, shards = [], []
    for i in range(3):
        tmp = layout.temp_file(temp, f"part-{i}")
        storage.write_atomically(tmp, f"{version} shard {i}".encode())
        final = layout.shard_name(layout.shard_prefix(vroot, "data"), i, 3, ".tfrecord")
        moves.append((tmp, final))
        shards.append({"file": layout.relative(final, root), "bytes": len(f"{version} shard {i}")})
    files = {name: f"{version} {name}".encode() for name in layout.TOP_COPIES}
    manifest = json.dumps({"version": version, "shards": shards}).encode()
    with contextlib.suppress(_Killed):
        publish_shards(moves, temp)
        commit_version(root, version, files, manifest)
    return reached


def _whole_as_readers_see_it(root: str) -> str | None:
    """The version the top-level metadata.json names (None: none), after checking that a reader
    finds all of it: the version's own manifest, the same, its small files and every shard."""
    top = layout.join(root, layout.METADATA)
    if not storage.exists(top):
        return None
    meta = json.loads(storage.read_bytes(top))
    version = meta["version"]
    vroot = layout.version_root(root, version)
    assert storage.read_bytes(layout.join(vroot, layout.METADATA)) == storage.read_bytes(top), version
    for name in layout.TOP_COPIES:
        assert storage.read_bytes(layout.join(vroot, name)) == f"{version} {name}".encode(), name
    for shard in meta["shards"]:
        assert len(storage.read_bytes(layout.join(root, shard["file"]))) == shard["bytes"], shard
    return version


# The files published here are placeholders (the protocol does not read them), not a bundle that
# `verify` could read: the suite's check of every published bundle is left out.
@pytest.mark.corrupts
def test_the_protocol_reaches_its_steps_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation this catches (with the test below): in publishing.commit_version, `_commit(...)`
    (the top-level metadata.json) moved before the loop that writes the version's own files and
    manifest. Put it back after them to pass."""
    root = str(tmp_path / "out")
    assert _publish(root, _V1, monkeypatch) == list(_STEPS)
    assert _whole_as_readers_see_it(root) == _V1
    assert storage.exists(layout.join(root, layout.SUCCESS))


@pytest.mark.corrupts
@pytest.mark.parametrize("point", _STEPS)
def test_a_run_killed_at_each_step_leaves_readers_a_whole_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """Killed at each named step while replacing a published version, in-process (the step
    raises where a run would be killed): before the commit point readers see the old version
    whole, from it on the new one, whole; the shards are in place before any file of the
    version's is written, and the version's files before the top-level manifest."""
    root = str(tmp_path / "out")
    _publish(root, _V1, monkeypatch)
    reached = _publish(root, _V2, monkeypatch, kill_at=point)
    assert reached == list(_STEPS[: _STEPS.index(point) + 1])
    committed = _STEPS.index(point) >= _STEPS.index("committed")
    assert _whole_as_readers_see_it(root) == (_V2 if committed else _V1)
    v2 = layout.version_root(root, _V2)
    shards = [layout.shard_name(layout.shard_prefix(v2, "data"), i, 3, ".tfrecord") for i in range(3)]
    assert [storage.read_bytes(s) for s in shards] == [f"{_V2} shard {i}".encode() for i in range(3)]
    assert not [p for p in storage.list_files(v2) if f"/{layout.TEMP_DIR_PREFIX}" in p]  # no temporaries
    own = [layout.join(v2, n) for n in (*layout.TOP_COPIES, layout.METADATA)]
    assert [storage.exists(p) for p in own] == [point != "shards_published"] * len(own)
