"""A rerun resolved against the killed run it continues: which one (the same command, by
fingerprint) and which of its pieces it keeps (pieces.py)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Any

from recordforge.files import layout
from recordforge.files.storage import exists, read_bytes
from recordforge.output.finished import finished_manifest
from recordforge.output.pieces import Reuse, reusable
from recordforge.output.run_report import kept_files
from recordforge.output.state import OutputState
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.inputs import Inputs

__all__ = ["Resuming", "plan_resume"]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the name users see


@dataclass(frozen=True)
class Resuming:
    """What the run records of itself for a rerun (its journal entry's `resume`), and what it
    keeps of the killed run it continues (None: starts clean)."""

    key: str  # the command's fingerprint: patterns, format, schema, output-changing flags, base
    listing: dict[str, list[Any]]  # {path: [size, modified]} of the inputs as this run lists them
    records: bool  # whether its writers record their pieces (eligible: see plan_resume)
    reuse: Reuse | None = None

    def journal(self) -> dict[str, Any]:
        return {"key": self.key, "inputs": self.listing}


def _resume_key(config: ConvertConfig, inputs: Inputs, base: str | None) -> str:
    """Equal for reruns of the same command: the patterns (not the files' sizes and times, which
    are checked piece by piece), format, schema, output-changing flags and an append's base."""
    facts = {
        "sources": list(config.sources),
        "output": config.output.rstrip("/"),
        "format": inputs.fmt,
        "schema": inputs.plan.fingerprint,
        "settings": config.settings(),
        "base": base,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def plan_resume(
    config: ConvertConfig,
    inputs: Inputs,
    state: OutputState | None,
    *,
    base: str | None,
    eligible: bool,
    placed: dict[str, int] | None = None,
) -> Resuming:
    """The killed run of the same command that left the most recent version folder, and what of
    it may be kept; nothing with --resume=false, where the writers cannot resume (`eligible`: no
    tensorflow-transform, no sequences) or when no such run is found. `placed`: each writer's
    shard count where the writers are placed (--deterministic, --shuffle: placed_pieces.py)."""
    listing = {f.path: [f.size, f.modified] for f in inputs.files}
    key = _resume_key(config, inputs, base)
    plain = Resuming(key, listing, eligible)
    if state is None or not config.resume or not eligible:
        return plain
    keep = {state.version, state.previous, *state.referenced}
    for version in sorted(state.journal - keep, reverse=True):
        entry = layout.journal_entry(state.output, version)
        try:
            facts = json.loads(read_bytes(entry)).get("resume") if exists(entry) else None
        except ValueError:
            continue
        if not isinstance(facts, dict) or facts.get("key") != key:
            continue
        listed = facts.get("inputs") or {}
        # Killed once its version was whole (manifest written), it is committed as it is.
        finished = finished_manifest(state.output, version, listed, listing)
        if finished is not None:
            reuse = Reuse(version, {}, frozenset(), 0, finished=finished)
        else:
            reuse = reusable(state.output, version, listed, listing, placed=placed, shuffled=config.shuffle)
        if reuse.empty:
            return plain
        if finished is not None:
            _LOGGER.warning(
                "%s: the run that wrote %s was killed with its version finished: its shards are checked "
                "and it is published as it is (--resume=false starts clean)",
                state.output,
                version,
            )
            return Resuming(key, listing, eligible, reuse)
        _LOGGER.warning(
            "%s: resuming the run that wrote %s: keeping %d finished pieces (%d rows, %s) "
            "(--resume=false starts clean)",
            state.output,
            version,
            len(reuse.batches),
            reuse.rows,
            kept_files(reuse.describe()),
        )
        return Resuming(key, listing, eligible, reuse)
    return plain
