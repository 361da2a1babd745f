"""File operations the publishing protocol and the read-only tools need, the same on local disks
and object stores. Local paths use the operating system directly and object stores Beam's
filesystems, imported on first use: `head`, `inspect` and `verify` on a local bundle never load
Beam (its import alone takes about 2 s)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import uuid
from typing import IO, Any

__all__ = [
    "delete_files",
    "delete_tree",
    "exists",
    "is_local",
    "join",
    "list_files",
    "literal",
    "open_read",
    "read_bytes",
    "stage_local",
    "write_atomically",
]


def _fs() -> Any:
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def is_local(path: str) -> bool:
    return "://" not in path


def literal(path: str) -> str:
    """`path` as a match pattern that matches itself only (glob characters escaped)."""
    return glob.escape(path)


def list_files(folder: str) -> list[str]:
    """Every file below `folder`, at any depth; [] when there is none (or no folder)."""
    folder = folder.rstrip("/")
    if is_local(folder):
        out = []
        for root, _dirs, files in os.walk(folder):
            out.extend(os.path.join(root, f) for f in files)
        return sorted(out)
    result = _fs().match([f"{literal(folder)}/**"])[0]
    return sorted(m.path for m in result.metadata_list if not m.path.endswith("/"))


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


def stage_local(path: str, data: bytes) -> str:
    """`data` written in full and synced to a temporary name beside the local `path` (the name
    `{path}.tmp-{32 hex}`), which it returns; nothing is left if writing fails."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def write_atomically(path: str, data: bytes) -> None:
    """A reader sees the old file or the new one, whole, never part of one. Locally: a temporary
    name beside `path`, then rename(2), which replaces atomically. On an object store an upload
    becomes visible only when it completes, and replaces the object as a whole."""
    if not is_local(path):
        with _fs().create(path) as f:
            f.write(data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = stage_local(path, data)
    try:
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def join(base: str, *names: str) -> str:
    """`names` below the folder `base`, local or on an object store."""
    return os.path.join(base, *names) if is_local(base) else _fs().join(base, *names)
