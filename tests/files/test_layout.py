"""The names and paths of a bundle (layout.py): pure functions, local paths and gs:// alike."""

from __future__ import annotations

import re

import pytest

from recordforge.files import layout


@pytest.mark.parametrize(
    ("parts", "joined"),
    [
        (("/data/out", "v-1", "x.json"), "/data/out/v-1/x.json"),
        (("/data/out/", "/v-1/", "x.json"), "/data/out/v-1/x.json"),
        (("gs://b/out", "v-1", "x.json"), "gs://b/out/v-1/x.json"),
        (("gs://b/out/", "_recordforge/", "/runs"), "gs://b/out/_recordforge/runs"),
        (("out",), "out"),
    ],
)
def test_join(parts: tuple[str, ...], joined: str) -> None:
    assert layout.join(*parts) == joined


@pytest.mark.parametrize("output", ["/data/out", "/data/out/", "gs://b/out", "gs://b/out/"])
def test_the_state_files_of_an_output(output: str) -> None:
    out = output.rstrip("/")
    assert layout.lock_path(output) == f"{out}/_recordforge/lock"
    assert layout.guard_path(layout.lock_path(output)) == f"{out}/_recordforge/lock.guard"
    assert layout.journal_dir(output) == f"{out}/_recordforge/runs"
    assert layout.journal_entry(output, "v-x") == f"{out}/_recordforge/runs/v-x"
    assert layout.version_root(output, "v-x") == f"{out}/v-x"


@pytest.mark.parametrize(
    ("folder", "name", "shard", "count", "suffix", "path"),
    [
        ("/o/v-1", "data", 3, 8, ".tfrecord.gz", "/o/v-1/data-00003-of-00008.tfrecord.gz"),
        ("/o/v-1/", "train", 0, 1, ".tfrecord", "/o/v-1/train-00000-of-00001.tfrecord"),
        (
            "gs://b/o/v-1",
            "data",
            0,
            0,
            ".tfrecord.deflate",
            "gs://b/o/v-1/data-00000-of-00000.tfrecord.deflate",
        ),
        ("gs://b/o/v-1", "data", 123456, 123457, "", "gs://b/o/v-1/data-123456-of-123457"),
    ],
)
def test_shard_names(folder: str, name: str, shard: int, count: int, suffix: str, path: str) -> None:
    assert layout.shard_name(layout.shard_prefix(folder, name), shard, count, suffix) == path


@pytest.mark.parametrize("root", ["/o/v-1", "gs://b/o/v-1/"])
def test_rejected_prefix(root: str) -> None:
    assert layout.rejected_prefix(root) == f"{root.rstrip('/')}/_rejected/rejected"
    assert layout.REJECTED_SUFFIX == ".jsonl"


def test_new_versions_are_versions_and_unique() -> None:
    versions = {layout.new_version() for _ in range(100)}
    assert len(versions) == 100
    assert all(layout.is_version(v) for v in versions)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("v-20260101T000000Z-0123abcd", True),
        ("v-20260101T000000Z-0123ABCD", False),
        ("v-20260101T000000Z-0123abc", False),
        ("v-20260101-0123abcd", False),
        ("v-20260101T000000Z-0123abcd/", False),
        ("", False),
        ("_recordforge", False),
    ],
)
def test_is_version(name: str, expected: bool) -> None:
    assert layout.is_version(name) is expected


@pytest.mark.parametrize("folder", ["/o/v-1", "gs://b/o/v-1"])
def test_temporary_names_are_fresh_and_in_their_folder(folder: str) -> None:
    temp = layout.temp_dir(folder)
    assert temp.rsplit("/", 1)[0] == folder
    assert re.fullmatch(r"_tmp-[0-9a-f]{12}", temp.rsplit("/", 1)[1])
    assert temp.rsplit("/", 1)[1].startswith(layout.TEMP_DIR_PREFIX)
    assert temp != layout.temp_dir(folder)
    part = layout.temp_file(temp, "joined-00001")
    assert part.rsplit("/", 1)[0] == temp
    assert re.fullmatch(r"joined-00001-[0-9a-f]{32}\.part", part.rsplit("/", 1)[1])
    assert re.fullmatch(
        r"batch-[0-9a-f]{32}\.arrow", layout.temp_file(temp + "/", "batch", ".arrow").rsplit("/", 1)[1]
    )
    assert part != layout.temp_file(temp, "joined-00001")


@pytest.mark.parametrize("output", ["/o", "gs://b/o"])
def test_temporaries_beside_top_level_files_are_recognised(output: str) -> None:
    tmp = layout.temp_beside(layout.join(output, layout.METADATA))
    name = tmp.rsplit("/", 1)[1]
    assert re.fullmatch(r"metadata\.json\.tmp-[0-9a-f]{32}", name)
    assert layout.is_temporary(name)
    assert tmp != layout.temp_beside(layout.join(output, layout.METADATA))


@pytest.mark.parametrize(
    "name",
    [
        "notes.txt.tmp-" + "0" * 32,  # beside a file that is not RecordForge's
        "metadata.json.tmp-" + "0" * 31,
        "metadata.json.tmp-" + "G" * 32,
        "metadata.json",
        "v-20260101T000000Z-0123abcd",
        "_recordforge/lock.tmp-" + "0" * 32,
    ],
)
def test_other_names_are_not_temporaries(name: str) -> None:
    assert not layout.is_temporary(name)


@pytest.mark.parametrize(
    ("output", "path", "top", "relative"),
    [
        ("/o", "/o/v-1/data-00000-of-00001.tfrecord", "v-1", "v-1/data-00000-of-00001.tfrecord"),
        ("/o/", "/o/metadata.json", "metadata.json", "metadata.json"),
        ("/o", "/other/x.csv", "", "x.csv"),
        ("/o", "/ox/x.csv", "", "x.csv"),
        ("gs://b/o", "gs://b/o/_recordforge/runs/v-1", "_recordforge", "_recordforge/runs/v-1"),
        ("gs://b/o", "gs://b/other/x.csv", "", "x.csv"),
    ],
)
def test_top_entry_and_relative(output: str, path: str, top: str, relative: str) -> None:
    assert layout.top_entry(output, path) == top
    assert layout.relative(path, output) == relative
