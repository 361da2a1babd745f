"""Where an export is published: a folder beside DEST renamed into place; no stranger's file touched."""

from __future__ import annotations

import json
import logging
import os
import uuid

from recordforge.errors import UsageError
from recordforge.files.storage import (
    delete_files,
    delete_tree,
    is_local,
    join,
    list_files,
    read_bytes,
    rename,
    write_atomically,
)

__all__ = ["MANIFEST", "ours", "publish", "temporary_folder"]

_LOGGER = logging.getLogger(__name__)

# Written last into DEST: what the export holds; the files it names are RecordForge's to replace.
MANIFEST = "_export.json"


def _relative(dest: str, path: str) -> str:
    return path[len(dest.rstrip("/")) + 1 :]


def ours(dest: str, *, overwrite: bool) -> list[str]:
    """The files now in DEST, all of which an earlier export wrote; refuses an existing DEST
    without `overwrite`, and one holding any file that its export manifest does not name."""
    dest = dest.rstrip("/")
    if is_local(dest) and os.path.exists(dest) and not os.path.isdir(dest):
        raise UsageError(f"{dest} is a file, not a folder: choose another destination")
    files = list_files(dest)
    if not files and not (is_local(dest) and os.path.isdir(dest)):
        return []
    if not overwrite:
        raise UsageError(f"{dest} exists: pass --overwrite to replace an earlier export there")
    named = {MANIFEST}
    if join(dest, MANIFEST) in files:
        try:
            named |= {f["file"] for f in json.loads(read_bytes(join(dest, MANIFEST)))["files"]}
        except (ValueError, KeyError, TypeError) as exn:
            raise UsageError(
                f"{dest}/{MANIFEST} is not an export manifest ({exn}): remove DEST yourself"
            ) from exn
    else:
        named = set()
    foreign = [f for f in files if _relative(dest, f) not in named]
    if foreign:
        raise UsageError(
            f"{dest} holds {len(foreign)} file(s) that RecordForge did not write (e.g. "
            f"{_relative(dest, foreign[0])}): choose another destination; nothing was replaced"
        )
    return files


def temporary_folder(dest: str) -> str:
    """A fresh folder name beside DEST (hidden locally, so that a glob of its parent skips it)."""
    dest = dest.rstrip("/")
    token = uuid.uuid4().hex[:16]
    if is_local(dest):
        parent, name = os.path.split(os.path.abspath(dest))
        return os.path.join(parent, f".{name}.export-{token}")
    return f"{dest}.export-{token}"


def publish(tmp: str, dest: str, manifest: dict, *, overwrite: bool) -> None:
    """The parts in `tmp` become DEST, with the manifest written last. Locally the old DEST is
    renamed aside and `tmp` renamed into its place (readers see the old export or the new one);
    on an object store the parts are moved one by one, then the old files no part replaced go."""
    dest = dest.rstrip("/")
    old = ours(dest, overwrite=overwrite)  # again: another process may have written there since
    write_atomically(join(tmp, MANIFEST), json.dumps(manifest, indent=2).encode())
    if is_local(dest):
        aside = None
        if os.path.isdir(dest):
            aside = temporary_folder(dest) + ".old"
            os.rename(dest, aside)
        os.rename(tmp, dest)
        if aside is not None:
            moved = [os.path.join(aside, _relative(dest, f)) for f in old]
            delete_files(moved)
            _remove_empty(aside)
        return
    new = [f for f in list_files(tmp) if not f.endswith("/" + MANIFEST)]
    targets = [join(dest, _relative(tmp, f)) for f in new]
    rename(new, targets)
    rename([join(tmp, MANIFEST)], [join(dest, MANIFEST)])
    delete_files([f for f in old if f not in targets and not f.endswith("/" + MANIFEST)])
    delete_tree(tmp)


def _remove_empty(folder: str) -> None:
    """Removes `folder` and the empty folders in it; what someone else put there stays."""
    for root, _dirs, _files in os.walk(folder, topdown=False):
        try:
            os.rmdir(root)
        except OSError:
            _LOGGER.warning("%s: left in place, it holds files RecordForge did not write", root)
