"""Groups over max_group_rows, spilled rows and fine partitions: the same sequences and dead letters
as a partition held whole, or the declared refusal."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from recordforge.schemas import compile_schema, schema_from_dict
from recordforge.transforms.examples import REJECTED
from recordforge.transforms.sequence_groups import group_sizes
from recordforge.transforms.sequences import ToSequences
from recordforge.transforms.source_types import SourceBatch

FEATURES = [
    {"name": "user", "type": "string", "nulls": "required"},
    {"name": "country", "type": "string"},
    {"name": "ts", "type": "int64", "nulls": "required"},
    {"name": "page", "type": "string"},
]


def _plan(**block: Any) -> Any:
    sequence = {"key": "user", "order": "ts", "context": ["country"], **block}
    return compile_schema(schema_from_dict({"features": FEATURES, "sequence": sequence}))


def _batches(seed: int = 7) -> list[SourceBatch]:
    """Four files; user "big" has 40 rows spread over all of them (ties on ts included), the
    others 1-6 rows; "x" has a context conflict."""
    rng = np.random.default_rng(seed)
    rows = [("big", "fr", int(t), f"p{i}") for i, t in enumerate(rng.integers(0, 30, 40))]
    for u in range(30):
        rows += [(f"u{u}", "de", int(t), None if t % 3 else f"q{t}") for t in rng.integers(0, 100, 1 + u % 6)]
    rows += [("x", "uk", 1, "a"), ("x", "ie", 2, "b")]
    order = rng.permutation(len(rows))
    out = []
    for f, part in enumerate(np.array_split(order, 4)):
        chosen = [rows[i] for i in part]
        cols = list(zip(*chosen, strict=True))
        arrays = [
            pa.array(cols[0]),
            pa.array(cols[1]),
            pa.array(cols[2], pa.int64()),
            pa.array(cols[3], pa.string()),
        ]
        out.append(
            SourceBatch(
                f"f{f}.parquet",
                0,
                pa.RecordBatch.from_arrays(arrays, names=["user", "country", "ts", "page"]),
            )
        )
    return out


def _letter(line: str) -> tuple[str, int, str]:
    letter = json.loads(line)
    return letter["file"], letter["row"], letter["rule"]


def _outcome(
    p: beam.Pipeline, label: str, plan: Any, *, partitions: int = 4, spill_dir: str | None = None
) -> Any:
    """One element: (the records' bytes, sorted; the dead letters as (file, row, rule), sorted)."""
    out = (
        p
        | f"Create{label}" >> beam.Create(_batches(), reshuffle=False)
        | f"ToSequences{label}" >> ToSequences(plan, strict=False, partitions=partitions, spill_dir=spill_dir)
    )
    records = out["examples"] | f"Records{label}" >> beam.FlatMap(
        lambda kv: [("r", r) for r in kv[1].to_pylist()]
    )
    letters = out[REJECTED] | f"Letters{label}" >> beam.Map(lambda line: ("d", _letter(line)))
    return (
        (records, letters)
        | f"Both{label}" >> beam.Flatten()
        | f"All{label}" >> beam.combiners.ToList()
        | f"Sort{label}"
        >> beam.Map(
            lambda items: (
                tuple(sorted(v for k, v in items if k == "r")),
                tuple(sorted(v for k, v in items if k == "d")),
            )
        )
    )


def _same(*outcomes: Any) -> Any:
    """One element, True, when every outcome is the same."""
    return (
        outcomes
        | "AllOutcomes" >> beam.Flatten()
        | "Outcomes" >> beam.combiners.ToList()
        | "Equal" >> beam.Map(lambda found: len(found) == len(outcomes) and len(set(found)) == 1)
    )


@pytest.mark.parametrize("longer", ["keep_last", "reject"])
def test_a_group_over_the_limit_gives_what_holding_it_whole_gives(longer: str) -> None:
    """keep_last keeps the last steps and reject rejects the group as they are read, never
    gathering it: the same records and dead letters as the partition held whole."""
    policy = "sequence_keep_last" if longer == "keep_last" else "sequence_max_length"
    with TestPipeline() as p:
        whole = _outcome(p, "Whole", _plan(max_length=5, longer=longer))
        streamed = _outcome(p, "Streamed", _plan(max_length=5, longer=longer, max_group_rows=8))
        assert_that(_same(whole, streamed), equal_to([True]), label="Same")
        rules = whole | "Rules" >> beam.Map(lambda o: sorted({rule for _, _, rule in o[1]}))
        assert_that(rules, equal_to([sorted({"sequence_context", policy})]), label="TheRules")


def _without_big(limited: tuple, whole: tuple) -> tuple[int, int, bool, bool]:
    over = [letter for letter in limited[1] if letter[2] == "sequence_group_rows"]
    others = tuple(sorted(set(limited[1]) - set(over)))
    return len(over), len(whole[0]) - len(limited[0]), others == whole[1], set(limited[0]) < set(whole[0])


def test_a_group_over_the_limit_that_cannot_be_cut_is_rejected_whole() -> None:
    with TestPipeline() as p:
        whole = _outcome(p, "Whole", _plan())
        limited = _outcome(p, "Limited", _plan(max_group_rows=8))
        found = limited | beam.Map(_without_big, beam.pvalue.AsSingleton(whole))
        # every row of "big" and nothing else; one sequence fewer, the others the same
        assert_that(found, equal_to([(40, 1, True, True)]))


def test_spilled_rows_and_fine_partitions_give_the_same_records(tmp_path: Path) -> None:
    plan = _plan(max_length=4)  # groups split into chunks
    spill = str(tmp_path / "spill")
    with TestPipeline() as p:
        held = _outcome(p, "Held", plan)
        spilled = _outcome(p, "Spilled", plan, spill_dir=spill)
        fine = _outcome(p, "Fine", plan, partitions=4096)  # finer than the output buckets
        assert_that(_same(held, spilled, fine), equal_to([True]))
    assert any(name.endswith(".arrow") for name in os.listdir(spill))  # the rows waited there


def test_group_sizes_sum_the_fragments_counts() -> None:
    hashes, counts = group_sizes(
        [np.array([5, 9], np.uint64), np.array([9], np.uint64), np.array([1, 5], np.uint64)],
        [np.array([2, 1]), np.array([4]), np.array([1, 3])],
    )
    assert hashes.tolist() == [1, 5, 9] and counts.tolist() == [1, 5, 5]
    empty = group_sizes([], [])
    assert empty[0].size == 0 and empty[1].size == 0
