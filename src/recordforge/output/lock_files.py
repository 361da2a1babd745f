"""The lock file of an output on a local disk or on gs://: created whole and only if absent, read
with its exact version, removed or refreshed only while it is still that version (lease.py)."""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from recordforge.files import layout

__all__ = ["GcsLockFile", "LocalLockFile", "Seen"]


@dataclass(frozen=True)
class Seen:
    """A lock file as read: its holder, seconds since its last heartbeat, and the exact version read."""

    content: bytes
    age: float
    version: object
    holder: dict[str, Any] = field(init=False)

    def __post_init__(self) -> None:
        try:
            holder = json.loads(self.content)
        except ValueError:  # empty (being written) or not ours
            holder = {}
        object.__setattr__(self, "holder", holder if isinstance(holder, dict) else {})


# What link(2) answers on a filesystem that has no hard links.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}


class LocalLockFile:
    """A lock file linked into place once written; heartbeat is its mtime; removals hold a guard."""

    def __init__(self, path: str) -> None:
        self.path = path
        # What we wrote, with its unique token: freed inode numbers are soon reused, so they prove nothing.
        self._content: bytes | None = None

    def create(self, content: bytes) -> bool:
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        # Written whole under a name of its own, then linked to the lock's name: link(2) fails if
        # the name exists, so the lock appears with its content. Created empty and then written,
        # a run that came between would read no holder, and could not name it.
        aside = layout.temp_beside(self.path)
        fd = os.open(aside, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(aside, self.path)
            except FileExistsError:
                return False
            except OSError as exn:
                if exn.errno not in _NO_HARD_LINKS:
                    raise
                return self._create_in_place(content)
        finally:
            os.unlink(aside)
        self._content = content
        return True

    def _create_in_place(self, content: bytes) -> bool:
        """Where the filesystem has no hard links (exFAT, some FUSE and SMB mounts): created
        exclusively, then written; a run that reads it in between sees a lock being written."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        self._content = content
        return True

    def read(self) -> Seen | None:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                content = f.read()
        except FileNotFoundError:
            return None
        version = (st.st_dev, st.st_ino, st.st_mtime_ns, content)
        return Seen(content=content, age=time.time() - st.st_mtime, version=version)

    def adopt(self, seen: Seen) -> None:
        self._content = seen.content

    def remove_if(self, seen: Seen) -> bool:
        """Remove the lock if it is still exactly the version seen; two removers cannot both succeed."""
        return self._remove_when(
            lambda st, content: (st.st_dev, st.st_ino, st.st_mtime_ns, content) == seen.version
        )

    def refresh(self) -> bool:
        try:
            with open(self.path, "rb") as f:
                if f.read() != self._content:
                    return False
                os.utime(f.fileno())
        except FileNotFoundError:
            return False
        return True

    def release(self) -> bool:
        return self._remove_when(lambda _, content: content == self._content)

    def _remove_when(self, check: Any) -> bool:
        # Every removal (a release, a stale lock's reclaim) holds the guard from its check to its
        # unlink: no other removal can come between, and no run can create the lock while it
        # exists, so what is unlinked is what was checked. Moving the lock aside to look at it
        # instead would let a run create a lock in the meantime, and two runs would hold it.
        with self._guard():
            try:
                with open(self.path, "rb") as f:
                    matches = bool(check(os.fstat(f.fileno()), f.read()))
            except FileNotFoundError:
                return False
            if matches:
                os.unlink(self.path)
            return matches

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """An exclusive flock(2) on a file beside the lock; the kernel drops it if the process dies."""
        fd = os.open(layout.guard_path(self.path), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _generation_of(blob: Any) -> int:
    # Every precondition below needs it: without one a delete or rewrite would be unconditional.
    if blob.generation is None:
        raise RuntimeError(f"gs://{blob.bucket.name}/{blob.name}: the storage returned no generation")
    return int(blob.generation)


class GcsLockFile:
    """A lock object created with ifGenerationMatch=0; heartbeat is a rewrite of our own generation."""

    def __init__(self, path: str) -> None:
        from apache_beam.io.gcp import gcsio

        self.path = path
        bucket, self._name = gcsio.parse_gcs_path(path)
        # Beam's own client: the same credentials, retries and STORAGE_EMULATOR_HOST handling as its IO.
        self._bucket = gcsio.GcsIO().client.bucket(bucket)
        self._generation: int | None = None
        self._content = b""

    def create(self, content: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        blob = self._bucket.blob(self._name)
        try:
            blob.upload_from_string(content, content_type="application/json", if_generation_match=0)
        except PreconditionFailed:
            return False
        self._generation, self._content = _generation_of(blob), content
        return True

    def read(self) -> Seen | None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._bucket.get_blob(self._name)
        if blob is None:
            return None
        # Taken before the download, which resets the blob's properties from the response headers.
        generation, updated = blob.generation, blob.updated
        if generation is None or updated is None:
            raise RuntimeError(f"{self.path}: the storage returned no generation or update time for the lock")
        try:
            content = blob.download_as_bytes(if_generation_match=generation)
        except (NotFound, PreconditionFailed):  # changed since listed: look again
            return None
        age = (dt.datetime.now(dt.timezone.utc) - updated).total_seconds()
        return Seen(content=content, age=age, version=generation)

    def adopt(self, seen: Seen) -> None:
        self._generation, self._content = seen.version, seen.content  # type: ignore[assignment]

    def remove_if(self, seen: Seen) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self._bucket.blob(self._name).delete(if_generation_match=seen.version)
        except (NotFound, PreconditionFailed):
            return False
        return True

    def refresh(self) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self._bucket.blob(self._name)
        try:
            blob.upload_from_string(
                self._content, content_type="application/json", if_generation_match=self._generation
            )
        except (NotFound, PreconditionFailed):
            # A retried rewrite whose first try landed reads as changed: still ours if it holds our token.
            seen = self.read()
            if seen is None or seen.content != self._content:
                return False
            self.adopt(seen)
            return True
        self._generation = _generation_of(blob)
        return True

    def release(self) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self._bucket.blob(self._name).delete(if_generation_match=self._generation)
        except (NotFound, PreconditionFailed):
            return False
        return True
