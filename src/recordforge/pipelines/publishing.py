"""The publishing protocol around a run: one writer at a time, a journal of what each run wrote,
cleanup of exactly that, and nothing existing touched before the new version is committed.

A run writes only into its own version folder (`layout.py`), which it records in the output's
journal before creating it. The bundle step commits by replacing `metadata.json` atomically
(`transforms/bundle.py`); until then readers see the last published version, whole. After the
commit, versions older than the one just replaced are deleted (the replaced one stays until the
next publish, so that a reader that started before the commit can finish). A run that fails or is
interrupted deletes its own version folder; one killed outright leaves its journal entry, and the
next run deletes that folder. Nothing else in the output folder is ever deleted.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from recordforge import crashpoints, layout
from recordforge.errors import RecordForgeError
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.lease import Lease, OutputLocked
from recordforge.storage import (
    delete_files,
    delete_tree,
    exists,
    is_local,
    list_files,
    read_bytes,
    write_atomically,
)
from recordforge.transforms.commit import committed_versions, finish_copies, is_temporary

__all__ = [
    "OutputState",
    "Publication",
    "check_not_inside",
    "check_output_path",
    "check_state",
    "finish_interrupted_commit",
    "read_state",
]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the name users see

_GLOB = set("*?[]")


def check_output_path(output: str) -> None:
    """The output is a path, never a pattern: glob characters are refused, so that nothing but
    that one folder can ever be matched."""
    bad = sorted(set(output) & _GLOB)
    if bad:
        raise RecordForgeError(
            f"--output {output!r} has glob character(s) {' '.join(bad)}: the output must be one "
            "folder, not a pattern"
        )
    if not output.strip("/ ") or output.rstrip("/") in (".", ".."):
        raise RecordForgeError(f"--output {output!r}: name a folder of its own for the dataset")


def _owned(output: str, path: str) -> bool:
    """True for a path that publishing `output` may write (so may replace or delete)."""
    out = output.rstrip("/")
    if is_local(out) and is_local(path):
        out, path = os.path.abspath(out), os.path.abspath(path)
    top = layout.top_entry(out, path)
    return top in layout.TOP_FILES or top == layout.STATE_DIR or layout.is_version(top)


def check_not_inside(output: str, paths: list[str], what: str) -> None:
    """Refuses inputs (or a schema) at a path a publish would replace or delete."""
    clash = [p for p in paths if _owned(output, p)]
    if clash:
        raise RecordForgeError(
            f"{what} {clash[0]} is where RecordForge writes its bundle in --output {output}; "
            "move it out of the output folder"
        )


@dataclass(frozen=True)
class OutputState:
    """What an output folder holds, read before a run and again under its lock."""

    output: str
    published: dict[str, Any] | None  # metadata.json of the published version (ours), or None
    journal: frozenset[str]  # versions a RecordForge run recorded here
    foreign: tuple[str, ...] = field(default=())  # top-level entries RecordForge did not write
    # metadata.json missing or unreadable though the journal records a version that was committed
    damaged: bool = False
    temporaries: tuple[str, ...] = field(default=())  # left beside top-level files by a dead run

    @property
    def version(self) -> str | None:
        return (self.published or {}).get("version")

    @property
    def previous(self) -> str | None:
        return (self.published or {}).get("previous_version")


def read_state(output: str, *, own: str | None = None) -> OutputState:
    """The state of `output`; `own`, the version of the run asking, counts as RecordForge's (a
    transform may have made its folder while the pipeline was built)."""
    out = output.rstrip("/")
    journal = frozenset(
        layout.relative(p, layout.journal_dir(out)) for p in list_files(layout.journal_dir(out))
    )
    published = None
    meta_path = layout.join(out, layout.METADATA)
    if exists(meta_path):
        try:
            meta = json.loads(read_bytes(meta_path))
        except ValueError:
            meta = None
        # Written by this protocol: names its version, which a run of ours recorded or made.
        if isinstance(meta, dict) and layout.is_version(str(meta.get("version", ""))):
            published = meta
    tops = sorted({layout.top_entry(out, p) for p in list_files(out)} - {""})
    ours = {layout.STATE_DIR, *journal, own}
    # The journal decides whose the top-level files are when metadata.json cannot.
    damaged = published is None and bool(committed_versions(out, sorted(journal)))
    if published is not None or damaged:
        ours |= set(layout.TOP_FILES) | {
            (published or {}).get("version"),
            (published or {}).get("previous_version"),
        }
    temporaries = tuple(t for t in tops if is_temporary(t))
    foreign = tuple(t for t in tops if t not in ours and t not in temporaries)
    return OutputState(out, published, journal, foreign, damaged, temporaries)


def _describe(meta: dict[str, Any]) -> str:
    return f"version {meta['version']}, {meta.get('num_records')} records, created {meta.get('created')}"


def check_state(state: OutputState, *, overwrite: bool, if_changed: bool) -> None:
    """Refuses to replace a published bundle, or to write among files that are not RecordForge's,
    unless asked to; nothing is ever deleted that RecordForge did not write, even then."""
    if state.damaged and not (overwrite or if_changed):
        raise RecordForgeError(
            f"{state.output} holds a damaged RecordForge dataset: its metadata.json is missing or "
            "unreadable, though the run journal records a published version; pass --overwrite to "
            "rebuild it"
        )
    if state.published is not None and not (overwrite or if_changed):
        raise RecordForgeError(
            f"{state.output} already holds a published dataset ({_describe(state.published)}); "
            "pass --overwrite to replace it (or --if_changed to rebuild only when inputs changed)"
        )
    clash = [t for t in state.foreign if t in layout.TOP_FILES]
    if clash:
        # Publishing writes (and a rebuild may delete) files of these names: never a user's.
        raise RecordForgeError(
            f"{state.output}/{clash[0]} was not written by RecordForge, which writes a file of "
            "that name there; move or rename it, or choose another output folder"
        )
    if state.foreign and state.published is None and not overwrite:
        shown = ", ".join(state.foreign[:5]) + (", ..." if len(state.foreign) > 5 else "")
        raise RecordForgeError(
            f"{state.output} is not empty and holds no RecordForge dataset ({shown}); choose an "
            "empty folder, or pass --overwrite to publish beside those files (they are never deleted)"
        )
    if state.foreign:
        _LOGGER.warning(
            "%s: %d entries RecordForge did not write are left as they are: %s",
            state.output,
            len(state.foreign),
            ", ".join(state.foreign[:5]),
        )


class Publication:
    """Held around a run: the output's lock, the run's journal entry, and cleanup.

    `__enter__` takes the lock (a second run fails at once naming the holder), then reads the
    output's state under it (`state`) and checks it, deletes what dead runs left (only folders
    the journal records), and records this run's version. The state is read again here, not
    taken from before the lock: another run may have published in between, and this run then
    replaces that version (the commit reads which version it replaces, `transforms/bundle.py`).
    `__exit__` deletes this run's version folder unless it was committed, then, after a commit,
    the versions older than the replaced one; `published` is then the committed metadata, read
    before the lock is released (after it, another run may already have replaced it).
    """

    def __init__(self, config: ConvertConfig, version: str, *, published_is_success: bool = False) -> None:
        """`version`: the folder the run writes. `published_is_success`: a failure after this
        run's commit is logged, not raised (the run is the whole pipeline, and it has published);
        a pipeline of the caller's own keeps its failures, whatever our bundle's fate."""
        self.output = config.output.rstrip("/")
        self.version = version
        self._config = config
        self._lease: Lease | None = None
        self._published_is_success = published_is_success
        self.state: OutputState | None = None  # the output under the lock, before the run
        self.published: dict[str, Any] | None = None  # this run's metadata.json, once committed

    def __enter__(self) -> Publication:
        owner = _owner(self.version, self._config)
        self._lease = Lease.acquire(layout.lock_path(self.output), owner)
        try:
            state = read_state(self.output, own=self.version)
            check_state(state, overwrite=self._config.overwrite, if_changed=self._config.if_changed)
            dead = "left by a run that did not finish"
            for name in state.temporaries:  # no other run writes while this one holds the lock
                delete_files([layout.join(self.output, name)])
            if state.version is not None:
                self._finish(state.version, "the run that published it")
            if not state.damaged:  # its versions stay until this run has published
                self._collect(state, keep={state.version, state.previous}, why=dead)
            write_atomically(layout.journal_entry(self.output, self.version), json.dumps(owner).encode())
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
                self._discard()
                return False
            # Committed: whatever failed after the commit point, this run has published.
            self._finish(self.version, "this run")
            self.published = state.published
            self._collect(state, keep={self.version, state.previous}, why="superseded")
            crashpoints.reached("cleaned")
        finally:
            self._lease.release()
        if exc is not None and isinstance(exc, Exception) and self._published_is_success:
            _LOGGER.warning(
                "%s: version %s is published; after its commit the run failed: %s",
                self.output,
                self.version,
                exc,
            )
            return True
        return False

    def _finish(self, version: str, whose: str) -> None:
        """Finishes the top-level copies of the published `version` where its commit did not."""
        _finish_copies(self.output, version, whose)

    def _discard(self) -> None:
        """Deletes what this unpublished run wrote. Rejected rows stay (until the next run) so
        that a run failed by too many of them can be looked into; the journal keeps the record."""
        root = layout.version_root(self.output, self.version)
        rejected = layout.join(root, layout.REJECTED_DIR) + "/"
        files = [f for f in list_files(root) if not f.startswith(rejected)]
        if len(files) < len(list_files(root)):
            if files:
                delete_files(files)
            _LOGGER.warning("%s: the rejected rows of the failed run are kept in %s", self.output, rejected)
            return
        n = delete_tree(root)
        _delete_entry(self.output, self.version)
        if n:
            _LOGGER.info("%s: removed the %d files of the unpublished run %s", self.output, n, self.version)

    def _collect(self, state: OutputState, *, keep: set[str | None], why: str) -> None:
        """Deletes the version folders the journal records, except those in `keep`."""
        for version in sorted(state.journal - keep):
            n = delete_tree(layout.version_root(self.output, version))
            _delete_entry(self.output, version)
            log = _LOGGER.warning if why.startswith("left") else _LOGGER.info
            log("%s: removed version %s (%d files), %s", self.output, version, n, why)


def _owner(version: str, config: ConvertConfig) -> dict[str, Any]:
    """The lock's record of the run holding it."""
    return {
        "run_id": version,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(config.command),
    }


def _finish_copies(output: str, version: str, whose: str) -> None:
    done = finish_copies(output, version)
    if done:
        _LOGGER.warning(
            "%s: finished the top-level files of version %s that %s left unwritten: %s",
            output,
            version,
            whose,
            ", ".join(done),
        )


def finish_interrupted_commit(state: OutputState, version: str, config: ConvertConfig) -> None:
    """A version committed by a run killed before it wrote `_SUCCESS` (past the commit point, its
    copies not written): finished under the lock at once, so that a run refused or up to date
    still leaves the published bundle whole. While another run holds the lock, that run does it."""
    if state.version is None or exists(layout.join(state.output, layout.SUCCESS)):
        return
    try:
        lease = Lease.acquire(layout.lock_path(state.output), _owner(version, config))
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
