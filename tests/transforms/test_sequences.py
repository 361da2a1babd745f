"""ToSequences: rows grouped by key into SequenceExamples, with the length policy and dead letters."""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from tensorflow.core.example import example_pb2

from recordforge.conforming.splits import SplitSpec
from recordforge.errors import DataError
from recordforge.runners.unwrap import from_worker
from recordforge.schemas import compile_schema, schema_from_dict
from recordforge.transforms.examples import REJECTED
from recordforge.transforms.sequence_keys import partitions_for
from recordforge.transforms.sequences import COUNTS, ToSequences
from recordforge.transforms.source_types import SourceBatch

FEATURES = [
    {"name": "user", "type": "string", "nulls": "required"},
    {"name": "country", "type": "string"},
    {"name": "ts", "type": "int64", "nulls": "required"},
    {"name": "page", "type": "string"},
    {"name": "items", "type": "int64", "shape": [-1]},
]


def _plan(**block: Any) -> Any:
    sequence = {"key": "user", "order": "ts", "context": ["country"], **block}
    return compile_schema(schema_from_dict({"features": FEATURES, "sequence": sequence}))


def _batch(file: str, first_row: int, rows: list[tuple]) -> SourceBatch:
    names = ["user", "country", "ts", "page", "items"]
    columns = list(zip(*rows, strict=True))
    arrays = [
        pa.array(columns[0], pa.string()),
        pa.array(columns[1], pa.string()),
        pa.array(columns[2], pa.int64()),
        pa.array(columns[3], pa.string()),
        pa.array(columns[4], pa.list_(pa.int64())),
    ]
    return SourceBatch(file, first_row, pa.RecordBatch.from_arrays(arrays, names=names))


def _values(feature: Any) -> list:
    kind = feature.WhichOneof("kind")
    values = list(getattr(feature, kind).value) if kind else []
    return [v.decode() if isinstance(v, bytes) else v for v in values]


def _parsed(record: bytes) -> tuple:
    """A SequenceExample as hashable Python: (context items, feature list items)."""
    seq = example_pb2.SequenceExample.FromString(record)
    context = tuple(sorted((k, tuple(_values(v))) for k, v in seq.context.feature.items()))
    lists = tuple(
        sorted(
            (k, tuple(tuple(_values(f)) for f in v.feature))
            for k, v in seq.feature_lists.feature_list.items()
        )
    )
    return context, lists


def _seq(user: str, country: str | None, steps: list[tuple], chunk: int | None = None) -> tuple:
    """The expected parse of a sequence: steps are (ts, page, items)."""
    context = [("user", (user,))]
    if country is not None:
        context.append(("country", (country,)))
    if chunk is not None:
        context.append(("chunk_index", (chunk,)))
    lists = [
        ("items", tuple(tuple(s[2] or ()) for s in steps)),
        ("page", tuple((s[1],) if s[1] is not None else () for s in steps)),
        ("ts", tuple((s[0],) for s in steps)),
    ]
    return tuple(sorted(context)), tuple(sorted(lists))


# Two files, rows of each group spread over both and out of order; "b" has a tie on ts 5.
FILE_A = [
    ("a", "fr", 3, "p3", [3]),
    ("b", "de", 5, "zz", None),
    ("a", "fr", 1, "p1", []),
    ("c", "us", 9, None, [9, 9]),
    ("d", "uk", 1, "x", None),
]
FILE_B = [
    ("b", "de", 5, "aa", [1]),
    ("a", "fr", 2, "p2", [2, 2]),
    ("d", "ie", 2, "y", None),  # d's country differs: the whole group is rejected
    ("b", "de", 4, "b4", None),
]


def test_groups_across_files_in_order_with_a_bad_context_group_rejected() -> None:
    with TestPipeline() as p:
        out = (
            p
            | beam.Create([_batch("a.parquet", 0, FILE_A), _batch("b.parquet", 0, FILE_B)], reshuffle=False)
            | ToSequences(_plan(), strict=False)
        )
        parsed = out["examples"] | "Parse" >> beam.FlatMap(lambda kv: [_parsed(r) for r in kv[1].to_pylist()])
        assert_that(
            parsed,
            equal_to(
                [
                    _seq("a", "fr", [(1, "p1", []), (2, "p2", [2, 2]), (3, "p3", [3])]),
                    # The tie on ts 5 is broken by the steps' encoded bytes ("zz" has no `items`), not
                    # by the files' order.
                    _seq("b", "de", [(4, "b4", None), (5, "zz", None), (5, "aa", [1])]),
                    _seq("c", "us", [(9, None, [9, 9])]),
                ]
            ),
            label="Sequences",
        )
        rejected = out[REJECTED] | beam.Map(lambda line: _rule_file_row(line))
        assert_that(
            rejected,
            equal_to(
                [
                    ("sequence_context", "a.parquet", 5, "country"),
                    ("sequence_context", "b.parquet", 3, "country"),
                ]
            ),
            label="Rejected",
        )
        counts = out[COUNTS] | beam.CombineGlobally(_sum_pairs)
        assert_that(counts, equal_to([(3, 7)]), label="Counts")


def _rule_file_row(line: str) -> tuple:
    bad = json.loads(line)
    return bad["rule"], bad["file"], bad["row"], bad["column"]


def _sum_pairs(pairs: Any) -> tuple[int, int]:
    pairs = list(pairs)
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


GROUP = [("u", "fr", t, f"p{t}", None) for t in (5, 2, 4, 1, 3)]


@pytest.mark.parametrize(
    ("block", "sequences", "rejected"),
    [
        (
            {"max_length": 2, "longer": "split"},
            [
                _seq("u", "fr", [(1, "p1", None), (2, "p2", None)], chunk=0),
                _seq("u", "fr", [(3, "p3", None), (4, "p4", None)], chunk=1),
                _seq("u", "fr", [(5, "p5", None)], chunk=2),
            ],
            [],
        ),
        (
            {"max_length": 2, "longer": "keep_last"},
            [_seq("u", "fr", [(4, "p4", None), (5, "p5", None)])],
            [
                ("sequence_keep_last", "f", 2, "ts"),
                ("sequence_keep_last", "f", 4, "ts"),
                ("sequence_keep_last", "f", 5, "ts"),
            ],
        ),
        (
            {"max_length": 4, "longer": "reject"},
            [],
            [("sequence_max_length", "f", r, "ts") for r in range(1, 6)],
        ),
        ({"min_length": 6}, [], [("sequence_min_length", "f", r, "ts") for r in range(1, 6)]),
        (
            {"max_length": 5, "longer": "reject"},
            [_seq("u", "fr", [(t, f"p{t}", None) for t in range(1, 6)])],
            [],
        ),
    ],
)
@pytest.mark.parametrize("strict", [False, True])
def test_length_policy(block: dict, sequences: list, rejected: list, strict: bool) -> None:
    """The same with `strict`: rows the declared policy leaves out are not bad rows."""
    with TestPipeline() as p:
        out = (
            p
            | beam.Create([_batch("f", 0, GROUP)], reshuffle=False)
            | ToSequences(_plan(**block), strict=strict)
        )
        parsed = out["examples"] | "Parse" >> beam.FlatMap(lambda kv: [_parsed(r) for r in kv[1].to_pylist()])
        assert_that(parsed, equal_to(sequences), label="Sequences")
        lines = out[REJECTED] | beam.Map(_rule_file_row)
        assert_that(lines, equal_to(rejected), label="Rejected")
        counts = out[COUNTS] | beam.CombineGlobally(_sum_pairs)
        assert_that(counts, equal_to([(len(sequences), 5 - len(rejected))]), label="Counts")


def test_the_same_rows_cut_differently_give_the_same_records() -> None:
    """Group and step order, and the buckets records leave in, owe nothing to files, batches,
    their order or the number of partitions."""
    rows = [r for r in FILE_A + FILE_B if r[0] != "d"]
    cuts = [
        [_batch("x", 0, rows)],
        [_batch("z", 0, rows[::-1][:3]), _batch("y", 0, rows[::-1][3:])],
    ]
    with TestPipeline() as p:
        runs = []
        for i, batches in enumerate(cuts):
            out = (
                p
                | f"Create{i}" >> beam.Create(batches, reshuffle=False)
                | f"ToSequences{i}" >> ToSequences(_plan(), strict=False, partitions=(1, 8)[i])
            )
            runs.append(
                out["examples"]
                | f"Records{i}" >> beam.FlatMap(lambda kv: [(kv[0][1], r) for r in kv[1].to_pylist()])
                | f"All{i}" >> beam.combiners.ToList()
                | f"Sorted{i}" >> beam.Map(lambda records: tuple(sorted(records)))
            )
        both = (
            runs
            | beam.Flatten()
            | beam.combiners.ToList()
            | beam.Map(lambda runs: (len(set(runs)), [len(r) for r in runs]))
        )
        assert_that(both, equal_to([(1, [3, 3])]))


def test_splits_by_the_key_hash_keep_a_group_whole() -> None:
    rows = [(f"u{i % 40}", "fr", i, "p", None) for i in range(200)]
    splits = SplitSpec(("train", "test"), (1, 1))
    with TestPipeline() as p:
        out = p | beam.Create([_batch("f", 0, rows)], reshuffle=False) | ToSequences(_plan(), splits=splits)
        users = out["examples"] | beam.FlatMap(
            lambda kv: [(kv[0][0], dict(_parsed(r)[0])["user"][0]) for r in kv[1].to_pylist()]
        )
        by_user = (
            users
            | beam.Map(lambda su: (su[1], su[0]))
            | beam.GroupByKey()
            | beam.MapTuple(lambda u, s: len(s))
        )
        assert_that(by_user, equal_to([1] * 40), label="OneSequencePerUser")
        which = users | beam.Map(lambda su: su[0]) | beam.Distinct()
        assert_that(which, equal_to(["train", "test"]), label="BothSplits")


def test_strict_fails_on_a_bad_group() -> None:
    with pytest.raises(Exception) as raised, TestPipeline() as p:  # noqa: PT011 - the runner wraps it
        _ = (
            p
            | beam.Create([_batch("a", 0, FILE_A), _batch("b", 0, FILE_B)], reshuffle=False)
            | ToSequences(_plan(), strict=True)
        )
    error = from_worker(raised.value)
    assert isinstance(error, DataError)
    assert "country" in str(error) and "sequence_context" in str(error)


def test_refuses_a_plan_without_a_sequence_block_and_a_split_column() -> None:
    plain = compile_schema(schema_from_dict({"features": FEATURES}))
    with pytest.raises(ValueError, match="sequence"):
        ToSequences(plain)
    with pytest.raises(ValueError, match="power of two"):
        ToSequences(_plan(), partitions=3)
    with pytest.raises(ValueError, match="key's hash"):
        ToSequences(_plan(), splits=SplitSpec(("a", "b"), (1, 1), column="s"))


@pytest.mark.parametrize(
    ("input_bytes", "partitions"),
    [(0, 4), (1, 4), (4 * (64 << 20), 4), (4 * (64 << 20) + 1, 8), (2048 * (64 << 20), 2048)],
)
def test_partitions_follow_the_input_size(input_bytes: int, partitions: int) -> None:
    assert partitions_for(input_bytes) == partitions


def test_empty_input_gives_no_sequences_and_counts_nothing() -> None:
    empty = _batch("f", 0, GROUP).batch.slice(0, 0)
    with TestPipeline() as p:
        out = p | beam.Create([SourceBatch("f", 0, empty)], reshuffle=False) | ToSequences(_plan())
        assert_that(out["examples"], equal_to([]), label="Sequences")
        assert_that(out[COUNTS], equal_to([]), label="Counts")


def test_ties_and_nans_of_a_float_order_are_broken_by_the_steps() -> None:
    """Rows whose order values tie (NaNs included) come out in one order whatever their input order."""
    schema = {
        "features": [
            {"name": "user", "type": "string", "nulls": "required"},
            {"name": "score", "type": "float32", "nulls": "required"},
            {"name": "page", "type": "string"},
        ],
        "sequence": {"key": "user", "order": "score"},
    }
    plan = compile_schema(schema_from_dict(schema))
    rows = [
        ("u", float("nan"), "b"),
        ("u", 1.0, "x"),
        ("u", float("nan"), "a"),
        ("u", 1.0, "c"),
        ("v", 0.0, "z"),
    ]

    def batch(ordered: list[tuple]) -> SourceBatch:
        columns = list(zip(*ordered, strict=True))
        arrays = [pa.array(columns[0]), pa.array(columns[1], pa.float32()), pa.array(columns[2])]
        return SourceBatch("f", 0, pa.RecordBatch.from_arrays(arrays, names=["user", "score", "page"]))

    with TestPipeline() as p:
        runs = []
        for i, ordered in enumerate([rows, rows[::-1], rows[2:] + rows[:2]]):
            out = p | f"Create{i}" >> beam.Create([batch(ordered)]) | f"ToSequences{i}" >> ToSequences(plan)
            runs.append(
                out["examples"]
                | f"Records{i}" >> beam.FlatMap(lambda kv: kv[1].to_pylist())
                | f"All{i}" >> beam.combiners.ToList()
                | f"Sorted{i}" >> beam.Map(lambda records: tuple(sorted(records)))
            )
        both = runs | beam.Flatten() | beam.combiners.ToList() | beam.Map(lambda r: (len(set(r)), len(r[0])))
        assert_that(both, equal_to([(1, 2)]))


def test_key_hashes_depend_on_the_bytes_alone_and_spread() -> None:
    from recordforge.transforms.sequence_keys import key_hashes as _key_hashes

    keys = [f"\x0a\x05user{i}".encode() for i in range(20_000)] + [b"\x00", b"\x00\x00", b"a\x00"]
    arr = pa.array(keys, pa.large_binary())
    hashes = _key_hashes(arr)
    assert len(set(hashes.tolist())) == len(keys)  # zero bytes and lengths count
    assert (_key_hashes(arr.slice(7, 100)) == hashes[7:107]).all()
    assert (_key_hashes(pa.array(keys[::-1], pa.large_binary())) == hashes[::-1]).all()
    buckets = np.bincount((hashes[:20_000] >> np.uint64(60)).astype(np.int64), minlength=16)
    assert buckets.min() > 20_000 / 16 * 0.8
