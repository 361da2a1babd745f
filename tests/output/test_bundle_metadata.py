"""metadata_dict: an appended version's manifest lists the base's shards first, then its own."""

from __future__ import annotations

from typing import Any

import pytest

from recordforge.output.bundle_metadata import BundleSpec, RunCounts, RunFacts, metadata_dict
from recordforge.records.tfrecord import ShardInfo
from recordforge.schemas import compile_schema, schema_from_dict

_PLAN = compile_schema(schema_from_dict({"features": [{"name": "id", "type": "int64"}]}))
# Two versions made in the same second: the new one's random part sorts before the base's.
_BASE, _NEW = "v-20260101T000000Z-ffffffff", "v-20260101T000000Z-00000000"


def _listed(file: str, records: int, split: str | None = None) -> dict[str, Any]:
    return {
        "file": file,
        **({"split": split} if split else {}),
        "records": records,
        "bytes": 10 * records,
        "sha256": f"sha-{file}",
    }


def _base(shards: list[dict[str, Any]]) -> dict[str, Any]:
    rows = sum(s["records"] for s in shards)
    return {
        "version": _BASE,
        "shards": shards,
        "rows_read": rows,
        "rows_written": rows,
        "rejected_by_rule": {},
        "sources": [{"path": "/in/a.parquet", "bytes": 1, "modified": 1.0}],
        "unreadable_files": [],
    }


@pytest.mark.parametrize("splits", [False, True])
def test_an_append_lists_the_base_shards_first_in_their_order_then_its_own(splits: bool) -> None:
    def name(version: str, split: str, i: int, n: int) -> str:
        return (
            f"{version}/{split}/{split}-{i:05d}-of-{n:05d}.tfrecord"
            if splits
            else (f"{version}/data-{i:05d}-of-{n:05d}.tfrecord")
        )

    split = "train" if splits else None
    # The base's own order, kept as is (here not a path order, as a base that was itself
    # appended to may list an older version's shards before its own).
    base_shards = [_listed(name(_BASE, "train", i, 3), 5 + i, split) for i in (2, 0, 1)]
    out = "/out"
    spec = BundleSpec(
        output=out,
        version=_NEW,
        plan=_PLAN,
        source_format="parquet",
        sources=(("/in/b.parquet", 1, 2.0),),
        compression="none",
        facts=RunFacts(split_weights={"train": 1} if splits else None),
        base=_base(base_shards),
    )
    # This run's shards as the writers report them, in no particular order.
    own = [ShardInfo(f"{out}/{name(_NEW, 'train', i, 2)}", 7, 70, "x") for i in (1, 0)]
    meta = metadata_dict(spec, own, RunCounts(rows_read=14, rejected_by_rule={}))

    assert [s["file"] for s in meta["shards"]] == [
        *(s["file"] for s in base_shards),
        name(_NEW, "train", 0, 2),
        name(_NEW, "train", 1, 2),
    ]
    assert meta["shards"][:3] == base_shards
    assert meta["num_records"] == meta["rows_read"] == 18 + 14


def test_a_plain_build_lists_its_shards_in_path_order() -> None:
    out = "/out"
    spec = BundleSpec(
        output=out, version=_NEW, plan=_PLAN, source_format="parquet", sources=(), compression="none"
    )
    own = [ShardInfo(f"{out}/{_NEW}/data-{i:05d}-of-00003.tfrecord", 1, 10, "x") for i in (2, 0, 1)]
    meta = metadata_dict(spec, own, RunCounts(rows_read=3, rejected_by_rule={}))
    assert [s["file"] for s in meta["shards"]] == [f"{_NEW}/data-{i:05d}-of-00003.tfrecord" for i in range(3)]
