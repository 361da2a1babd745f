"""recordforge.convert: the CLI's conversion from Python, with the CLI's checks."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from independent import file_records

import recordforge
from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError, UsageError
from recordforge.output.lease import OutputLocked


def test_convert_from_python_publishes_and_reads_back(tmp_path: Path) -> None:
    for i in range(2):
        pq.write_table(taxi_table(300, seed=i, first_id=300 * i), tmp_path / f"t{i}.parquet")
    out = str(tmp_path / "out")
    meta = recordforge.convert(
        [str(tmp_path / "t0.parquet"), str(tmp_path / "t1.parquet")],
        out,
        "examples/taxi.yaml",
        num_shards=2,
        splits="train=8,eval=2",
        deterministic=True,
    )
    assert meta["num_records"] == meta["rows_read"] == 600
    assert sorted(meta["split_counts"]) == ["eval", "train"] and recordforge.verify(out) == []
    records = sum(1 for s in meta["shards"] for _ in file_records(f"{out}/{s['file']}", "gzip"))
    assert records == 600
    again = recordforge.convert(
        str(tmp_path / "t*.parquet"),
        out,
        "examples/taxi.yaml",
        if_changed=True,
        num_shards=2,
        splits="train=8,eval=2",
        deterministic=True,
    )
    assert again.get("skipped") is True  # the same inputs and settings: nothing to do


def test_a_misspelt_option_is_refused_like_the_cli_refuses_it(tmp_path: Path) -> None:
    pq.write_table(taxi_table(10, seed=1), tmp_path / "t.parquet")
    with pytest.raises(UsageError, match="unknown option num_shard; did you mean num_shards"):
        recordforge.convert(str(tmp_path / "t.parquet"), str(tmp_path / "out"), num_shard=2)
    assert not (tmp_path / "out").exists()


def test_a_conversion_inside_ones_own_pipeline_publishes_a_bundle(tmp_path: Path) -> None:
    """add_conversion: the conversion's steps in a pipeline that does other work too; published
    (and refused beside a running one) as `convert` is, and read back in full."""
    import apache_beam as beam

    pq.write_table(taxi_table(250, seed=3), tmp_path / "t.parquet")
    out = str(tmp_path / "out")
    p = beam.Pipeline()
    conversion = recordforge.add_conversion(p, str(tmp_path / "t.parquet"), out, "examples/taxi.yaml")
    # The pipeline's own step, beside the conversion.
    _ = p | beam.Create(["side"]) | beam.io.WriteToText(str(tmp_path / "side"), shard_name_template="")
    with conversion.publishing():
        # A second run into the same output while this one holds it fails at once.
        holder = conversion.version
        with pytest.raises(OutputLocked, match=rf"{out} is being written by run {holder} "):
            recordforge.convert(str(tmp_path / "t.parquet"), out, "examples/taxi.yaml", overwrite=True)
        p.run().wait_until_finish()
    meta = conversion.published()
    assert meta["num_records"] == meta["rows_read"] == 250 and recordforge.verify(out) == []
    assert (tmp_path / "side").read_text() == "side\n"
    ids = sorted(int(r["trip_id"]) for r in recordforge.read(out))
    assert ids == sorted(taxi_table(250, seed=3).column("trip_id").to_pylist())
    # The same once more, with run(): a rebuild replaces the bundle.
    p2 = beam.Pipeline()
    again = recordforge.add_conversion(
        p2, str(tmp_path / "t.parquet"), out, "examples/taxi.yaml", overwrite=True
    )
    assert again.run(p2)["version"] != meta["version"]
    with pytest.raises(UsageError, match="if_changed"):
        recordforge.add_conversion(beam.Pipeline(), str(tmp_path / "t.parquet"), out, if_changed=True)


def test_every_public_name_is_in_its_modules_all() -> None:
    """A module's public functions and classes are listed in its `__all__` (read from the source:
    importing every module would load TensorFlow)."""
    import ast

    root = Path(recordforge.__file__).parent
    missing = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "__main__.py":
            continue
        tree = ast.parse(path.read_text())
        public = [
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_")
        ]
        listed: list[str] | None = None
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                listed = [e.value for e in node.value.elts]  # type: ignore[attr-defined]
        if public and listed is None:
            missing.append(f"{path.relative_to(root)}: no __all__")
        missing += [f"{path.relative_to(root)}: {name}" for name in public if listed and name not in listed]
    assert not missing, missing


def test_a_callers_failure_after_the_commit_is_raised_not_swallowed(tmp_path: Path) -> None:
    import apache_beam as beam

    pq.write_table(taxi_table(100, seed=4), tmp_path / "t.parquet")
    out = str(tmp_path / "out")
    p = beam.Pipeline()
    conversion = recordforge.add_conversion(p, str(tmp_path / "t.parquet"), out, "examples/taxi.yaml")
    with pytest.raises(ValueError, match="the caller's own failure"):
        with conversion.publishing():
            p.run().wait_until_finish()
            raise ValueError("the caller's own failure")
    # The bundle it committed stands, whole.
    assert conversion.published()["num_records"] == 100 and recordforge.verify(out) == []


def test_conversions_leave_nothing_in_the_temporary_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither a published run, nor one with nothing to do, nor one that fails leaves a folder
    behind, Beam's own included (a pipeline made to validate the options is never run)."""
    import tempfile

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    pq.write_table(taxi_table(50, seed=2), tmp_path / "t.parquet")
    out = str(tmp_path / "out")
    source = str(tmp_path / "t.parquet")
    assert recordforge.convert(source, out, "examples/taxi.yaml")["num_records"] == 50
    assert recordforge.convert(source, out, "examples/taxi.yaml", if_changed=True)["skipped"]
    (tmp_path / "bad.csv").write_text("a\n1\n")
    with pytest.raises(RecordForgeError):
        recordforge.convert(str(tmp_path / "bad.csv"), str(tmp_path / "out2"), "examples/taxi.yaml")
    assert sorted(p.name for p in temp.iterdir()) == []
