"""An exclusive, heartbeated lock on an output folder: one writer at a time, on local disks and on gs://."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import socket
import threading
import uuid
import weakref
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from recordforge.errors import RecordForgeError
from recordforge.files.storage import is_local
from recordforge.output.lock_files import GcsLockFile, LocalLockFile, Seen

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


def _stale_reason(seen: Seen, stale_after: float) -> str | None:
    host, pid = seen.holder.get("host"), seen.holder.get("pid")
    if host == socket.gethostname() and isinstance(pid, int) and pid > 0 and not _pid_alive(pid):
        return f"pid {pid} is not running on this host"
    if seen.age > stale_after:
        return f"its last heartbeat was {seen.age:.1f} s ago (stale after {stale_after:g} s)"
    return None


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

    def __init__(self, lock: LocalLockFile | GcsLockFile, owner: dict[str, Any], heartbeat: float) -> None:
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
        lock: LocalLockFile | GcsLockFile = (
            GcsLockFile(path) if path.startswith("gs://") else LocalLockFile(path)
        )
        seen: Seen | None = None
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
