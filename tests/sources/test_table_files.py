"""JSON Lines blocks and ranges, ORC stripes and statistics, Arrow pieces: the pure functions
behind ReadTables, against the formats' own writers and readers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.json as pj
import pyarrow.orc as orc
import pytest

from recordforge.errors import SourceError
from recordforge.sources import jsonl, orc_tail, table_files
from recordforge.sources.jsonl import BadLine, Lines

_INTS = pj.ParseOptions(explicit_schema=pa.schema([("a", pa.int64())]), unexpected_field_behavior="ignore")


def _parts(data: bytes, first: int = 0) -> list[tuple]:
    out: list[tuple] = []
    for part in jsonl.parse_block(data, first, _INTS):
        if isinstance(part, Lines):
            out.append(("rows", part.first_line, part.table.column("a").to_pylist()))
        else:
            assert isinstance(part, BadLine)
            out.append(("bad", part.line, part.column, part.text))
    return out


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b'{"a": 1}\n{"a": 2}\n', [("rows", 10, [1, 2])]),
        (b'{"a": 1}\n{"a": 2}', [("rows", 10, [1, 2])]),  # no line end after the last line
        (b'{"a": 0}\n\n{"a": 2}\n', [("rows", 10, [0]), ("rows", 12, [2])]),  # a blank line counted
        (b'{"a": 1}\n  \t\n{"a": 2}\n', [("rows", 10, [1]), ("rows", 12, [2])]),
        (
            b'{"a": 1}\n{"a": "x"}\n{"a": 3}\n',
            [("rows", 10, [1]), ("bad", 11, "a", '{"a": "x"}'), ("rows", 12, [3])],
        ),
        (b'{"a": 1}{"a": 2}\n{"a": 3}\n', [("bad", 10, "*", '{"a": 1}{"a": 2}'), ("rows", 11, [3])]),
        (b'[1]\n{"a": 2}\n', [("bad", 10, "*", "[1]"), ("rows", 11, [2])]),
        (b'{"a": 1.5}\n', [("bad", 10, "*", '{"a": 1.5}')]),
        (b'{"b": 1}\n{"a": null}\n', [("rows", 10, [None, None])]),  # absent and null: null
        (b'{"a": 1, "a2": "\\u00e9\\n"}\n', [("rows", 10, [1])]),  # an escaped line break
    ],
)
def test_a_block_gives_its_good_lines_in_runs_and_each_bad_line(data: bytes, expected: list[tuple]) -> None:
    assert _parts(data, 10) == expected


def test_bad_lines_anywhere_in_a_large_block_are_found_by_halving() -> None:
    lines = [b'{"a": %d}' % i for i in range(1000)]
    for i in (0, 377, 378, 999):
        lines[i] = b'{"a": "s%d"}' % i
    parts = _parts(b"\n".join(lines) + b"\n")
    assert [p[1] for p in parts if p[0] == "bad"] == [0, 377, 378, 999]
    rows = [(p[1] + k, v) for p in parts if p[0] == "rows" for k, v in enumerate(p[2])]
    assert rows == [(i, i) for i in range(1000) if i not in (0, 377, 378, 999)]


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 10**6])
def test_line_ranges_cover_the_file_at_line_starts_with_their_line_numbers(chunk: int) -> None:
    data = b"".join(b'{"i": %d}\n' % i + (b"\n" if i % 7 == 3 else b"") for i in range(300))
    ranges = jsonl.line_ranges(io.BytesIO(data), len(data), chunk)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    for start, _, first in ranges:
        assert start == 0 or data[start - 1 : start] == b"\n"
        assert data[:start].count(b"\n") == first


def test_blocks_are_whole_lines_and_every_byte_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonl, "BLOCK_BYTES", 10_000)
    data = b"".join(b'{"i": %d, "pad": "%s"}\n' % (i, b"x" * (i % 50)) for i in range(20000))
    blocks = list(jsonl.read_blocks(io.BytesIO(data), None))
    assert len(blocks) > 1 and b"".join(blocks) == data and all(b.endswith(b"\n") for b in blocks)
    part = list(jsonl.read_blocks(io.BytesIO(data[100:]), 5000))
    assert b"".join(part) == data[100:5100]


def test_the_sample_unifies_types_and_refuses_a_json_array() -> None:
    data = b'{"a": 1, "b": "x"}\n{"a": 2.5, "b": "y"}\n{"a": 3, "b": 7}\n{"a": 4, "b": "z"}\n'
    schema = jsonl.sample_schema(io.BytesIO(data), "t.jsonl")
    assert schema.field("a").type == pa.float64() and schema.field("b").type == pa.string()
    with pytest.raises(SourceError, match="t.json: holds a JSON array, not JSON Lines"):
        jsonl.sample_schema(io.BytesIO(b'[{"a": 1}]'), "t.json")


def test_orc_stripes_and_statistics_from_the_file_tail(tmp_path: Path) -> None:
    struct = pa.struct([("x", pa.int64()), ("y", pa.string())])
    table = pa.table(
        {
            "a": pa.array(range(5000), pa.int64()),
            "n": pa.array([None if i == 4321 else i for i in range(5000)], pa.int64()),
            "st": pa.array([{"x": i, "y": None if i % 2 else "y"} for i in range(5000)], struct),
            "ns": pa.array([None if i == 7 else {"x": i, "y": "y"} for i in range(5000)], struct),
            "l": pa.array([[k] for k in range(5000)], pa.list_(pa.int64())),
        }
    )
    for compression in ("uncompressed", "zlib", "zstd"):
        path = tmp_path / f"{compression}.orc"
        orc.write_table(table, path, stripe_size=4096, batch_size=300, compression=compression)
        reader = orc.ORCFile(path)
        tail = reader.reader.serialized_file_tail()
        assert orc_tail.stripe_rows(tail) == [reader.read_stripe(i).num_rows for i in range(reader.nstripes)]
        assert reader.nstripes > 3 or compression != "uncompressed"
        assert orc_tail.never_null_paths(tail) == {"a", "st.x", "l"}


def test_arrow_null_counts_give_the_columns_without_a_null(tmp_path: Path) -> None:
    struct = pa.struct([("x", pa.int64())])
    first = pa.table({"a": [1, 2], "b": [1, None], "st": pa.array([{"x": 1}, None], struct)})
    second = pa.table({"a": [3, None], "b": [1, 2], "st": pa.array([{"x": 1}, {"x": 2}], struct)})
    with ipc.new_file(tmp_path / "one.arrow", first.schema) as w:
        w.write_table(first)
    with ipc.new_stream(tmp_path / "two.arrow", second.schema) as w:
        w.write_table(second)
    paths = [str(tmp_path / "one.arrow"), str(tmp_path / "two.arrow")]
    assert table_files.never_null_columns(paths[:1], "arrow") == {"a"}
    assert table_files.never_null_columns(paths[1:], "arrow") == {"b", "st.x"}
    assert table_files.never_null_columns(paths, "arrow") == frozenset()


def test_a_file_that_is_not_its_format_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.orc"
    path.write_bytes(b"not orc at all" * 100)
    with pytest.raises(SourceError, match=r"t.orc: cannot read its schema as ORC"):
        table_files.arrow_schema(str(path), "orc")
    with pytest.raises(SourceError, match=r"t.orc: cannot read as ORC"):
        table_files.pieces(str(path), None, "orc")
    assert table_files.pieces(str(path), None, "orc", skip_unreadable=True)[0].error


def test_json_columns_absent_from_a_block_are_nulls_of_their_type(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps({"a": i}) for i in range(5)) + "\n")
    types = pa.schema([("a", pa.int64()), ("z", pa.string())])
    options = table_files.parse_options(types, ["a", "z"])
    [(first, batch)] = list(
        table_files.read_piece(table_files.Piece(str(path)), "jsonl", ["a", "z"], 100, options)
    )
    assert first == 0 and batch.column("a").to_pylist() == [0, 1, 2, 3, 4]
    assert batch.schema.field("z").type == pa.string() and batch.column("z").null_count == 5
