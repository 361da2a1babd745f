"""Every file operation RecordForge makes, the same on local disks and object stores.

Local paths use the operating system directly and object stores Beam's filesystems, imported on
first use: `head`, `inspect` and `verify` on a local bundle never load Beam (its import alone takes
about 2 s). Two go through Beam on local disks too, to keep its grammar: `match` (Beam's glob
patterns) and `open_input` (decompression chosen by the file's suffix)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import io
import mmap
import os
import shutil
from dataclasses import dataclass
from functools import partial
from typing import IO, TYPE_CHECKING, BinaryIO

from recordforge.files import layout

if TYPE_CHECKING:  # imported on first use (see above)
    from apache_beam.io.filesystems import FileSystems

__all__ = [
    "FileMeta",
    "delete_files",
    "delete_tree",
    "exists",
    "is_local",
    "join",
    "list_files",
    "literal",
    "match",
    "open_input",
    "open_read",
    "open_write",
    "read_bytes",
    "rename",
    "sizes",
    "stage_local",
    "stat",
    "write_atomically",
]


def _fs() -> type[FileSystems]:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


@dataclass(frozen=True)
class FileMeta:
    """A file as a listing describes it."""

    path: str
    size: int
    modified: float  # seconds since the epoch; 0.0 where the store does not say


def is_local(path: str) -> bool:
    """True for a path on a local disk, False for one with a scheme (`gs://...`)."""
    return "://" not in path


def literal(path: str) -> str:
    """`path` as a match pattern that matches itself only (glob characters escaped)."""
    return glob.escape(path)


def list_files(folder: str) -> list[str]:
    """Every file below `folder`, at any depth; [] when there is none (or no folder)."""
    folder = folder.rstrip("/")
    if is_local(folder):
        out: list[str] = []
        for root, _dirs, files in os.walk(folder):
            out.extend(os.path.join(root, f) for f in files)
        return sorted(out)
    return sorted(m.path for m in match(f"{literal(folder)}/**") if not m.path.endswith("/"))


def match(pattern: str) -> list[FileMeta]:
    """What Beam's filesystems match for `pattern`, in their order (folder placeholders of an
    object store, names ending in '/', included); errors are Beam's."""
    result = _fs().match([pattern])[0]
    return [
        FileMeta(m.path, m.size_in_bytes, getattr(m, "last_updated_in_seconds", 0.0) or 0.0)
        for m in result.metadata_list
    ]


def stat(path: str) -> FileMeta:
    """The file at `path` as it is now; FileNotFoundError when there is none (or several)."""
    if is_local(path):
        st = os.stat(path)
        return FileMeta(path, st.st_size, st.st_mtime)
    found = match(literal(path))
    if len(found) != 1:
        raise FileNotFoundError(f"{path}: {len(found)} files match")
    return found[0]


def sizes(paths: list[str]) -> dict[str, int]:
    """The size of each of `paths` that exists."""
    out = {}
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            out[path] = stat(path).size
    return out


def delete_tree(folder: str) -> int:
    """Deletes every file below `folder` and, on local disks, the folders; returns the files
    deleted. Deleting what is already gone is not an error (a retried step does it twice)."""
    files = list_files(folder)
    delete_files(files)
    if is_local(folder) and os.path.isdir(folder):
        with contextlib.suppress(FileNotFoundError):  # gone already: a retried step
            shutil.rmtree(folder)
    return len(files)


def delete_files(paths: list[str]) -> None:
    """Deletes these files; one already gone is not an error (a retried step deletes it twice).
    Object-store files go in one batch, one by one only when some were gone already."""
    remote = []
    for path in paths:
        if is_local(path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        else:
            remote.append(path)
    if remote:
        fs = _fs()
        try:
            fs.delete(remote)
        except Exception:  # noqa: BLE001 - some were gone already: delete the rest one by one
            for path in remote:
                if fs.exists(path):
                    fs.delete([path])


def exists(path: str) -> bool:
    return os.path.exists(path) if is_local(path) else _fs().exists(path)


def open_read(path: str) -> IO[bytes]:
    """The file's bytes as stored (never decompressed on the way, whatever its suffix)."""
    if is_local(path):
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    return _fs().open(path, compression_type="uncompressed")


def read_bytes(path: str) -> bytes:
    with open_read(path) as f:
        return f.read()


def open_input(path: str) -> IO[bytes]:
    """An input file's contents, decompressed as its suffix says (`.gz`, `.bz2`, `.deflate`, ...:
    Beam's CompressionTypes.AUTO), through Beam's filesystems wherever the file is."""
    return _fs().open(path)


def open_write(path: str, *, direct: bool = False) -> IO[bytes]:
    """A new file at `path`, its bytes written as given; local folders on the way are made.
    `direct`: a long write nothing reads back soon (a shard): on a local disk that allows it, its
    bytes reach the disk without a copy in the page cache (`_DirectWriter`)."""
    if is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if direct and _O_DIRECT:
            try:
                return _DirectWriter(path)
            except OSError as exn:
                if exn.errno != errno.EINVAL:  # EINVAL: the filesystem refuses O_DIRECT
                    raise
        return open(path, "wb")  # noqa: SIM115 - the caller closes it
    from apache_beam.io.filesystem import CompressionTypes

    return _fs().create(path, compression_type=CompressionTypes.UNCOMPRESSED)


def rename(sources: list[str], destinations: list[str]) -> None:
    """Moves each source to its destination, replacing a file there: rename(2) on local disks,
    copy then delete on object stores (so not atomic there)."""
    if len(sources) != len(destinations):
        raise ValueError(f"{len(sources)} sources for {len(destinations)} destinations")
    remote = [(s, d) for s, d in zip(sources, destinations, strict=True) if not (is_local(s) and is_local(d))]
    for source, destination in zip(sources, destinations, strict=True):
        if is_local(source) and is_local(destination):
            os.replace(source, destination)
    if remote:
        _fs().rename([s for s, _ in remote], [d for _, d in remote])


def stage_local(path: str, data: bytes, *, sync: bool = True) -> str:
    """`data` written in full and synced (unless not `sync`) to a temporary name beside the local
    `path` (the name `layout.temp_beside`), which it returns; nothing is left if writing fails."""
    tmp = layout.temp_beside(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def write_atomically(path: str, data: bytes, *, sync: bool = True) -> None:
    """A reader sees the old file or the new one, whole, never part of one. Locally: a temporary
    name beside `path`, synced unless not `sync` (what a killed process wrote survives it
    unsynced; a power cut may lose it), then rename(2), which replaces atomically. On an object
    store an upload becomes visible only when it completes, and replaces the object as a whole."""
    if not is_local(path):
        with open_write(path) as f:  # as given: never compressed on the way, whatever the suffix
            f.write(data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = stage_local(path, data, sync=sync)
    try:
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def join(base: str, *names: str) -> str:
    """`names` below the folder `base`, local or on an object store."""
    return os.path.join(base, *names) if is_local(base) else _fs().join(base, *names)


_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux and some BSDs; elsewhere every write is buffered
# O_DIRECT needs the memory, the file offset and the length aligned to the device's block, at
# most a page on the disks and filesystems met; a write refused for alignment is written again
# through the page cache.
_ALIGN = 4096
_DIRECT_BUFFER = 4 << 20


class _DirectWriter(io.BufferedIOBase, BinaryIO):  # type: ignore[misc]  # BufferedWriter's bases
    """A new local file written with O_DIRECT: bytes gather in a page-aligned buffer of `buffer`
    bytes, written whole to the disk each time it fills; the last, unaligned bytes go through the
    page cache at `close`.

    Why: writing a shard through the page cache copies every byte into pages the kernel must
    first find (on a VM, often fresh from the host), and makes the kernel write them again later
    on its own threads; a conversion writes bytes no one reads soon. Where the filesystem refuses
    O_DIRECT at open (`open_write` falls back to a plain file) or a write for its alignment
    (EINVAL), the rest is written through the page cache. What reaches the disk is the same bytes
    either way, and as before nothing is synced: a killed run's partial file is never used (a
    shard counts once its writer is closed)."""

    def __init__(self, path: str, buffer: int = _DIRECT_BUFFER) -> None:
        if buffer <= 0 or buffer % _ALIGN:
            raise ValueError(f"buffer must be a positive multiple of {_ALIGN}, not {buffer}")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | _O_DIRECT
        self._fd = os.open(path, flags, 0o666)
        try:
            self._map = mmap.mmap(-1, buffer)  # page-aligned, as O_DIRECT needs
        except BaseException:
            os.close(self._fd)
            raise
        import numpy as np  # here: storage's other users (head, inspect) never need it

        self._bytes = partial(np.frombuffer, dtype=np.uint8)
        self._buffer = self._bytes(self._map)
        self._fill = 0
        self.direct = True  # while O_DIRECT is set: False once writes go through the page cache

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        if self.closed:
            raise ValueError("write to a closed file")
        src = self._bytes(data)
        size, at = len(src), 0
        while at < size:
            take = min(size - at, len(self._buffer) - self._fill)
            # numpy copies with the GIL released: the encoder's thread keeps running meanwhile.
            self._buffer[self._fill : self._fill + take] = src[at : at + take]
            self._fill += take
            at += take
            if self._fill == len(self._buffer):
                self._write_out(0, self._fill)
                self._fill = 0
        return size

    def _write_out(self, start: int, end: int) -> None:
        view = memoryview(self._map)[start:end]
        try:
            while view:
                try:
                    written = os.write(self._fd, view)
                except OSError as exn:
                    if exn.errno != errno.EINVAL or not self.direct:
                        raise
                    self._buffered()  # refused for its alignment: nothing of it was written
                    continue
                view = view[written:]
                if view and self.direct and written % _ALIGN:
                    self._buffered()  # a short write left the offset unaligned
        finally:
            view.release()

    def _buffered(self) -> None:
        fcntl.fcntl(self._fd, fcntl.F_SETFL, fcntl.fcntl(self._fd, fcntl.F_GETFL) & ~_O_DIRECT)
        self.direct = False

    def close(self) -> None:
        if self.closed:
            return
        try:
            whole = self._fill - self._fill % _ALIGN
            if whole:
                self._write_out(0, whole)
            if self._fill > whole:
                if self.direct:
                    self._buffered()  # the tail is not a whole block
                self._write_out(whole, self._fill)
        finally:
            del self._buffer
            self._map.close()
            os.close(self._fd)
            super().close()
