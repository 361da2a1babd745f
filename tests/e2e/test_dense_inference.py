"""Without --schema, Parquet columns with no null in any input (the footers' exact counts) are
dense features; read back by tf.data with feature_spec.json and by TFXIO with schema.pbtxt."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from test_export_correctness import read_tf_data, read_tfxio_tensors

from recordforge.pipelines.convert import run


def _tables() -> list[pa.Table]:
    # `score` is null only in the second file; `tags` is a list (kept variable-length).
    return [
        pa.table(
            {
                "id": [1, 2, 3],
                "score": [0.5, 1.5, 2.5],
                "name": ["a", "b", "c"],
                "tags": [["x"], [], ["y", "z"]],
            }
        ),
        pa.table({"id": [4, 5], "score": [None, 4.5], "name": ["d", "e"], "tags": [None, ["w"]]}),
    ]


def test_columns_without_nulls_are_dense_and_read_back_exactly(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, table in enumerate(_tables()):
        pq.write_table(table, src / f"t{i}.parquet")
    out = tmp_path / "out"
    meta = run(["--source", str(src / "*.parquet"), "--output", str(out)])
    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["id"]["kind"] == spec["name"]["kind"] == "FixedLenFeature"
    assert spec["score"]["kind"] == spec["tags"]["kind"] == "VarLenFeature"
    assert any("dense features" in n and "id, name" in n for n in meta["schema_notes"]), meta["schema_notes"]
    expected = {
        1: (0.5, b"a", [b"x"]),
        2: (1.5, b"b", []),
        3: (2.5, b"c", [b"y", b"z"]),
        4: (None, b"d", []),
        5: (4.5, b"e", [b"w"]),
    }
    for rows, kinds in (read_tf_data(out), read_tfxio_tensors(out)):
        assert kinds["id"] == kinds["name"] == "dense" and kinds["score"] != "dense", kinds
        got = {}
        for r in rows:
            score = r["score"]
            got[r["id"]] = (score[0] if score else None, r["name"], r["tags"])
        assert got == expected


def test_without_statistics_or_with_a_null_a_column_stays_nullable(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2], "v": [1.0, 2.0]})
    pq.write_table(table, tmp_path / "t.parquet", write_statistics=False)
    out = tmp_path / "out"
    run(["--source", str(tmp_path / "t.parquet"), "--output", str(out)])
    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["id"]["kind"] == spec["v"]["kind"] == "VarLenFeature"


def test_infer_schema_says_what_convert_infers(tmp_path: Path, capsys: object) -> None:
    import yaml

    from recordforge.cli.main import main

    for i, table in enumerate(_tables()):
        pq.write_table(table, tmp_path / f"t{i}.parquet")
    assert main(["infer-schema", str(tmp_path / "t*.parquet")]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)  # type: ignore[attr-defined]
    nulls = {f["name"]: f["nulls"] for f in printed["features"]}
    assert nulls == {"id": "required", "score": "absent", "name": "required", "tags": "absent"}


def test_csv_columns_of_json_arrays_are_inferred_as_lists(tmp_path: Path, capsys: object) -> None:
    """A CSV column whose cells are JSON arrays (RecordForge's CSV form of a list) is inferred as a
    list of its elements' type, by convert and infer-schema alike; read back by tf.data and TFXIO."""
    import yaml

    from recordforge.cli.main import main

    src = tmp_path / "t.csv"
    src.write_text(
        "id,ints,floats,words,text\n"
        '1,"[1, 2]","[0.5, 1]","[""a"", ""b""]",[not json\n'
        '2,[],"[2.5]","[""c""]",plain\n'
        '3,,"[]",,"[1, ""x""]"\n'
    )
    out = tmp_path / "out"
    run(["--source", str(src), "--output", str(out)])
    spec = json.loads((out / "feature_spec.json").read_text())
    assert {k: (v["kind"], v["dtype"]) for k, v in spec.items()} == {
        "id": ("VarLenFeature", "int64"),
        "ints": ("VarLenFeature", "int64"),
        "floats": ("VarLenFeature", "float32"),
        "words": ("VarLenFeature", "string"),
        "text": ("VarLenFeature", "string"),  # not arrays of one kind: text
    }
    expected = {
        1: ([1, 2], [0.5, 1.0], [b"a", b"b"], [b"[not json"]),
        2: ([], [2.5], [b"c"], [b"plain"]),
        3: ([], [], [], [b'[1, "x"]']),
    }
    for rows, _ in (read_tf_data(out), read_tfxio_tensors(out)):
        got = {r["id"][0]: (r["ints"], r["floats"], r["words"], r["text"]) for r in rows}
        assert got == expected
    assert main(["infer-schema", str(src)]) == 0
    printed = {f["name"]: f for f in yaml.safe_load(capsys.readouterr().out)["features"]}  # type: ignore[attr-defined]
    assert printed["ints"]["shape"] == printed["words"]["shape"] == [-1]
    assert (printed["ints"]["type"], printed["floats"]["type"], printed["words"]["type"]) == (
        "int64",
        "float64",
        "string",
    )
    assert printed["text"].get("shape", []) == []
