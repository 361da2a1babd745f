"""The commit of a written version: metadata.json replaced, then _SUCCESS and the top-level copies."""

from __future__ import annotations

import json
import logging
import os
import re

from recordforge import crashpoints, layout
from recordforge.layout import METADATA, SUCCESS, TOP_COPIES
from recordforge.storage import delete_files, exists, is_local, read_bytes, stage_local, write_atomically

__all__ = ["commit", "committed_versions", "finish_copies", "is_temporary", "replaced_version"]

_LOGGER = logging.getLogger(__name__)

# write_atomically's and commit's temporary names beside a top-level file: `{name}.tmp-{32 hex}`.
_TEMPORARY = re.compile(r"^(?P<name>[^/]+)\.tmp-[0-9a-f]{32}$")


def is_temporary(name: str) -> bool:
    """True for a temporary file RecordForge writes beside one of its top-level files."""
    match = _TEMPORARY.match(name)
    return bool(match) and match.group("name") in layout.TOP_FILES


def committed_versions(output: str, journal: list[str]) -> list[str]:
    """The versions of the run journal that were committed here, told without `metadata.json`
    (when it is lost): a version's own manifest is written before the commit point, so it takes
    `_SUCCESS` too, which only a commit writes, to say that one of them was published."""
    if not exists(layout.join(output, SUCCESS)):
        return []
    return [v for v in journal if exists(layout.join(output, v, METADATA))]


def replaced_version(output: str, version: str) -> str | None:
    """The version a commit of `version` replaces, read at the commit: the run holds the output's
    lock, and another run may have published after this one was built. A retried commit finds
    its own version there already, and keeps the version that one recorded as replaced."""
    path = layout.join(output, METADATA)
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


def commit(output: str, manifest: bytes, files: dict[str, bytes]) -> None:
    """Publishes a version whose files are all in place. The top-level metadata.json is the
    commit point: replaced atomically, it moves readers from the old version to the new one at
    once. `_SUCCESS` follows (it stays through later rebuilds), then the convenience copies of
    the small files. On a local disk every one of them is first written in full beside its name,
    so that a full disk fails the run before the commit point, and only renames, which take no
    space, come after it. Repeating a commit (a retried step) writes the same files again; what
    a commit left undone after its commit point, `finish_copies` finishes."""
    wanted = {name: files[name] for name in TOP_COPIES if name in files}
    if not exists(layout.join(output, SUCCESS)):
        wanted[SUCCESS] = b""
    wanted[METADATA] = manifest
    staged: dict[str, str] = {}
    if is_local(output):
        try:
            for name, data in wanted.items():
                staged[name] = stage_local(layout.join(output, name), data)
        except BaseException:
            for tmp in staged.values():
                os.unlink(tmp)
            raise
    crashpoints.reached("staged")
    order = [METADATA, *(n for n in (SUCCESS, *TOP_COPIES) if n in wanted)]
    try:
        for name in order:
            path = layout.join(output, name)
            if name in staged:
                os.replace(staged[name], path)
                del staged[name]
            else:
                write_atomically(path, wanted[name])
            if name == METADATA:
                crashpoints.reached("committed")
    finally:
        for tmp in staged.values():  # after a failure: Publication finishes what is left
            os.unlink(tmp)
    for name in TOP_COPIES:
        path = layout.join(output, name)
        if name not in wanted and exists(path):  # the replaced version had it; this one has not
            delete_files([path])
    crashpoints.reached("copied")


def finish_copies(output: str, version: str) -> list[str]:
    """Makes `_SUCCESS` and the top-level copies those of the published `version`, as its commit
    would have; returns the names it had to write or delete (none when the commit finished)."""
    done = []
    for name in TOP_COPIES:
        top, own = layout.join(output, name), layout.join(output, version, name)
        if exists(own):
            data = read_bytes(own)
            if not exists(top) or read_bytes(top) != data:
                write_atomically(top, data)
                done.append(name)
        elif exists(top):
            delete_files([top])
            done.append(name)
    if not exists(layout.join(output, SUCCESS)):
        write_atomically(layout.join(output, SUCCESS), b"")
        done.append(SUCCESS)
    return done
