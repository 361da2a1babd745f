"""A run that fails at or after its commit, and a bundle whose manifest is gone: the output is left
published and whole, or as it was, and the next run repairs the rest."""

from __future__ import annotations

import errno
import json
import logging
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.pipelines.convert import run
from recordforge.tools.verify import verify


def _args(tmp_path: Path, rows: int) -> list[str]:
    src = tmp_path / "in" / f"{rows}.parquet"
    src.parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"i": list(range(rows))}), src)
    # One worker, this process: the faults are patched into it, and workers the runner starts
    # afresh (several, by default, where the machine has the cores) would not have them.
    return [
        "--source",
        str(src),
        "--output",
        str(tmp_path / "out"),
        "--compression",
        "none",
        "--direct_num_workers",
        "1",
    ]


def _tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _at_the_top(out: Path, fd_or_path: Any, names: tuple[str, ...]) -> bool:
    """Whether a file descriptor or path is one of `names` (or a temporary of one) in `out` itself."""
    path = os.readlink(f"/proc/self/fd/{fd_or_path}") if isinstance(fd_or_path, int) else str(fd_or_path)
    return os.path.dirname(path) == str(out) and os.path.basename(path).split(".tmp-")[0] in names


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    run(_args(tmp_path, 30))
    out = tmp_path / "out"
    return out, _tree(out)


def test_a_full_disk_at_the_top_level_copies_publishes_nothing(
    published: tuple[Path, dict[str, bytes]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up as the top-level copies are written (after the version's own files):
    the run fails and has not published; the last bundle is as it was; the next run publishes."""
    out, before = published
    original = os.fsync

    def full(fd: int) -> None:
        if _at_the_top(out, fd, layout.TOP_COPIES):
            raise OSError(errno.ENOSPC, "No space left on device")
        original(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(Exception, match="No space left on device"):  # as Beam wraps it
        run([*_args(tmp_path, 40), "--overwrite"])
    assert _tree(out) == before and verify(str(out)) == []
    monkeypatch.undo()
    assert run([*_args(tmp_path, 40), "--overwrite"])["num_records"] == 40
    assert verify(str(out)) == []


def test_a_failure_after_the_commit_point_is_finished_by_the_run(
    published: tuple[Path, dict[str, bytes]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Moving a top-level copy into place fails once, after metadata.json was replaced: the run
    has published, finishes the copies itself, says so, and succeeds."""
    out, _ = published
    failed = tmp_path / "failed-once"  # a file: the step may run in a forked worker
    original = os.replace

    def replace(src: Any, dst: Any) -> None:
        if _at_the_top(out, dst, (layout.CROISSANT,)) and not failed.exists():
            failed.touch()
            raise OSError(errno.EIO, "Input/output error")
        original(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with caplog.at_level(logging.WARNING, logger="recordforge.pipelines.convert"):
        meta = run([*_args(tmp_path, 40), "--overwrite"])
    assert failed.exists() and meta["num_records"] == 40
    assert f"finished the top-level files of version {meta['version']}" in caplog.text
    assert verify(str(out)) == []
    assert not [p for p in out.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
def test_the_journal_decides_whose_files_are_beside_a_lost_manifest(
    published: tuple[Path, dict[str, bytes]], tmp_path: Path, damage: str
) -> None:
    out, _ = published
    version = json.loads((out / layout.METADATA).read_text())["version"]
    if damage == "deleted":
        (out / layout.METADATA).unlink()
    else:
        (out / layout.METADATA).write_text('{"version": "v-2026')
    problems = verify(str(out))
    assert len(problems) == 1 and f"the run journal records {version}" in problems[0], problems
    with pytest.raises(RecordForgeError, match="holds a damaged RecordForge dataset"):
        run(_args(tmp_path, 40))
    assert run([*_args(tmp_path, 40), "--if_changed"])["num_records"] == 40
    (out / layout.METADATA).unlink()
    meta = run([*_args(tmp_path, 50), "--overwrite"])
    assert meta["num_records"] == 50 and verify(str(out)) == []
    assert sorted(p.name for p in out.glob("v-*")) == [meta["version"]]
