"""File operations (storage.py) on a local disk and on gs:// (the emulator, tests/gcs_emulator.py)."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from recordforge import layout, storage

# Edge cases in every file: a zero byte, bytes that are not UTF-8, and an empty file.
_DATA = {"a.bin": b"\x00\xff\xfe not utf-8", "sub/b.bin": b"0", "sub/deeper/c.bin": b""}


@pytest.fixture(params=["local", "gcs"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A folder of its own, on a local disk or in a fresh emulated bucket."""
    if request.param == "local":
        return str(tmp_path / "root")
    return request.getfixturevalue("gcs_bucket") + "/root"


def _fill(root: str) -> dict[str, bytes]:
    for name, data in _DATA.items():
        storage.write_atomically(layout.join(root, name), data)
    return {layout.join(root, name): data for name, data in _DATA.items()}


@pytest.mark.parametrize(
    ("path", "local"),
    [
        ("/tmp/x", True),
        ("x/y", True),
        ("", True),
        ("gs://b/x", False),
        ("s3://b/x", False),
        ("file:///x", False),
    ],
)
def test_is_local(path: str, local: bool) -> None:
    assert storage.is_local(path) is local


def test_written_files_read_back_whole(root: str) -> None:
    written = _fill(root)
    for path, data in written.items():
        assert storage.exists(path)
        assert storage.read_bytes(path) == data
    storage.write_atomically(layout.join(root, "a.bin"), b"replaced")
    assert storage.read_bytes(layout.join(root, "a.bin")) == b"replaced"
    assert not storage.exists(layout.join(root, "missing.bin"))


def test_open_write_makes_a_file_of_exactly_its_bytes(root: str) -> None:
    path = layout.join(root, "new", "folder", "x.part")
    with storage.open_write(path) as f:
        f.write(b"\x00\x01")
        f.write(b"\xff")
    assert storage.read_bytes(path) == b"\x00\x01\xff"


def test_list_files_lists_every_file_below_the_folder_only(root: str) -> None:
    written = _fill(root)
    storage.write_atomically(root + "x/beside.bin", b"a neighbour whose name starts the same")
    assert storage.list_files(root) == sorted(written)
    assert storage.list_files(root + "/") == sorted(written)
    assert storage.list_files(layout.join(root, "sub")) == sorted(p for p in written if "/sub/" in p)
    assert storage.list_files(layout.join(root, "nothing-here")) == []


def test_a_folder_with_glob_characters_lists_itself_only(root: str) -> None:
    storage.write_atomically(layout.join(root, "a[1]", "x.bin"), b"x")
    storage.write_atomically(layout.join(root, "a1", "y.bin"), b"y")
    assert storage.list_files(layout.join(root, "a[1]")) == [layout.join(root, "a[1]", "x.bin")]
    assert [m.path for m in storage.match(storage.literal(layout.join(root, "a[1]", "x.bin")))] == [
        layout.join(root, "a[1]", "x.bin")
    ]


def test_match_and_stat_describe_files(root: str) -> None:
    written = _fill(root)
    before = time.time()
    found = {m.path: m for m in storage.match(layout.join(root, "sub", "*"))}
    assert {p: m.size for p, m in found.items() if not p.endswith("/")} == {
        layout.join(root, "sub", "b.bin"): 1
    }
    for path, data in written.items():
        meta = storage.stat(path)
        assert (meta.path, meta.size) == (path, len(data))
        assert 0 < meta.modified <= before + 5
    with pytest.raises(FileNotFoundError):
        storage.stat(layout.join(root, "missing.bin"))
    missing = layout.join(root, "missing.bin")
    assert storage.sizes([*written, missing]) == {p: len(d) for p, d in written.items()}


def test_rename_moves_and_replaces(root: str) -> None:
    written = _fill(root)
    a, b = layout.join(root, "a.bin"), layout.join(root, "sub", "b.bin")
    moved = layout.join(root, "moved.bin")
    storage.rename([a, b], [moved, layout.join(root, "sub", "deeper", "c.bin")])
    assert not storage.exists(a) and not storage.exists(b)
    assert storage.read_bytes(moved) == written[a]
    assert storage.read_bytes(layout.join(root, "sub", "deeper", "c.bin")) == written[b]
    with pytest.raises(ValueError, match="1 sources for 2 destinations"):
        storage.rename([moved], [a, b])


def test_deleting_what_is_gone_already_is_not_an_error(root: str) -> None:
    written = sorted(_fill(root))
    storage.delete_files([written[0], written[0] + ".never-written"])
    assert storage.list_files(root) == written[1:]
    storage.delete_files(written)  # a retried step deletes them again
    assert storage.list_files(root) == []


def test_delete_tree_returns_the_files_deleted(root: str) -> None:
    written = _fill(root)
    assert storage.delete_tree(layout.join(root, "sub")) == 2
    assert storage.list_files(root) == [p for p in written if "/sub/" not in p]
    assert storage.delete_tree(layout.join(root, "sub")) == 0
    if storage.is_local(root):
        assert not os.path.exists(layout.join(root, "sub"))


def test_open_input_decompresses_by_suffix_and_open_read_never_does(root: str) -> None:
    text = b"x,y\n1,\xff\n"
    path = layout.join(root, "in.csv.gz")
    storage.write_atomically(path, gzip.compress(text))
    with storage.open_input(path) as f:
        assert f.read() == text
    assert gzip.decompress(storage.read_bytes(path)) == text
    plain = layout.join(root, "in.csv")
    storage.write_atomically(plain, text)
    with storage.open_input(plain) as f:
        assert f.read() == text


def test_stage_local_writes_beside_the_name_and_leaves_nothing_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / layout.METADATA)
    tmp = storage.stage_local(path, b"{}")
    assert os.path.dirname(tmp) == str(tmp_path) and layout.is_temporary(os.path.basename(tmp))
    assert Path(tmp).read_bytes() == b"{}" and not os.path.exists(path)

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        storage.stage_local(path, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [os.path.basename(tmp)]
