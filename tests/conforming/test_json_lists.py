"""JSON list cells parsed, vectorised and cell by cell, against json.loads."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from recordforge.conforming.json_lists import numeric_json_lists, parse_json_lists
from recordforge.schemas import schema_from_dict


@pytest.mark.parametrize("dtype", ["int64", "float32", "float64", "bool"])
def test_vectorised_json_lists_match_json_loads(dtype: str) -> None:
    feature = schema_from_dict(
        {
            "features": [
                {
                    "name": "x",
                    "type": dtype,
                    "shape": [-1],
                    **({"narrow": True} if dtype == "float64" else {}),
                }
            ]
        }
    ).features[0]
    rng = np.random.default_rng(4)
    cells: list[str | None] = []
    for k in rng.integers(0, 6, 300):
        if k == 5:
            cells.append(None if rng.random() < 0.5 else "")
            continue
        if dtype == "int64":
            values = [int(v) for v in rng.integers(-(2**62), 2**62, int(k))]
        elif dtype == "bool":
            values = [bool(v) for v in rng.integers(0, 2, int(k))]
        else:
            values = [float(v) for v in rng.standard_normal(int(k)) * 1e6]
        sep = [",", ", ", " ,  "][int(rng.integers(0, 3))]
        cells.append("[" + sep.join(json.dumps(v) for v in values) + "]")
    got = numeric_json_lists(pa.array(cells), feature)
    assert got is not None
    value_type = {"int64": pa.int64(), "bool": pa.bool_(), "float32": pa.float32(), "float64": pa.float64()}[
        dtype
    ]
    expected = pa.array(
        [None if c in (None, "") else json.loads(c) for c in cells], pa.large_list(value_type)
    )
    assert got.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize(
    "cell",
    [
        '["a"]',
        "[[1]]",
        "[1, x]",
        "{}",
        "[1,, 2]",
        "[1,]",
        "[,1]",
        "[1 2]",
        "[1] x",
        "[1][2]",
        "[1",
        "1]",
        "2",
    ],
)
def test_vectorised_json_lists_defer_anything_else(cell: str) -> None:
    feature = schema_from_dict({"features": [{"name": "x", "type": "int64", "shape": [-1]}]}).features[0]
    assert numeric_json_lists(pa.array(["[1]", cell]), feature) is None


def test_json_list_cells_parse_as_json_loads_reads_them() -> None:
    """Whichever path a column takes (vectorised, or json.loads per cell when one cell is not
    simple), valid cells give json.loads' values and invalid ones are rejected rows."""
    feature = schema_from_dict({"features": [{"name": "x", "type": "int64", "shape": [-1]}]}).features[0]
    valid = ["[1, 2]", " [3,4] ", "[ ]", "[]", "[5,\t6]", "[\n7\n]", "[-8]", "", None, "  "]
    for cells in (valid, [*valid, "[1,]", "[9] x"]):
        lists, bad = parse_json_lists(pa.array(cells), feature)
        got = lists.to_pylist()
        rules = {i: rule for i, rule, _ in bad}
        for i, cell in enumerate(cells):
            if cell is None or not cell.strip():
                assert got[i] is None
                continue
            try:
                expected = json.loads(cell)
            except ValueError:
                assert got[i] is None and rules[i] == "type"
                continue
            assert got[i] == expected and i not in rules
        assert len(bad) == len(rules) == len(cells) - len(valid)
