"""Which pieces of a killed run a rerun keeps (pieces.reusable), on records written by hand."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from recordforge.files import layout
from recordforge.output.pieces import reusable

V = "v-20260101T000000Z-00000000"


def _setup(out: Path, parts: list[tuple[bytes, list[list]]], batches: list[list]) -> dict[str, str]:
    root = out / V
    (root / layout.PIECES_DIR).mkdir(parents=True)
    (root / layout.PIECES_DIR / "batches-1.json").write_text(json.dumps({"batches": batches}))
    paths = {}
    for i, (data, keys) in enumerate(parts):
        tmp = root / "_tmp-x" / f"part-{i}.part"
        tmp.parent.mkdir(exist_ok=True)
        tmp.write_bytes(data)
        record = {"writer": "data", "tmp": str(tmp), "records": 0, "bytes": len(data),
                  "sha256": hashlib.sha256(data).hexdigest(), "first_key": None, "first_record": 0,
                  "segments": [], "keys": keys}  # fmt: skip
        (root / layout.PIECES_DIR / f"part-{i}.json").write_text(json.dumps(record))
        paths[f"p{i}"] = str(tmp)
    return paths


LISTED = {"a": [10, 1.0], "b": [20, 2.0]}


def test_whole_batches_are_skipped_and_an_unfinished_one_is_converted_less_what_parts_hold(
    tmp_path: Path,
) -> None:
    paths = _setup(
        tmp_path,
        [
            (b"one", [["", "a", 0, 0, 5], ["", "a", 5, 0, 2]]),  # batch (a, 5) continues in part 2
            (b"two", [["", "a", 5, 2, 4]]),
            (b"three", [["", "b", 0, 0, 3], ["", "b", 3, 0, 1]]),  # (b, 3) was never recorded
        ],
        [["a", 0, 5, {"": 5}], ["a", 5, 4, {"": 4}], ["b", 0, 3, {"": 3}]],
    )
    reuse = reusable(str(tmp_path), V, LISTED, LISTED)
    assert reuse.batches == {("a", 0), ("a", 5), ("b", 0)} and reuse.rows == 12
    assert reuse.files == {paths["p0"], paths["p1"], paths["p2"]}
    # (b, 3) is converted again; its first record, in part 3, is not written again.
    assert reuse.held == {"data": {("", "b", 3): ((0, 1),)}}


def test_a_changed_input_a_corrupt_part_or_a_twice_written_batch_is_converted_again(tmp_path: Path) -> None:
    paths = _setup(
        tmp_path,
        [(b"one", [["", "a", 0, 0, 5]]), (b"two", [["", "b", 0, 0, 3]]), (b"dup", [["", "b", 0, 0, 3]])],
        [["a", 0, 5, {"": 5}], ["b", 0, 3, {"": 3}]],
    )
    assert reusable(str(tmp_path), V, LISTED, LISTED).batches == {("a", 0)}  # (b, 0) twice: neither
    assert reusable(str(tmp_path), V, LISTED, {**LISTED, "a": [11, 1.0]}).batches == frozenset()
    Path(paths["p0"]).write_bytes(b"ONE")
    assert reusable(str(tmp_path), V, LISTED, LISTED).batches == frozenset()


def test_a_lost_part_costs_only_its_own_batches_not_the_chain_before_it(tmp_path: Path) -> None:
    # A worker's full parts cut batches in two; its last part was being written when it died.
    _setup(
        tmp_path,
        [
            (b"one", [["", "a", 0, 0, 5], ["", "a", 5, 0, 2]]),
            (b"two", [["", "a", 5, 2, 4], ["", "b", 0, 0, 1]]),  # (b, 0) goes on in the lost part
        ],
        [["a", 0, 5, {"": 5}], ["a", 5, 4, {"": 4}], ["b", 0, 3, {"": 3}]],
    )
    reuse = reusable(str(tmp_path), V, LISTED, LISTED)
    assert reuse.batches == {("a", 0), ("a", 5)} and reuse.rows == 9
    assert reuse.describe()["parts"] == 2 and reuse.describe()["shards"] == 0
    assert reuse.held == {"data": {("", "b", 0): ((0, 1),)}}
