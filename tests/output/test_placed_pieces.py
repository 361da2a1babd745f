"""Which shards and batches of a killed placed run a rerun keeps (placed_pieces.py, through
pieces.reusable), on records written by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from recordforge.files import layout
from recordforge.output.pieces import reusable
from recordforge.output.placed_pieces import bounds, layout_digest, layout_of

V = "v-20260101T000000Z-00000000"
LISTED = {"a": [10, 1.0], "b": [20, 2.0]}
# Four batches of 10 records in one writer: 40 places, 4 shards of 10, each batch one shard;
# batch (b, 5) is not in the ledger (it had a rejected row).
LAYOUT = [["a", 0, 10], ["a", 10, 10], ["b", 0, 10], ["b", 5, 10]]
LEDGER = [["a", 0, 10, {"": 10}], ["a", 10, 12, {"": 10}], ["b", 0, 10, {"": 10}]]


def _setup(
    out: Path, shards: dict[int, bytes], *, layouts: list[list] | None = None, count: int = 4
) -> dict[int, str]:
    pieces = out / V / layout.PIECES_DIR
    pieces.mkdir(parents=True)
    (pieces / "batches-1.json").write_text(json.dumps({"batches": LEDGER}))
    for i, batches in enumerate(layouts or [LAYOUT]):
        record = {"writer": "data", "count": count, "layout": batches}
        (pieces / f"placed-{i}.json").write_text(json.dumps(record))
    paths = {}
    for i, (shard, data) in enumerate(shards.items()):
        tmp = out / V / "_tmp-x" / f"shard-{i}.part"
        tmp.parent.mkdir(exist_ok=True)
        tmp.write_bytes(data)
        record = {"writer": "data", "shard": shard, "count": count, "tmp": str(tmp), "records": 10,
                  "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "index": None}  # fmt: skip
        (pieces / f"shard-{i}.json").write_text(json.dumps(record))
        paths[shard] = str(tmp)
    return paths


def test_batches_whose_places_lie_in_kept_shards_are_skipped_and_their_counts_handed_on(
    tmp_path: Path,
) -> None:
    paths = _setup(tmp_path, {0: b"zero", 2: b"two", 3: b"three"})
    reuse = reusable(str(tmp_path), V, LISTED, LISTED, placed={"data": 4})
    # (a, 10) is in shard 1, not kept; (b, 5) in kept shard 3 but not in the ledger: converted.
    assert reuse.batches == {("a", 0), ("b", 0)} and reuse.rows == 20
    keep = reuse.placed["data"]
    assert keep.kept == {0, 2, 3} and keep.count == 4
    assert keep.counts == (("a", 0, 10), ("b", 0, 10))
    assert keep.layout == layout_digest(LAYOUT)
    assert reuse.files == {paths[0], paths[2], paths[3]}
    # Kept whole shards are counted as shards, not parts (the rerun's closing line says so).
    assert reuse.describe() == {"version": V, "pieces": 2, "rows": 20, "parts": 0, "shards": 3}
    assert not reuse.parts and not reuse.held


def test_a_batch_across_a_shard_boundary_needs_both_shards(tmp_path: Path) -> None:
    # 3 shards of 40 places: [0, 13), [13, 26), [26, 40); batch (a, 10) holds places 10..19.
    _setup(tmp_path, {0: b"zero", 2: b"two"}, count=3)
    assert list(bounds(40, 3)) == [13, 26]
    reuse = reusable(str(tmp_path), V, LISTED, LISTED, placed={"data": 3})
    assert reuse.batches == {("a", 0)}  # (b, 0) is 20..29: shard 1 too


def test_shuffled_batches_are_skipped_only_when_every_shard_is_kept(tmp_path: Path) -> None:
    _setup(tmp_path, {0: b"0", 1: b"1", 2: b"2"})
    reuse = reusable(str(tmp_path), V, LISTED, LISTED, placed={"data": 4}, shuffled=True)
    assert reuse.batches == frozenset() and reuse.placed["data"].kept == {0, 1, 2}
    assert not reuse.empty  # the shards are kept all the same


def test_every_shard_kept_shuffled(tmp_path: Path) -> None:
    _setup(tmp_path, {s: bytes([s]) for s in range(4)})
    reuse = reusable(str(tmp_path), V, LISTED, LISTED, placed={"data": 4}, shuffled=True)
    assert reuse.batches == {("a", 0), ("a", 10), ("b", 0)}


@pytest.mark.parametrize(
    "case",
    [
        "changed input",
        "new input",
        "other count",
        "layouts disagree",
        "corrupt",
        "two copies differ",
        "not placed",
    ],
)
def test_nothing_is_kept_of_a_shard_that_cannot_be_trusted(tmp_path: Path, case: str) -> None:
    layouts = [LAYOUT, [*LAYOUT[:3], ["b", 5, 9]]] if case == "layouts disagree" else None
    shards = {0: b"zero"}
    paths = _setup(tmp_path, shards, layouts=layouts)
    now, placed = LISTED, {"data": 4}
    if case == "changed input":
        now = {**LISTED, "b": [21, 2.0]}  # a file the layout names, though shard 0 holds none of it
    elif case == "new input":  # matched by the pattern since: its records move every place after
        now = {**LISTED, "c": [5, 3.0]}
    elif case == "other count":
        placed = {"data": 5}
    elif case == "corrupt":
        Path(paths[0]).write_bytes(b"ZERO")
    elif case == "two copies differ":
        pieces = tmp_path / V / layout.PIECES_DIR
        record = json.loads((pieces / "shard-0.json").read_text())
        other = Path(paths[0]).with_name("other.part")  # intact, but not the same bytes
        other.write_bytes(b"other")
        sha = hashlib.sha256(b"other").hexdigest()
        (pieces / "shard-9.json").write_text(json.dumps({**record, "tmp": str(other), "sha256": sha}))
    elif case == "not placed":  # a rolling rerun of the same folder: shard records are not parts
        placed = None  # type: ignore[assignment]
    reuse = reusable(str(tmp_path), V, LISTED, now, placed=placed)
    assert reuse.empty and reuse.files == frozenset()


def test_two_intact_copies_of_a_shard_keep_one(tmp_path: Path) -> None:
    paths = _setup(tmp_path, {0: b"zero"})
    pieces = tmp_path / V / layout.PIECES_DIR
    copy = Path(paths[0]).with_name("copy.part")
    copy.write_bytes(b"zero")
    record = json.loads((pieces / "shard-0.json").read_text())
    (pieces / "shard-9.json").write_text(json.dumps({**record, "tmp": str(copy)}))
    reuse = reusable(str(tmp_path), V, LISTED, LISTED, placed={"data": 4})
    assert len(reuse.files) == 1 and reuse.batches == {("a", 0)}


def test_the_layout_leaves_out_empty_batches_and_is_sorted() -> None:
    assert layout_of([("b", 0, 3), ("a", 5, 0), ("a", 0, 2)]) == [["a", 0, 2], ["b", 0, 3]]
