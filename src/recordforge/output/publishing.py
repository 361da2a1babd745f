"""The publishing protocol: the output's lock and journal, shard publish, commit and cleanup."""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from recordforge import interrupts
from recordforge.errors import Interrupted, SourceError
from recordforge.files import layout
from recordforge.files.storage import (
    delete_files,
    delete_tree,
    exists,
    is_local,
    list_files,
    read_bytes,
    rename,
    sizes,
    stage_local,
    stat,
    write_atomically,
)
from recordforge.output import crashpoints
from recordforge.output.lease import Lease, OutputLocked
from recordforge.output.state import OutputState, check_state, read_state
from recordforge.tracing.spans import flush as flush_spans
from recordforge.tracing.spans import span

__all__ = [
    "Publication",
    "Target",
    "check_inputs_unchanged",
    "commit_version",
    "drop_empty_rejected",
    "finish_interrupted_commit",
    "first_missing",
    "publish_shards",
    "replaced_version",
    "undo_dry_run",
]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the name users see


@dataclass(frozen=True)
class Target:
    """The output a run publishes to, and what its flags let it do to what the output holds."""

    output: str
    command: tuple[str, ...] = ()  # as given, for the lock's record of who holds it
    overwrite: bool = False
    if_changed: bool = False
    append: bool = False


class Publication:
    """Held around a run: the output's lock, the run's journal entry, and cleanup.

    `__enter__` takes the lock (a second run fails at once naming the holder), then reads the
    output's state under it (`state`) and checks it, deletes what dead runs left (only folders
    the journal records), and records this run's version. The state is read again here, not
    taken from before the lock: another run may have published in between, and this run then
    replaces that version (the commit reads which version it replaces: `replaced_version`).
    `__exit__` deletes this run's version folder unless it was committed, then, after a commit,
    the versions older than the replaced one; `published` is then the committed metadata, read
    before the lock is released (after it, another run may already have replaced it).
    """

    def __init__(
        self,
        target: Target,
        version: str,
        *,
        published_is_success: bool = False,
        resume: dict[str, Any] | None = None,
        kept: frozenset[str] | None = None,
    ) -> None:
        """`version`: the folder the run writes. `published_is_success`: a failure or an
        interrupt after this run's commit is logged, not raised (the run is the whole pipeline,
        and it has published);
        a pipeline of the caller's own keeps its failures, whatever our bundle's fate.
        `resume`: recorded in the journal entry, for a rerun to find this run (pieces.py).
        `kept`: the run continues a killed one in its `version` folder, keeping these files
        there (and its record of pieces); everything else that run wrote there is deleted."""
        self.output = target.output.rstrip("/")
        self.version = version
        self._resume = resume
        self._kept = kept
        self._target = target
        self._lease: Lease | None = None
        self._published_is_success = published_is_success
        self.state: OutputState | None = None  # the output under the lock, before the run
        self.published: dict[str, Any] | None = None  # this run's metadata.json, once committed

    def __enter__(self) -> Publication:
        crashpoints.arm()
        owner = _owner(self.version, self._target)
        self._lease = Lease.acquire(layout.lock_path(self.output), owner)
        try:
            state = read_state(self.output, own=self.version)
            check_state(
                state,
                overwrite=self._target.overwrite,
                if_changed=self._target.if_changed,
                append=self._target.append,
            )
            dead = "left by a run that did not finish"
            for name in state.temporaries:  # no other run writes while this one holds the lock
                delete_files([layout.join(self.output, name)])
            if state.version is not None:
                self._finish(state.version, "the run that published it")
            if not state.damaged:  # its versions stay until this run has published
                keep = {state.version, state.previous, *state.referenced, self.version}
                self._collect(state, keep=keep, why=dead)
            if self._kept is not None:
                self._adopt(self._kept)
            entry = {**owner, **({"resume": self._resume} if self._resume is not None else {})}
            write_atomically(layout.journal_entry(self.output, self.version), json.dumps(entry).encode())
            self.state = state
            crashpoints.reached("locked")
        except BaseException:
            self._lease.release()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        assert self._lease is not None
        try:
            state = read_state(self.output)
            if state.version != self.version:
                kept = self._discard(interrupted=_interrupted(exc))
                if kept and isinstance(exc, BaseException):
                    # The CLI's one line about the interrupt says it (cli._interrupted).
                    exc.add_note(
                        f"the pieces it finished are kept in {self.version}: the same command "
                        "resumes them (--resume=false starts clean)"
                    )
                return False
            # Committed: whatever failed after the commit point, this run has published.
            self._finish(self.version, "this run")
            self.published = state.published
            self._collect(state, keep={self.version, state.previous, *state.referenced}, why="superseded")
            crashpoints.reached("cleaned")
        finally:
            self._lease.release()
        if exc is None and interrupts.received():
            # Recorded after the last safe point (as the runner closed its workers): the run
            # finished and published all the same.
            _LOGGER.warning(
                "%s: version %s is published; the run was interrupted after its commit",
                self.output,
                self.version,
            )
            return False
        if exc is None or not self._published_is_success:
            return False
        # An interrupt here left only the runner's teardown (closing its workers): the run is
        # done, and its exit and closing line say so, not that nothing was published.
        if _interrupted(exc):
            what = "the run was interrupted after its commit"
        elif isinstance(exc, Exception):
            what = f"after its commit the run failed: {exc}"
        else:
            return False
        _LOGGER.warning("%s: version %s is published; %s", self.output, self.version, what)
        return True

    def _finish(self, version: str, whose: str) -> None:
        """Finishes the top-level copies of the published `version` where its commit did not."""
        _finish_copies(self.output, version, whose)

    def _adopt(self, kept: frozenset[str]) -> None:
        """Continuing a killed run in its version folder: what it wrote there and this run does
        not keep (unfinished parts, shards it published, rejected rows) is deleted first."""
        root = layout.version_root(self.output, self.version)
        pieces = layout.pieces_dir(root) + "/"
        stale = [f for f in list_files(root) if f not in kept and not f.startswith(pieces)]
        if stale:
            delete_files(stale)

    def _discard(self, *, interrupted: bool = False) -> bool:
        """Deletes what this unpublished run wrote. Rejected rows stay (until the next run) so
        that a run failed by too many of them can be looked into; the journal keeps the record.
        An interrupted run (Ctrl-C, SIGTERM) keeps its folder when it recorded finished pieces:
        rerunning the command resumes it (a failed one would fail again). True: it was kept."""
        root = layout.version_root(self.output, self.version)
        if interrupted and list_files(layout.pieces_dir(root)):
            _LOGGER.info("%s: interrupted; its finished pieces are kept in %s", self.output, self.version)
            return True
        rejected = layout.join(root, layout.REJECTED_DIR) + "/"
        files = [f for f in list_files(root) if not f.startswith(rejected)]
        if len(files) < len(list_files(root)):
            if files:
                delete_files(files)
            _LOGGER.warning("%s: the rejected rows of the failed run are kept in %s", self.output, rejected)
            return False
        n = delete_tree(root)
        _delete_entry(self.output, self.version)
        if n:
            _LOGGER.info("%s: removed the %d files of the unpublished run %s", self.output, n, self.version)
        return False

    def _collect(self, state: OutputState, *, keep: set[str | None], why: str) -> None:
        """Deletes the version folders the journal records, except those in `keep`."""
        for version in sorted(state.journal - keep):
            n = delete_tree(layout.version_root(self.output, version))
            _delete_entry(self.output, version)
            log = _LOGGER.warning if why.startswith("left") else _LOGGER.info
            log("%s: removed version %s (%d files), %s", self.output, version, n, why)


def _owner(version: str, target: Target) -> dict[str, Any]:
    """The lock's record of the run holding it."""
    return {
        "run_id": version,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(target.command),
    }


def _finish_copies(output: str, version: str, whose: str) -> None:
    """Makes `_SUCCESS` and the top-level copies those of the published `version`, as its commit
    would have, and says which it had to write or delete (none when the commit finished)."""
    done = []
    for name in layout.TOP_COPIES:
        top, own = layout.join(output, name), layout.join(output, version, name)
        if exists(own):
            data = read_bytes(own)
            if not exists(top) or read_bytes(top) != data:
                write_atomically(top, data)
                done.append(name)
        elif exists(top):
            delete_files([top])
            done.append(name)
    if not exists(layout.join(output, layout.SUCCESS)):
        write_atomically(layout.join(output, layout.SUCCESS), b"")
        done.append(layout.SUCCESS)
    if done:
        _LOGGER.warning(
            "%s: finished the top-level files of version %s that %s left unwritten: %s",
            output,
            version,
            whose,
            ", ".join(done),
        )


def finish_interrupted_commit(state: OutputState, version: str, target: Target) -> None:
    """A version committed by a run killed before it wrote `_SUCCESS` (past the commit point, its
    copies not written): finished under the lock at once, so that a run refused or up to date
    still leaves the published bundle whole. While another run holds the lock, that run does it."""
    if state.version is None or exists(layout.join(state.output, layout.SUCCESS)):
        return
    try:
        lease = Lease.acquire(layout.lock_path(state.output), _owner(version, target))
    except OutputLocked:
        return
    try:
        now = read_state(state.output)
        for name in now.temporaries:  # what it staged; no other run writes while the lock is held
            delete_files([layout.join(now.output, name)])
        if now.version is not None:
            _finish_copies(now.output, now.version, "the run that published it")
    finally:
        lease.release()


def _delete_entry(output: str, version: str) -> None:
    entry = layout.journal_entry(output, version)
    delete_files([entry])


def replaced_version(output: str, version: str) -> str | None:
    """The version a commit of `version` replaces, read at the commit: the run holds the output's
    lock, and another run may have published after this one was built. A retried commit finds
    its own version there already, and keeps the version that one recorded as replaced."""
    path = layout.join(output, layout.METADATA)
    if not exists(path):
        return None
    try:
        meta = json.loads(read_bytes(path))
    except ValueError:  # not readable as RecordForge's: it replaces nothing of ours
        return None
    found = meta.get("version") if isinstance(meta, dict) else None
    if not isinstance(found, str) or not layout.is_version(found):
        return None
    if found == version:
        previous = meta.get("previous_version")
        return previous if isinstance(previous, str) and layout.is_version(previous) else None
    return found


def publish_shards(moves: list[tuple[str, str]], temp_dir: str) -> None:
    """Moves finished temporary shards to their final names, `(temporary, final)` pairs, then
    deletes the writer's temporary folder with whatever else is in it (files of attempts the
    runner discarded, spills). Idempotent: a shard already moved (a retried step) is not moved
    again. A final name missing afterwards is an error: a shard list never disagrees with the files."""
    interrupts.check()  # a safe point before the shards move
    pending = [(tmp, final) for tmp, final in moves if exists(tmp)]
    if pending:
        rename([tmp for tmp, _ in pending], [final for _, final in pending])
    missing = [final for _, final in moves if not exists(final)]
    if missing:
        raise RuntimeError(f"{len(missing)} shard(s) lost before publishing, first {missing[0]}")
    delete_tree(temp_dir)
    crashpoints.reached("shards_published")


def check_inputs_unchanged(sources: Iterable[tuple[str, int | None, float]]) -> None:
    """Inputs are a snapshot: a file, `(path, size, modified)` as listed, whose size or
    modification time now differs was changed (or cut short) while the run read it, and nothing
    is published. A source listed without a size (a folder of images) is not looked up again."""
    for path, size, modified in sources:
        if size is None:
            continue
        try:
            now = stat(path)
        except Exception as exn:  # noqa: BLE001 - gone, or no longer one file
            raise SourceError(f"{path}: the input disappeared while it was being read ({exn})") from exn
        if now.size != size or abs(now.modified - modified) > 1e-6:
            raise SourceError(
                f"{path}: the input changed while it was being read (size {size} -> {now.size} bytes, "
                f"modified {modified} -> {now.modified}); nothing was published"
            )


def drop_empty_rejected(root: str, files: list[str]) -> None:
    """The rejected-rows writer leaves an empty file when nothing was rejected: removes it, and the
    folder when no row was rejected. Only the writer's finished files are looked at."""
    if not files:
        return
    size = sizes(files)
    empty = [f for f in files if size.get(f) == 0]
    if empty:
        delete_files(empty)
    if all(size.get(f, 0) == 0 for f in files):
        delete_tree(layout.join(root, layout.REJECTED_DIR))


def commit_version(
    output: str, version: str, files: dict[str, bytes], manifest: bytes, *, temp_dirs: Iterable[str] = ()
) -> None:
    """Publishes `version`, its shards in place: deletes the working folders `temp_dirs`, writes
    the version's small `files` then its metadata.json (`manifest`), then commits it (`_commit`)."""
    with span("commit"):
        _commit_version(output, version, files, manifest, temp_dirs)
    flush_spans()  # the last step a worker runs: nothing flushes after it


def _commit_version(
    output: str, version: str, files: dict[str, bytes], manifest: bytes, temp_dirs: Iterable[str]
) -> None:
    root = layout.version_root(output, version)
    interrupts.check()  # safe points on the way to the commit; none after its first rename
    for temp in temp_dirs:
        delete_tree(temp)
    for name, data in {**files, layout.METADATA: manifest}.items():
        write_atomically(layout.join(root, name), data)
    crashpoints.reached("manifest_written")
    interrupts.check()
    _commit(output, manifest, files)


def _commit(output: str, manifest: bytes, files: dict[str, bytes]) -> None:
    """The top-level metadata.json is the commit point: replaced atomically, it moves readers
    from the old version to the new one at once. `_SUCCESS` follows (it stays through later
    rebuilds), then the convenience copies of the small files. On a local disk every one of them
    is first written in full beside its name, so that a full disk fails the run before the commit
    point, and only renames, which take no space, come after it. Repeating a commit (a retried
    step) writes the same files again; what a commit left undone after its commit point, the
    next holder of the lock finishes (`_finish_copies`)."""
    wanted = {name: files[name] for name in layout.TOP_COPIES if name in files}
    if not exists(layout.join(output, layout.SUCCESS)):
        wanted[layout.SUCCESS] = b""
    wanted[layout.METADATA] = manifest
    staged: dict[str, str] = {}
    if is_local(output):
        try:
            for name, data in wanted.items():
                staged[name] = stage_local(layout.join(output, name), data)
        except BaseException:
            delete_files(list(staged.values()))
            raise
    crashpoints.reached("staged")
    order = [layout.METADATA, *(n for n in (layout.SUCCESS, *layout.TOP_COPIES) if n in wanted)]
    try:
        # The last safe point: past it the commit is one rename, and what follows it a rerun
        # finishes (`_finish_copies`); an interrupt here deletes the staged files (below).
        interrupts.check()
        for name in order:
            path = layout.join(output, name)
            if name in staged:
                rename([staged[name]], [path])
                del staged[name]
            else:
                write_atomically(path, wanted[name])
            if name == layout.METADATA:
                crashpoints.reached("committed")
    finally:
        delete_files(list(staged.values()))  # after a failure: the next lock holder finishes
    for name in layout.TOP_COPIES:
        path = layout.join(output, name)
        if name not in wanted and exists(path):  # the replaced version had it; this one has not
            delete_files([path])
    crashpoints.reached("copied")


def first_missing(folder: str) -> str | None:
    """The outermost folder of the local `folder`'s path that does not exist yet (None if it
    exists): what a dry run may remove again (`undo_dry_run`)."""
    missing = None
    path = os.path.abspath(folder)
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing


def undo_dry_run(output: str, version: str, made: str | None) -> None:
    """Deletes a dry run's own version folder (a fresh, unique name) in the local `output`, then
    the folders the dry run made on the way to `output` (`made`, from `first_missing`), each only
    while empty."""
    root = layout.version_root(output, version)
    if os.path.isdir(root):
        delete_tree(root)
    if made is None:
        return
    path = os.path.abspath(output)
    while os.path.isdir(path) and not os.listdir(path):
        os.rmdir(path)
        if path == made:
            return
        path = os.path.dirname(path)


def _interrupted(exc: BaseException | None) -> bool:
    """A signal stopped the run: the exception is the interrupt, or a runner's wrapping of it
    (a step that caught it, or failed because the signal stopped a worker), or any failure once
    the command's handler has recorded a signal (Beam may wrap the interrupt into a plain
    RuntimeError carrying only its text)."""
    if exc is not None and interrupts.received():
        return True
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt | Interrupted):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False
