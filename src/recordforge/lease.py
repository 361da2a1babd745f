"""An exclusive, heartbeated lock on an output folder: one writer at a time, on local disks and on gs://."""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from recordforge import layout
from recordforge.errors import RecordForgeError
from recordforge.storage import is_local

__all__ = ["Lease", "OutputLocked", "heartbeat_threads", "quiet_heartbeats"]

_LOGGER = logging.getLogger(__name__)

# Rounds of create / read / judge / reclaim: a round is lost only when another run moved in between.
_ATTEMPTS = 5
# Key of the per-acquisition token added to the owner record: tells our lock from an identical-looking one.
_TOKEN = "lease"


class OutputLocked(RecordForgeError):
    """Another run holds the output's lock and does not look dead: the message names it."""

    def __init__(self, path: str, holder: dict[str, Any] | None) -> None:
        self.path = path
        self.holder = dict(holder or {})
        super().__init__(
            f"{_guarded_folder(path)} is being written by {_describe(self.holder)}; "
            f"wait for it, or if that run is dead remove {path}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (OutputLocked, (self.path, self.holder))


def _guarded_folder(path: str) -> str:
    """The output folder a lock guards: its folder, or that folder's parent for a control folder ("_x")."""
    join = os.path if is_local(path) else posixpath
    folder = join.dirname(path)
    return join.dirname(folder) if join.basename(folder).startswith("_") else folder


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "another run (its lock is being written or cannot be read)"
    fields = {key: holder.get(key, "unknown") for key in ("run_id", "host", "pid", "started")}
    return "run {run_id} (host {host}, pid {pid}, since {started})".format(**fields)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


@dataclass(frozen=True)
class _Seen:
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


def _stale_reason(seen: _Seen, stale_after: float) -> str | None:
    host, pid = seen.holder.get("host"), seen.holder.get("pid")
    if host == socket.gethostname() and isinstance(pid, int) and pid > 0 and not _pid_alive(pid):
        return f"pid {pid} is not running on this host"
    if seen.age > stale_after:
        return f"its last heartbeat was {seen.age:.1f} s ago (stale after {stale_after:g} s)"
    return None


# What link(2) answers on a filesystem that has no hard links.
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV}


class _LocalLock:
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

    def read(self) -> _Seen | None:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                content = f.read()
        except FileNotFoundError:
            return None
        version = (st.st_dev, st.st_ino, st.st_mtime_ns, content)
        return _Seen(content=content, age=time.time() - st.st_mtime, version=version)

    def adopt(self, seen: _Seen) -> None:
        self._content = seen.content

    def remove_if(self, seen: _Seen) -> bool:
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


class _GcsLock:
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

    def read(self) -> _Seen | None:
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
        return _Seen(content=content, age=age, version=generation)

    def adopt(self, seen: _Seen) -> None:
        self._generation, self._content = seen.version, seen.content  # type: ignore[assignment]

    def remove_if(self, seen: _Seen) -> bool:
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


_LIVE: weakref.WeakSet[Lease] = weakref.WeakSet()


def heartbeat_threads() -> set[threading.Thread]:
    """The heartbeat threads of the leases this process holds."""
    return {lease._thread for lease in list(_LIVE)}


@contextmanager
def quiet_heartbeats() -> Iterator[None]:
    """No heartbeat is mid-refresh inside this block: every lease's mutex is held. A heartbeat
    thread outside a refresh only waits on an Event, holding no lock another thread could need;
    so the process may fork here (the local runner's fork server) with heartbeats alive."""
    with ExitStack() as stack:
        for lease in sorted(_LIVE, key=id):
            stack.enter_context(lease._mutex)
        yield


class Lease:
    """One writer at a time on an output: an exclusively created lock file, kept fresh by a heartbeat.

    ``acquire`` creates ``path`` whole (locally by link(2), on gs:// with ``ifGenerationMatch=0``), holding
    the JSON ``owner`` record plus a ``"lease"`` token, or raises ``OutputLocked`` at once, naming the holder,
    when another run holds a lock that is not stale. A lock is stale when its holder's ``host`` is this
    host and its ``pid`` is not running, or when its last heartbeat (local mtime, GCS ``updated``) is older
    than ``stale_after`` seconds; a stale lock is removed, only if it is still the version judged, and
    created again, with a WARNING naming the dead holder. The pid rule assumes host names are unique among
    machines and containers sharing the output; the heartbeat rule assumes clocks within a few seconds of
    the storage's. A daemon thread refreshes the heartbeat every ``heartbeat`` seconds (default
    ``stale_after / 4``) and stops, logging an ERROR, if the lock is no longer ours. ``release`` (also on
    leaving a ``with`` block) is idempotent and removes the lock only if it is still ours.
    """

    def __init__(self, lock: _LocalLock | _GcsLock, owner: dict[str, Any], heartbeat: float) -> None:
        self.path = lock.path
        self.owner = owner
        self._lock = lock
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._released = False
        self._thread = threading.Thread(
            target=self._beat, args=(heartbeat,), name=f"lease-heartbeat {lock.path}", daemon=True
        )
        _LIVE.add(self)

    @classmethod
    def acquire(
        cls,
        path: str,
        owner: dict[str, object],
        *,
        stale_after: float = 600.0,
        heartbeat: float | None = None,
    ) -> Lease:
        if not stale_after > 0:
            raise ValueError(f"stale_after must be positive, got {stale_after!r}")
        every = stale_after / 4 if heartbeat is None else heartbeat
        if not 0 < every < stale_after:
            raise ValueError(
                f"heartbeat must be positive and below stale_after={stale_after:g}, got {every!r}"
            )
        token = uuid.uuid4().hex
        record = {**owner, _TOKEN: token}
        try:
            content = json.dumps(record, sort_keys=True).encode()
        except TypeError as exn:
            raise ValueError(f"the lock's owner record must be JSON-serialisable: {exn}") from exn
        lock: _LocalLock | _GcsLock = _GcsLock(path) if path.startswith("gs://") else _LocalLock(path)
        seen: _Seen | None = None
        for _ in range(_ATTEMPTS):
            if lock.create(content):
                break
            seen = lock.read()
            if seen is None:  # released or being replaced since our create: try again
                continue
            if seen.holder.get(_TOKEN) == token:  # our create landed, but its reply was lost
                lock.adopt(seen)
                break
            reason = _stale_reason(seen, stale_after)
            if reason is None:
                raise OutputLocked(path, seen.holder)
            if lock.remove_if(seen):
                _LOGGER.warning("Reclaimed the stale lock %s of %s: %s", path, _describe(seen.holder), reason)
        else:
            raise OutputLocked(path, seen.holder if seen else None)
        lease = cls(lock, record, every)
        lease._thread.start()
        _LOGGER.info("Locked %s for run %s", path, owner.get("run_id"))
        return lease

    def release(self) -> None:
        with self._mutex:  # waits for a heartbeat in flight, so the generation released is the last one
            if self._released:
                return
            self._released = True
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        if self._lock.release():
            _LOGGER.info("Released %s", self.path)
        else:
            _LOGGER.warning("Did not remove %s: it is no longer this run's lock", self.path)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            with self._mutex:
                if self._released:
                    return
                try:
                    ours = self._lock.refresh()
                except Exception as exn:  # a transient storage error: the next beat may succeed
                    _LOGGER.warning("Heartbeat of %s failed: %s", self.path, exn)
                    continue
                if not ours:
                    _LOGGER.error("Lost the lock %s: another run took it over; heartbeat stopped", self.path)
                    return
