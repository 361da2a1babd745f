"""Each input is listed once, on the launcher, when the pipeline is built: workers, wherever they
run, get the listing rather than making it again (issue 22, item 5)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.testing.util import assert_that, equal_to

from demo.sampledata import mnist_folder, taxi_table
from recordforge.pipelines.convert import run
from recordforge.runners.traits import ANY_RUNNER
from recordforge.transforms import image_folder

# Beam's own local runner, which shares no work: the graph Dataflow and Dask run (chunks and row
# groups spread by a Reshuffle), run in this process so that every listing is seen.
STOCK_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"
SPREAD_FLAGS = [f"--runner={STOCK_RUNNER}", "--direct_num_workers=2"]
_GLOB = re.compile(r"[*?\[]")


@pytest.fixture
def matches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every pattern given to FileSystems.match in this process, in order."""
    seen: list[str] = []
    real = FileSystems.match

    def counting(patterns: list[str], limits: Any = None) -> Any:
        seen.extend(patterns)
        return real(patterns, limits)

    monkeypatch.setattr(FileSystems, "match", counting)
    return seen


def _upload(local: Path, remote: str) -> None:
    for path in sorted(local.rglob("*.png")):
        with FileSystems.create(f"{remote}/{path.relative_to(local).as_posix()}") as f:
            f.write(path.read_bytes())


def _put_parquet(path: str, table: pa.Table, row_group_size: int) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size)
    with FileSystems.create(path) as f:
        f.write(buf.getvalue())


def _rows(batches: Iterator[Any]) -> list[tuple]:
    return [(b.first_row, tuple(b.batch.column("path").to_pylist())) for b in batches]


@pytest.mark.parametrize(("groups", "start", "rows"), [([3, 0, 4, 1], 0, 8), ([3, 4, 1], 2, 3), ([5], 1, 2)])
def test_a_part_of_a_listing_is_its_rows_in_compact_form(groups: list[int], start: int, rows: int) -> None:
    listed = [
        (f"gs://b/r/f{i}", [f"{i}-{k}.png" for k in range(n)], f"l{i}", "") for i, n in enumerate(groups)
    ]
    sizes = list(range(100, 100 + sum(groups)))
    folder = image_folder.ImageFolder(
        "gs://b/r", [g for g in listed if g[1]], ["l0", "l1", "l2", "l3"], [], sizes, 0
    )
    part_groups, part_sizes = folder.part(start, rows)
    part = image_folder.ImageFolder(folder.root, part_groups, folder.labels, [], part_sizes, 0)
    assert part.entries == folder.entries[start : start + rows]
    assert part_sizes == sizes[start : start + rows]
    assert all(names for _, names, _, _ in part_groups)  # only the folders the rows are in


def test_a_gcs_image_folder_is_listed_once(gcs_bucket: str, tmp_path: Path, matches: list[str]) -> None:
    """On a runner that spreads work, the launcher's listing is carried to the workers in the
    chunks: reading lists nothing, and the batches hold every image of the listing, in order,
    with its label."""
    mnist_folder(str(tmp_path / "digits"), per_class=6)  # 70 images
    root = f"{gcs_bucket}/digits"
    _upload(tmp_path / "digits", root)
    folder = image_folder.list_image_folder(root)
    assert matches == [f"{root}/**"] and folder.count == 70
    del matches[:]
    expected = [
        (start, tuple(p for p, _, _ in folder.entries[start : start + rows]))
        for start, rows in image_folder.chunk_ranges(folder.count, 16)
    ]
    labels = [(p, label, folder.labels.index(label), split) for p, label, split in folder.entries]
    with beam.Pipeline(runner=STOCK_RUNNER) as p:
        read = p | image_folder.ReadImageFolder(folder, batch_size=16, traits=ANY_RUNNER)
        batches = read["batches"]
        # Batches cut at the chunks (16 images, well under the byte bound), keyed by first row.
        assert_that(batches | beam.Map(lambda b: _rows([b])[0]), equal_to(expected), label="Chunks")
        rows = batches | beam.FlatMap(lambda b: [tuple(r.values()) for r in b.batch.to_pylist()])
        assert_that(rows, equal_to(labels), label="Labels")
    assert matches == []


def test_a_local_image_folder_is_listed_once_with_spread_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[str] = []
    real = image_folder._walk_local

    def counting(root: str) -> Any:
        walks.append(root)
        return real(root)

    monkeypatch.setattr(image_folder, "_walk_local", counting)
    written = mnist_folder(str(tmp_path / "digits"), per_class=5)
    out = tmp_path / "out"
    meta = run(
        ["--format", "images", "--source", str(tmp_path / "digits"), "--output", str(out), *SPREAD_FLAGS]
    )
    assert walks == [str(tmp_path / "digits")]  # at construction, nowhere else
    assert meta["num_records"] == meta["images"] == len(written)


# "one": one worker, in this process, so that every listing and lookup is seen.
@pytest.mark.parametrize("flags", [["--direct_num_workers=1"], SPREAD_FLAGS], ids=["one", "spread"])
def test_gcs_parquet_and_csv_inputs_are_listed_once(
    gcs_bucket: str, tmp_path: Path, matches: list[str], flags: list[str]
) -> None:
    """The pattern is matched once, at construction; workers open the files they were given
    (reading footers and rows needs no listing). The bundle step looks each input file up by its
    literal path (unchanged while it was read?): a lookup, not a listing."""
    src = f"{gcs_bucket}/in"
    for i in range(2):
        _put_parquet(f"{src}/t{i}.parquet", taxi_table(300, seed=i, first_id=300 * i), 100)
    with FileSystems.create(f"{src}/c.csv") as f:
        f.write(b"id,name\n" + b"".join(b"%d,n%d\n" % (k, k) for k in range(50)))
    for pattern, files, rows in [(f"{src}/*.parquet", 2, 600), (f"{src}/*.csv", 1, 50)]:
        del matches[:]
        out = tmp_path / pattern.rsplit(".", 1)[1]
        meta = run(["--source", pattern, "--output", str(out), *flags])
        assert meta["num_records"] == rows
        listings = [m for m in matches if _GLOB.search(m)]
        assert listings == [pattern], matches
        looked_up = sorted(m for m in matches if m.startswith(src) and not _GLOB.search(m))
        assert looked_up == sorted(s["path"] for s in meta["sources"]) and len(looked_up) == files


def test_the_dry_run_summary_of_a_spread_image_read(tmp_path: Path) -> None:
    """On Dataflow the chunks are the job's only data: one Create, spread by its Reshuffle, and no
    listing step."""
    mnist_folder(str(tmp_path / "digits"), per_class=2)
    summary = run(
        [
            "--format=images",
            "--source",
            str(tmp_path / "digits"),
            "--output",
            str(tmp_path / "out"),
            "--runner=DataflowRunner",
            "--project=my-project",
            "--region=us-central1",
            "--temp_location=gs://bucket/tmp",
            "--dry_run=True",
        ]
    )
    steps = [label for stage in summary["stages"] for label in stage]
    assert "Read/Chunks" in steps and "Read/Read" in steps
    assert not any(s in steps for s in ("Read/Root", "Read/List")), steps
    assert json.dumps(summary)  # plain data


def test_a_gcs_image_folder_converts_from_and_to_gcs(gcs_bucket: str, tmp_path: Path) -> None:
    """The whole run on gs://: the folder stands as one input in the bundle (not a file the
    publish step could look up), every image becomes a record."""
    written = mnist_folder(str(tmp_path / "digits"), per_class=4)
    root = f"{gcs_bucket}/digits"
    _upload(tmp_path / "digits", root)
    out = f"{gcs_bucket}/out"
    meta = run(["--format", "images", "--source", root, "--output", out, *SPREAD_FLAGS])
    assert meta["num_records"] == meta["images"] == len(written)
    assert meta["sources"][0]["path"] == root and meta["sources"][0]["bytes"] > 0
    from recordforge.tools.verify import verify

    assert verify(out) == []


def test_if_changed_lists_the_inputs_once(tmp_path: Path, matches: list[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(taxi_table(300, seed=1), src / "a.parquet")
    pattern, out = str(src / "*.parquet"), str(tmp_path / "out")
    run(["--source", pattern, "--output", out])
    pq.write_table(taxi_table(300, seed=2, first_id=300), src / "b.parquet")  # a new input
    del matches[:]
    meta = run(["--source", pattern, "--output", out, "--if_changed"])
    assert meta["num_records"] == 600 and not meta.get("skipped")
    assert matches.count(pattern) == 1, matches
