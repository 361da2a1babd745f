"""Rows converted so far, counted by each process into a run's progress folder and summed there."""

from __future__ import annotations

import os
import struct
import threading

__all__ = ["count", "total"]


class _Count:
    """This process's running total and the file it keeps it in. A forked worker starts with its
    parent's copy, so the pid in `key` says whether the total is its own."""

    key: tuple[int, str] | None = None
    rows = 0
    fd = -1
    lock = threading.Lock()  # in-process workers are threads of one process


_mine = _Count()


def count(folder: str, rows: int) -> None:
    """Adds `rows` to this process's count in `folder` (cheap: called once per batch). A folder
    that does not exist (a pipeline run without `runners.session`) counts nothing."""
    key = (os.getpid(), folder)
    with _mine.lock:
        if _mine.key != key:
            if _mine.fd != -1 and _mine.key is not None and _mine.key[0] == key[0]:
                os.close(_mine.fd)
            try:
                _mine.fd = os.open(os.path.join(folder, str(key[0])), os.O_CREAT | os.O_WRONLY, 0o600)
            except FileNotFoundError:
                _mine.fd = -1
            _mine.key, _mine.rows = key, 0
        if _mine.fd == -1:
            return
        _mine.rows += rows
        os.pwrite(_mine.fd, struct.pack("<q", _mine.rows), 0)


def total(folder: str) -> int:
    """The rows every process has counted into `folder`."""
    rows = 0
    for name in os.listdir(folder):
        try:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read(8)
        except OSError:
            continue
        if len(data) == 8:
            rows += struct.unpack("<q", data)[0]
    return rows
