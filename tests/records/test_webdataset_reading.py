"""Reading WebDataset shards: the ustar reader against tarfile on archives tarfile wrote (plain
members, pax and GNU headers between them, corruptions), and .npy members against np.load.

Mutations these catch (each tried by hand): the checksum check removed from `ustar._plain` (a
flipped name byte is read as another member instead of refused); the padding after a member not
skipped; the prefix field ignored; `npy.load` not checking that the data is as long as its header
says (a short member read past its end instead of numpy's error)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recordforge.errors import CorruptFile
from recordforge.records import webdataset as wd
from recordforge.records.webdataset import npy, reading, ustar


def _tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    with tarfile.open(path, "w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path.read_bytes()


def _by_tarfile(path: Path) -> list[tuple[int, str, bytes]]:
    """Every member as plain tarfile reads it: (header offset, name, data)."""
    with tarfile.open(path, "r:") as tar:
        out = []
        for info in tar:
            f = tar.extractfile(info)
            assert f is not None
            out.append((info.offset, info.name, f.read()))
        return out


def _ours(path: Path) -> tuple[list[tuple[int, str, bytes]], str]:
    """(members, sha256 of every byte read) as read_samples reads them: the ustar reader, tarfile
    from the first header it does not take."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        source = reading._Hashing(f, digest.update)
        got = list(ustar.members(str(path), source, reading._by_tarfile))
        while source.read(1 << 20):
            pass
    return got, digest.hexdigest()


def _members(n: int, seed: int) -> list[tuple[str, bytes]]:
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 511, 512, 513, 1024, 5000]
    return [
        (f"{i // 3:09d}.f{i % 3}.bin", rng.integers(0, 256, sizes[i % len(sizes)], dtype=np.uint8).tobytes())
        for i in range(n)
    ]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT])
def test_plain_members_and_others_between_them_read_as_tarfile_reads_them(tmp_path: Path, fmt: int) -> None:
    members = _members(40, 1)
    # A long name (pax or GNU header: handed to tarfile from there on), a name split into
    # ustar's prefix and name fields, and plain members after both.
    if fmt != tarfile.USTAR_FORMAT:
        members[7] = (f"000000002.{'x' * 120}.bin", b"long")
    members[20] = (f"000000006.{'d/' * 60}y.bin", b"prefixed")
    path = tmp_path / "a.tar"
    raw = _tar(path, members, fmt)
    got, digest = _ours(path)
    assert got == _by_tarfile(path)
    assert [(n, d) for _, n, d in got] == members
    assert digest == hashlib.sha256(raw).hexdigest()  # every byte was hashed once


def test_the_writers_shards_read_back_every_sample(tmp_path: Path) -> None:
    members = _members(300, 2)
    path = tmp_path / "b.tar"
    _tar(path, members)
    got, _ = _ours(path)
    assert [(n, d) for _, n, d in got] == members
    # read_samples groups a key's members into one sample, at its first header.
    samples = list(wd.read_samples(str(path)))
    assert [k for _, k, _ in samples] == [f"{i:09d}" for i in range(100)]
    assert [o for o, _, _ in samples] == [o for o, n, _ in _by_tarfile(path) if n.endswith(".f0.bin")]


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))


def test_a_corrupt_header_is_refused_not_read_as_another_member(tmp_path: Path) -> None:
    path = tmp_path / "c.tar"
    _tar(path, _members(12, 3), tarfile.USTAR_FORMAT)
    fifth = _by_tarfile(path)[5][0]
    _flip(path, fifth + 3)  # a byte of the fifth member's name: its checksum no longer holds
    with pytest.raises(CorruptFile, match=rf"not a readable tar file \(bad checksum, from byte {fifth}\)"):
        list(wd.read_samples(str(path)))


def test_a_member_cut_short_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "d.tar"
    members = _members(9, 4)
    _tar(path, members, tarfile.USTAR_FORMAT)
    last = _by_tarfile(path)[-1][0]
    with open(path, "r+b") as f:
        f.truncate(last + 512 + len(members[-1][1]) - 1)
    with pytest.raises(CorruptFile, match="unexpected end of data in member '000000002.f2.bin'"):
        list(wd.read_samples(str(path)))


def test_a_member_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "e.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in _members(4, 5):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("000000002.f0.bin")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(CorruptFile, match="'000000002.f0.bin' at byte .* is not a file"):
        list(wd.read_samples(str(path)))


def test_an_archive_without_end_blocks_or_with_trailing_bytes_reads_its_members(tmp_path: Path) -> None:
    path = tmp_path / "f.tar"
    members = _members(6, 6)
    raw = _tar(path, members, tarfile.USTAR_FORMAT)
    end = _by_tarfile(path)[-1][0] + 512 + len(members[-1][1]) + (-len(members[-1][1]) % 512)
    for data in (raw[:end], raw + b"trailing"):
        path.write_bytes(data)
        got, digest = _ours(path)
        assert [(n, d) for _, n, d in got] == members and digest == hashlib.sha256(data).hexdigest()


def _saved(array: Any) -> bytes:
    f = io.BytesIO()
    np.save(f, array, allow_pickle=False)
    return f.getvalue()


ARRAYS = [
    np.arange(7, dtype="<i8"),
    np.arange(7, dtype=">i4"),
    np.zeros(0, "<f4"),
    np.float32(2.5),
    np.array([[1, 2, 3], [4, 5, 6]], "<u2"),
    np.array([True, False, True]),
    np.array([1.5, np.nan, -0.0], "<f8"),
    np.zeros((2, 0, 3), "<f4"),
    np.array([b"ab", b"c"], "S2"),
    np.asfortranarray(np.arange(6, dtype="<i8").reshape(2, 3)),  # np.load's own way
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_npy_members_read_as_np_load_reads_them(array: Any) -> None:
    data = _saved(array)
    for _ in range(2):  # the header parsed, then kept
        got, want = npy.load(data), np.load(io.BytesIO(data), allow_pickle=False)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert (
            got.tobytes(order="A") == want.tobytes(order="A")
            and got.flags.f_contiguous == want.flags.f_contiguous
        )


def test_a_short_or_strange_npy_member_fails_as_np_load_fails() -> None:
    data = _saved(np.arange(10, dtype="<i8"))
    for bad in (data[:-1], data[:20], b"\x93NUMPY\x09\x00" + data[8:], data.replace(b"'<i8'", b"'|O' ")):
        with pytest.raises(Exception) as ours:
            npy.load(bad)
        with pytest.raises(Exception) as numpys:
            np.load(io.BytesIO(bad), allow_pickle=False)
        assert type(ours.value) is type(numpys.value) and str(ours.value) == str(numpys.value)


def test_the_kept_headers_are_bounded() -> None:
    for n in range(npy._MOST_KEPT + 50):
        assert npy.load(_saved(np.zeros(n % 700 + 1, "<i4"))).shape == (n % 700 + 1,)
    assert len(npy._kept) <= npy._MOST_KEPT


def test_reading_stops_at_the_first_zero_block(tmp_path: Path) -> None:
    path = tmp_path / "g.tar"
    raw = _tar(path, _members(3, 7), tarfile.USTAR_FORMAT)
    # After tarfile's end blocks, a valid member (appended, as `tar -A` would not): not read.
    more = tmp_path / "h.tar"
    extra = _tar(more, [("000000009.f0.bin", b"late")], tarfile.USTAR_FORMAT)
    path.write_bytes(raw + extra)
    got, _ = _ours(path)
    assert [n for _, n, _ in got] == [n for n, _ in _members(3, 7)]
    assert os.path.getsize(path) == len(raw) + len(extra)  # the later member is there, unread
