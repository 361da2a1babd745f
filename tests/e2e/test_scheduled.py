"""Scheduled builds: span resolution, --if_changed, and what the manifest records of the inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import published_root

from recordforge.errors import SourceError
from recordforge.pipelines.convert import run
from recordforge.pipelines.spans import Span, resolve_span, substitute


def _day(root: Path, day: str, rows: int) -> None:
    folder = root / day.replace("-", "/")
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"x": list(range(rows))}), folder / "part.parquet")


def test_span_resolution_picks_the_right_folder(tmp_path: Path) -> None:
    for day, rows in [("2024-01-30", 1), ("2024-02-01", 2), ("2023-12-31", 3)]:
        _day(tmp_path, day, rows)
    pattern = str(tmp_path / "{YYYY}/{MM}/{DD}/*.parquet")
    assert resolve_span([pattern], "latest") == Span({"YYYY": "2024", "MM": "02", "DD": "01"})
    assert substitute(pattern, resolve_span([pattern], "2023-12-31")).endswith("2023/12/31/*.parquet")
    for n in (3, 12, 4):
        (tmp_path / "spans" / f"span-{n}").mkdir(parents=True)
        pq.write_table(pa.table({"x": [n]}), tmp_path / "spans" / f"span-{n}" / "a.parquet")
    assert resolve_span([str(tmp_path / "spans/span-{SPAN}/*.parquet")], "latest").values == {"SPAN": "12"}
    with pytest.raises(SourceError, match="no span found"):
        resolve_span([str(tmp_path / "nothing/{SPAN}/*.parquet")], "latest")

    meta = run(["--source", pattern, "--output", str(tmp_path / "out/{YYYY}{MM}{DD}")])
    assert meta["num_records"] == 2 and meta["span"] == "2024-02-01"
    assert (tmp_path / "out" / "20240201" / "_SUCCESS").exists()
    meta = run(
        ["--source", pattern, "--output", str(tmp_path / "out/{YYYY}{MM}{DD}"), "--span", "2023-12-31"]
    )
    assert meta["num_records"] == 3


def test_if_changed_skips_then_rebuilds(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1, 2, 3]}), src)
    args = ["--source", str(src), "--output", str(tmp_path / "out"), "--if_changed"]
    first = run(args)
    assert "skipped" not in first and first["num_records"] == 3
    second = run(args)
    assert second["skipped"] is True and second["input_fingerprint"] == first["input_fingerprint"]
    pq.write_table(pa.table({"x": [1, 2, 3, 4]}), src)
    os.utime(src, (1_800_000_000, 1_800_000_000))
    third = run(args)
    assert "skipped" not in third and third["num_records"] == 4
    # A different setting is a different output, too.
    assert "skipped" not in run([*args, "--compression", "none"])


def test_manifest_records_inputs_and_versions(tmp_path: Path) -> None:
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"x": [1]}), src)
    meta = run(["--source", str(src), "--output", str(tmp_path / "out")])
    (source,) = meta["sources"]
    assert source["path"] == str(src) and source["bytes"] == src.stat().st_size
    assert source["modified"] == pytest.approx(src.stat().st_mtime, abs=1)
    assert meta["versions"]["apache-beam"].startswith("2.")
    assert meta["command"][:2] == ["--source", str(src)]
    on_disk = sorted(f"{meta['version']}/{p.name}" for p in published_root(tmp_path / "out").glob("data-*"))
    assert on_disk == [s["file"] for s in meta["shards"]]
    assert json.loads((tmp_path / "out" / "metadata.json").read_text()) == meta


def test_schedule_examples_use_real_flags() -> None:
    import ast
    import subprocess

    from recordforge.pipelines.template import template_metadata

    root = Path(__file__).resolve().parents[2] / "deploy" / "schedule"
    names = {p["name"] for p in template_metadata()["parameters"]}
    body = json.loads((root / "launch_body.json").read_text())
    assert set(body["launchParameter"]["parameters"]) <= names
    tree = ast.parse((root / "airflow_dag.py").read_text())
    options = next(
        kw.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        for kw in node.keywords
        if kw.arg == "pipeline_options"
    )
    keys = {k.value for k in options.keys}
    beam_flags = {"temp_location", "sdk_container_image", "sdk_location"}
    assert keys - beam_flags <= names and keys & names
    assert subprocess.run(["bash", "-n", str(root / "cloud_scheduler.sh")]).returncode == 0
