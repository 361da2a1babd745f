"""What a rerun keeps of a killed run whose shards were in place: a writer's record of publishing
(pieces.reusable) and a finished version's own manifest (finished.finished_manifest), written by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from recordforge.files import layout
from recordforge.output.finished import finished_manifest
from recordforge.output.pieces import reusable

V = "v-20260101T000000Z-00000000"
LISTED = {"a": [10, 1.0], "b": [20, 2.0]}
SHARDS = {"data-00000-of-00002.tfrecord": b"zero", "data-00001-of-00002.tfrecord": b"one!"}


def _entry(out: Path, name: str, data: bytes) -> dict:
    return {"file": str(out / V / name), "records": 2, "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(), "index": None}  # fmt: skip


def _published(out: Path, copies: int = 1) -> None:
    """Two batches recorded, a part record whose temporary file was moved, and the writer's
    record of the shards it published (`copies` times, as a retried step writes it)."""
    root, pieces = out / V, out / V / layout.PIECES_DIR
    pieces.mkdir(parents=True)
    batches = [["a", 0, 2, {"": 2}], ["b", 0, 2, {"": 2}]]
    (pieces / "batches-1.json").write_text(json.dumps({"batches": batches}))
    part = {"writer": "data", "tmp": str(root / "_tmp-x" / "part-1.part"), "records": 4, "bytes": 8,
            "sha256": "0" * 64, "first_key": None, "first_record": 0, "segments": [],
            "keys": [["", "a", 0, 0, 2], ["", "b", 0, 0, 2]]}  # fmt: skip
    (pieces / "part-1.json").write_text(json.dumps(part))
    shards = [_entry(out, name, data) for name, data in SHARDS.items()]
    for i in range(copies):
        (pieces / f"published-{i}.json").write_text(json.dumps({"writer": "data", "published": shards}))
    for name, data in SHARDS.items():
        (root / name).write_bytes(data)


def test_a_published_writer_keeps_its_shards_and_every_batch_is_skipped(tmp_path: Path) -> None:
    _published(tmp_path, copies=2)  # a retried publish records the same shards again
    reuse = reusable(str(tmp_path), V, LISTED, LISTED)
    assert reuse.batches == {("a", 0), ("b", 0)} and reuse.rows == 4
    assert reuse.parts == {} and reuse.temp_dirs == frozenset()
    assert reuse.files == {str(tmp_path / V / name) for name in SHARDS}
    assert reuse.describe()["shards"] == 2 and reuse.describe()["parts"] == 0


@pytest.mark.parametrize("case", ["changed input", "new input", "corrupt", "cut short", "gone", "disagree"])
def test_published_shards_that_cannot_be_trusted_keep_nothing(tmp_path: Path, case: str) -> None:
    _published(tmp_path)
    now = LISTED
    first = tmp_path / V / next(iter(SHARDS))
    if case == "changed input":
        now = {**LISTED, "b": [21, 2.0]}
    elif case == "new input":  # its records would belong in the writer's shards
        now = {**LISTED, "c": [5, 3.0]}
    elif case == "corrupt":
        first.write_bytes(b"ZERO")
    elif case == "cut short":
        first.write_bytes(b"ze")
    elif case == "gone":
        first.unlink()
    elif case == "disagree":
        other = [_entry(tmp_path, name, b"????") for name in SHARDS]
        pieces = tmp_path / V / layout.PIECES_DIR
        (pieces / "published-9.json").write_text(json.dumps({"writer": "data", "published": other}))
    reuse = reusable(str(tmp_path), V, LISTED, now)
    assert reuse.empty and reuse.files == frozenset()


def _finished(out: Path, **changes: object) -> dict:
    root = out / V
    root.mkdir(parents=True)
    shards = []
    for name, data in SHARDS.items():
        (root / name).write_bytes(data)
        entry = _entry(out, name, data)
        shards.append({**entry, "file": f"{V}/{name}"})
    sources = [{"path": p, "bytes": b, "modified": m} for p, (b, m) in LISTED.items()]
    meta = {"version": V, "sources": sources, "rows_read": 5, "rows_written": 4, "rows_rejected": 1,
            "num_records": 4, "shards": shards, **changes}  # fmt: skip
    (root / layout.METADATA).write_text(json.dumps(meta))
    return meta


def test_a_finished_version_is_committed_as_it_is(tmp_path: Path) -> None:
    meta = _finished(tmp_path)
    assert finished_manifest(str(tmp_path), V, LISTED, LISTED) == meta


@pytest.mark.parametrize(
    "case", ["changed input", "listed otherwise", "counts", "corrupt", "gone", "other version"]
)
def test_a_finished_version_that_cannot_be_trusted_is_not_committed(tmp_path: Path, case: str) -> None:
    then, now = LISTED, LISTED
    changes: dict[str, object] = {}
    if case == "changed input":
        now = {**LISTED, "b": [21, 2.0]}
    elif case == "listed otherwise":  # the journal agrees, the manifest does not
        then = now = {**LISTED, "c": [5, 3.0]}
    elif case == "counts":
        changes = {"rows_read": 6}
    elif case == "other version":
        changes = {"version": "v-20260101T000000Z-11111111"}
    _finished(tmp_path, **changes)
    first = tmp_path / V / next(iter(SHARDS))
    if case == "corrupt":
        first.write_bytes(b"ZERO")
    elif case == "gone":
        first.unlink()
    assert finished_manifest(str(tmp_path), V, then, now) is None
