"""File operations (storage.py) on a local disk and on gs:// (the emulator, tests/gcs_emulator.py)."""

from __future__ import annotations

import errno
import fcntl
import gzip
import os
import time
from pathlib import Path

import numpy as np
import pytest

from recordforge.files import layout, storage

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


def _pieces() -> list[bytes]:
    """Writes of awkward sizes: empty, one byte, either side of a block, across the buffer."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 4095, 4096, 4097, 3 << 20, 0, 2 << 20, 12345, 1]
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]


def test_a_direct_write_makes_a_file_of_exactly_its_bytes(root: str) -> None:
    path = layout.join(root, "new", "folder", "shard.part")
    pieces = _pieces()
    with storage.open_write(path, direct=True) as f:
        for piece in pieces:
            assert f.write(memoryview(piece)) == len(piece)
    assert storage.read_bytes(path) == b"".join(pieces)
    with storage.open_write(path, direct=True) as f:  # replaces what was there
        f.write(b"short")
    assert storage.read_bytes(path) == b"short"


def _refuses_direct(folder: Path) -> bool:
    try:
        fd = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644)
    except OSError:
        return True
    os.close(fd)
    return False


def _recorded_writes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bool, int, int]]:
    """(O_DIRECT set, file offset, length) of every os.write from here on."""
    calls: list[tuple[bool, int, int]] = []
    write = os.write

    def recorded(fd: int, data: bytes) -> int:
        direct = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT)
        calls.append((direct, os.lseek(fd, 0, os.SEEK_CUR), len(data)))
        return write(fd, data)

    monkeypatch.setattr(os, "write", recorded)
    return calls


def test_a_direct_write_reaches_the_disk_in_whole_blocks_and_only_its_tail_is_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "shard.part")
    pieces = _pieces()
    if _refuses_direct(tmp_path):  # a filesystem without O_DIRECT: a plain buffered file
        f = storage.open_write(path, direct=True)
        assert not isinstance(f, storage._DirectWriter)
        f.close()
        return
    calls = _recorded_writes(monkeypatch)
    with storage._DirectWriter(path, buffer=1 << 20) as f:
        for piece in pieces:
            f.write(piece)
    data = b"".join(pieces)
    assert Path(path).read_bytes() == data
    *whole, tail = calls
    assert whole and all(direct and at % 4096 == 0 and size % 4096 == 0 for direct, at, size in whole)
    assert sum(size for _, _, size in whole) == len(data) - len(data) % 4096
    assert tail == (False, len(data) - len(data) % 4096, len(data) % 4096)


def test_direct_writes_refused_go_through_the_page_cache_and_other_errors_are_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"".join(_pieces())
    # Refused at open: a plain file.
    real_open = os.open

    def no_direct(path: str, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", no_direct)
    with storage.open_write(str(tmp_path / "a.part"), direct=True) as f:
        assert not isinstance(f, storage._DirectWriter)
        f.write(data)
    assert (tmp_path / "a.part").read_bytes() == data
    monkeypatch.setattr(os, "open", real_open)
    if _refuses_direct(tmp_path):
        return  # the rest needs a filesystem that opens files with O_DIRECT

    # Refused at a write (an alignment the device does not take): that block again, buffered.
    real_write = os.write

    def refuse_direct(fd: int, view: bytes) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, view)

    monkeypatch.setattr(os, "write", refuse_direct)
    f = storage._DirectWriter(str(tmp_path / "b.part"), buffer=1 << 20)
    f.write(data)
    f.close()
    assert not f.direct and (tmp_path / "b.part").read_bytes() == data

    # A full disk is raised, at the write that meets it or at close, and the file is closed.
    def full(fd: int, view: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    f = storage._DirectWriter(str(tmp_path / "c.part"), buffer=1 << 20)
    fd = f.fileno()
    with pytest.raises(OSError, match="No space left"):
        f.write(data)  # the first full buffer meets it
    with pytest.raises(OSError, match="No space left"):
        f.close()  # what is left meets it too; the file is closed all the same
    assert f.closed
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
