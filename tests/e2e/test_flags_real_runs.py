"""Each flag's `changes_output` marking (which --if_changed relies on) checked against real runs:
a flag marked as changing the output changes what a run publishes, one marked as not changing it
(its input fingerprinted apart, or no bearing on the bytes) leaves the published bytes as they were."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from recordforge.files import layout
from recordforge.pipelines.convert import run
from recordforge.pipelines.flags import FLAGS

_PREP = """
import tensorflow_transform as tft


def fn(inputs):
    return {"id": inputs["id"], "fruit_idx": tft.compute_and_apply_vocabulary(inputs["fruit"])}
"""


def _table(rows: int = 400) -> pa.Table:
    fruit = ["apple", "pear", "fig", "plum"]
    return pa.table(
        {
            "id": list(range(rows)),
            "fruit": [fruit[i * 7 % 4] for i in range(rows)],
            "x": [i * 0.25 for i in range(rows)],
            "part": ["a" if i % 3 else "b" for i in range(rows)],
        }
    )


class Inputs:
    """One folder of inputs for both runs of a case; each case picks what it needs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        pq.write_table(_table(), root / "t.parquet", row_group_size=100)
        self.parquet = str(root / "t.parquet")
        self.schema = str(root / "schema.yaml")
        (root / "schema.yaml").write_text(
            "features:\n"
            "  - {name: id, type: int64, nulls: required}\n"
            "  - {name: fruit, type: string, nulls: required}\n"
            "  - {name: x, type: float64, narrow: true, nulls: required}\n"
            "  - {name: part, type: string, nulls: required}\n"
        )

    def copy(self, path: str, name: str) -> str:
        return str(shutil.copy(path, self.root / name))

    def bad_row(self) -> str:
        """The table with one row whose id is null (rejected: ids are required)."""
        table = _table()
        ids = table.column("id").to_pylist()
        ids[7] = None
        pq.write_table(table.set_column(0, "id", pa.array(ids, pa.int64())), self.root / "bad.parquet")
        return str(self.root / "bad.parquet")

    def with_unreadable(self) -> str:
        data = (self.root / "t.parquet").read_bytes()
        (self.root / "many").mkdir(exist_ok=True)
        (self.root / "many" / "a.parquet").write_bytes(data)
        (self.root / "many" / "z.parquet").write_bytes(data[: len(data) // 2])
        return str(self.root / "many" / "*.parquet")

    def delta_table(self) -> str:
        """A Delta table of two versions: the table, then a second commit of the same rows."""
        import deltalake

        path = str(self.root / "delta")
        if not (self.root / "delta").exists():
            deltalake.write_deltalake(path, _table())
            deltalake.write_deltalake(path, _table(), mode="append")
        return path

    def csv_without_extension(self) -> str:
        pacsv.write_csv(_table(), self.root / "t.dat")
        return str(self.root / "t.dat")

    def spans(self) -> str:
        for n in (1, 2):
            (self.root / f"span-{n}").mkdir(exist_ok=True)
            pq.write_table(_table(50 * n), self.root / f"span-{n}" / "t.parquet")
        return str(self.root / "span-{SPAN}" / "*.parquet")

    def prep(self) -> str:
        (self.root / "prep.py").write_text(_PREP)
        return f"{self.root / 'prep.py'}:fn"


_SPLITS = ["--splits", "train=3,eval=1"]


# For each flag, the two runs compared (--output aside): they differ in that flag alone.
Case = Callable[[Inputs], tuple[list[str], list[str]]]
CASES: dict[str, Case] = {
    # Marked as not changing the output: the same data reached another way.
    "sources": lambda i: (
        ["--source", i.parquet, "--schema", i.schema],
        ["--source", i.copy(i.parquet, "same.parquet"), "--schema", i.schema],
    ),
    "output": lambda i: (["--source", i.parquet, "--schema", i.schema],) * 2,  # outputs differ anyway
    "schema_path": lambda i: (
        ["--source", i.parquet, "--schema", i.schema],
        ["--source", i.parquet, "--schema", i.copy(i.schema, "same.yaml")],
    ),
    "span": lambda i: (["--source", i.spans()], ["--source", i.spans(), "--span", "2"]),
    "if_changed": lambda i: _pair(i, i.parquet, [], ["--if_changed"]),
    "overwrite": lambda i: _pair(i, i.parquet, [], ["--overwrite"]),
    # On an empty output an append is a first build, and a run with nothing to resume converts all.
    "append": lambda i: _pair(i, i.parquet, [], ["--append"]),
    "resume": lambda i: _pair(i, i.parquet, ["--resume=false"], ["--resume"]),
    # Marked as changing the output.
    "source_format": lambda i: (
        ["--source", i.csv_without_extension()],
        ["--source", i.csv_without_extension(), "--format", "csv"],
    ),
    "compression": lambda i: _pair(i, i.parquet, [], ["--compression", "zlib"]),
    "compression_level": lambda i: _pair(i, i.parquet, [], ["--compression_level", "3"]),
    "output_format": lambda i: _pair(
        i, i.parquet, ["--compression", "none"], ["--compression", "none", "--output_format", "array_record"]
    ),
    "record_index": lambda i: _pair(i, i.parquet, ["--compression", "none"], ["--record_index"]),
    "shard_size": lambda i: _pair(i, i.parquet, [], ["--shard_size", "2KB"]),
    "records_per_shard": lambda i: _pair(i, i.parquet, [], ["--records_per_shard", "150"]),
    "num_shards": lambda i: _pair(i, i.parquet, [], ["--num_shards", "3"]),
    # Batches are compressed apart: their boundaries are in the bytes, and in where shards roll.
    "batch_size": lambda i: _pair(
        i, i.parquet, ["--shard_size", "2KB"], ["--shard_size", "2KB", "--batch_size", "64"]
    ),
    "deterministic": lambda i: _pair(
        i, i.parquet, ["--num_shards", "3"], ["--num_shards", "3", "--deterministic"]
    ),
    # A timeline of the run, written beside: the output the same.
    "profile": lambda i: _pair(i, i.parquet, [], ["--profile", str(i.root / "trace.json")]),
    "shuffle": lambda i: _pair(i, i.parquet, [], ["--shuffle"]),
    "seed": lambda i: _pair(i, i.parquet, ["--shuffle"], ["--shuffle", "--seed", "7"]),
    "max_rejected": lambda i: _pair(i, i.bad_row(), [], ["--max_rejected", "5"]),
    "max_rejected_fraction": lambda i: _pair(i, i.bad_row(), [], ["--max_rejected_fraction", "0.5"]),
    # The latest version named or left to the default: the same snapshot, the same output.
    "delta_version": lambda i: _pair(
        i, i.delta_table(), ["--format", "delta"], ["--format", "delta", "--delta_version", "1"]
    ),
    # Every record over a limit of 1 byte: each is rejected, none written.
    "max_record_bytes": lambda i: _pair(
        i,
        i.parquet,
        ["--max_rejected_fraction", "1"],
        ["--max_rejected_fraction", "1", "--max_record_bytes", "1"],
    ),
    "skip_unreadable_files": lambda i: _pair(i, i.with_unreadable(), [], ["--skip_unreadable_files"]),
    "splits": lambda i: _pair(i, i.parquet, [], _SPLITS),
    "split_key": lambda i: _pair(i, i.parquet, _SPLITS, [*_SPLITS, "--split_key", "id"]),
    # The column's values are the split names: hashed into a and b, or taken from `part`.
    "split_column": lambda i: _pair(
        i, i.parquet, ["--splits", "a=3,b=1"], ["--splits", "a=3,b=1", "--split_column", "part"]
    ),
    "split_salt": lambda i: _pair(i, i.parquet, _SPLITS, [*_SPLITS, "--split_salt", "pepper"]),
    "preprocessing_fn": lambda i: _pair(i, i.parquet, [], ["--preprocessing_fn", i.prep()]),
    "analyze_split": lambda i: _pair(
        i,
        i.parquet,
        [*_SPLITS, "--preprocessing_fn", i.prep()],
        [*_SPLITS, "--preprocessing_fn", i.prep(), "--analyze_split", "eval"],
    ),
}


# The flags that decide whether a run publishes at all: without them the base run is refused
# (with this message), with them it publishes.
REFUSED = {
    "source_format": "cannot tell the format of",
    # Strict (the default): the first bad row fails the run where it is found.
    "max_rejected": "row 8, column 'id': null in a feature with `nulls: required`",
    "max_rejected_fraction": "row 8, column 'id': null in a feature with `nulls: required`",
    "skip_unreadable_files": "z.parquet",
}


def _pair(i: Inputs, source: str, base: list[str], changed: list[str]) -> tuple[list[str], list[str]]:
    common = ["--source", source, "--schema", i.schema]
    return [*common, *base], [*common, *changed]


def _published(argv: list[str], out: Path) -> str:
    """What a run published, as one digest (its records' files and the files that describe them),
    or how it failed."""
    try:
        # One worker: with several (the default on a machine with several cores) the same records
        # may land in another order, and this compares bytes.
        run([*argv, "--output", str(out), "--direct_num_workers", "1"])
    except Exception as exn:  # noqa: BLE001 - a run refused is an outcome to compare
        return f"failed: {type(exn).__name__}: {exn}"
    meta = json.loads((out / layout.METADATA).read_text())
    digest = hashlib.sha256()
    for shard in meta["shards"]:
        digest.update(shard["file"].split("/", 1)[1].encode())
        digest.update((out / shard["file"]).read_bytes())
        if shard.get("index"):
            digest.update((out / shard["index"]).read_bytes())
    for name in (layout.FEATURE_SPEC, "schema.pbtxt"):
        digest.update((out / name).read_bytes())
    return digest.hexdigest()


def test_every_flag_has_a_real_run_case() -> None:
    assert set(CASES) == {f.dest for f in FLAGS}


@pytest.mark.parametrize("flag", FLAGS, ids=lambda f: f.name)
def test_a_flag_changes_the_output_exactly_when_it_is_marked_so(flag, tmp_path: Path) -> None:
    """A run that fails is no output: only the base runs of REFUSED fail, with their message.
    Mutation this catches: refusing --seed outright (in ConvertConfig.__post_init__, add
    `problems.append("--seed refused")` when `self.seed != 42`); before, a failed run counted as
    "the output changed" and the [seed] case passed. Take it out again to pass."""
    base, changed = CASES[flag.dest](Inputs(tmp_path))
    before = _published(base, tmp_path / "before")
    after = _published(changed, tmp_path / "after")
    assert not after.startswith("failed"), (flag.name, after)
    if flag.dest in REFUSED:
        assert before.startswith("failed") and REFUSED[flag.dest] in before, (flag.name, before)
    else:
        assert not before.startswith("failed"), (flag.name, before)
    if flag.changes_output:
        assert before != after, (
            f"--{flag.name} is marked as changing the output, yet two runs published the same"
        )
    else:
        assert before == after, (flag.name, before, after)
