"""What an output folder holds, and whether a run may publish there: read before a run and again
under its lock (publishing.py)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.files.storage import exists, is_local, list_files, read_bytes

__all__ = [
    "OutputState",
    "check_not_inside",
    "check_output_path",
    "check_state",
    "committed_versions",
    "read_state",
    "shard_versions",
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

    @property
    def referenced(self) -> frozenset[str]:
        """The version folders the published version and the one it replaced read shards from
        (an appended version lists the shards of those it grew from): never deleted."""
        out = shard_versions(self.published)
        if self.previous is not None:
            path = layout.join(self.output, self.previous, layout.METADATA)
            try:
                out |= shard_versions(json.loads(read_bytes(path)) if exists(path) else None)
            except ValueError:
                pass
        return out


def shard_versions(meta: dict[str, Any] | None) -> frozenset[str]:
    """The version folders whose shards the manifest `meta` lists (its own among them)."""
    if not meta:
        return frozenset()
    found = {str(s.get("file", "")).split("/", 1)[0] for s in meta.get("shards", [])}
    return frozenset(v for v in {*found, meta.get("version", "")} if layout.is_version(v))


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
        ours |= (
            set(layout.TOP_FILES)
            | shard_versions(published)
            | {
                (published or {}).get("version"),
                (published or {}).get("previous_version"),
            }
        )
    temporaries = tuple(t for t in tops if layout.is_temporary(t))
    foreign = tuple(t for t in tops if t not in ours and t not in temporaries)
    return OutputState(out, published, journal, foreign, damaged, temporaries)


def _describe(meta: dict[str, Any]) -> str:
    return f"version {meta['version']}, {meta.get('num_records')} records, created {meta.get('created')}"


def check_state(state: OutputState, *, overwrite: bool, if_changed: bool, append: bool = False) -> None:
    """Refuses to replace a published bundle, or to write among files that are not RecordForge's,
    unless asked to (`append` extends it); nothing is ever deleted that RecordForge did not write,
    even then."""
    if state.damaged and not (overwrite or if_changed):
        raise RecordForgeError(
            f"{state.output} holds a damaged RecordForge dataset: its metadata.json is missing or "
            "unreadable, though the run journal records a published version; pass --overwrite to "
            "rebuild it"
        )
    if state.published is not None and not (overwrite or if_changed or append):
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


def committed_versions(output: str, journal: list[str]) -> list[str]:
    """The versions of the run journal that were committed here, told without `metadata.json`
    (when it is lost): a version's own manifest is written before the commit point, so it takes
    `_SUCCESS` too, which only a commit writes, to say that one of them was published."""
    if not exists(layout.join(output, layout.SUCCESS)):
        return []
    return [v for v in journal if exists(layout.join(output, v, layout.METADATA))]
