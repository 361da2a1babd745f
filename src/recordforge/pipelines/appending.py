"""--append resolved: the published version appended to, the input files it did not read, and the
refusals that keep an appended dataset equal to a full build's records."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.delta_inputs import check_delta_append
from recordforge.pipelines.inputs import Inputs
from recordforge.schemas import Plan, load_schema
from recordforge.transforms.source_types import FileInfo

__all__ = ["Appending", "plan_append"]


@dataclasses.dataclass(frozen=True)
class Appending:
    """An append: the published manifest it extends (its shards are listed again, never moved)
    and the files matched now that it did not read, the only ones converted."""

    base: dict[str, Any]
    new_files: tuple[FileInfo, ...]


def plan_append(config: ConvertConfig, inputs: Inputs, published: dict[str, Any] | None) -> Appending | None:
    """The append `config` asks for over the `published` manifest; None when nothing is published
    (the first build of a daily job is a plain one). Refuses, in one line naming what differs,
    whatever would make the appended dataset differ from a full build of the same files."""
    if published is None:
        return None
    output = config.output.rstrip("/")
    redo = "rebuild with --overwrite"
    if inputs.folder is not None:
        raise RecordForgeError(f"--append: a folder of images is one input, it cannot grow by files; {redo}")
    if inputs.plan.schema.has_transforms or config.preprocessing_fn:
        raise RecordForgeError(
            "--append does not combine with a `transform:` or --preprocessing_fn: their analyzers "
            f"are fitted over all the data, so every published shard would change; {redo}"
        )
    _check_settings(config, published, redo)
    if inputs.delta is not None:  # the table's log says what changed, before its files do
        check_delta_append(inputs.delta, published, redo)
    _check_schema(output, inputs.plan, published, redo)
    now = {f.path: f for f in inputs.files}
    for source in published.get("sources", []):
        path = source["path"]
        current = now.get(path)
        if current is None:
            raise RecordForgeError(
                f"--append: {path} was read by the published version and is no longer matched by "
                f"--source; {redo}"
            )
        if current.size != source["bytes"] or abs(current.modified - source["modified"]) > 1e-6:
            raise RecordForgeError(
                f"--append: {path} changed since the published version read it (size "
                f"{source['bytes']} -> {current.size} bytes, modified {source['modified']} -> "
                f"{current.modified}); {redo}"
            )
    read = {s["path"] for s in published.get("sources", [])}
    return Appending(published, tuple(f for f in inputs.files if f.path not in read))


def _check_settings(config: ConvertConfig, published: dict[str, Any], redo: str) -> None:
    """The flags that change the output must be those the published version was built with."""
    before = published.get("settings")
    if not isinstance(before, dict):
        raise RecordForgeError(
            f"--append: the published version {published.get('version')} does not record its "
            f"settings (built by an older RecordForge); {redo} once"
        )
    now = json.loads(json.dumps(config.settings()))  # tuples as lists, as the manifest has them
    differ = sorted(k for k in {*before, *now} if before.get(k) != now.get(k))
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} published, {now.get(k)!r} now" for k in differ)
        raise RecordForgeError(f"--append: settings differ from the published version's ({shown}); {redo}")


def _check_schema(output: str, plan: Plan, published: dict[str, Any], redo: str) -> None:
    """The schema must be the published one: the difference is named feature by feature."""
    if published.get("schema_fingerprint") == plan.fingerprint:
        return
    before = load_schema(layout.join(output, published["version"], layout.SCHEMA_YAML)).to_dict()["features"]
    after = plan.schema.to_dict()["features"]
    old, new = {f["name"]: f for f in before}, {f["name"]: f for f in after}
    differences = [f"feature {n!r} removed" for n in old if n not in new]
    differences += [f"feature {n!r} added" for n in new if n not in old]
    for name in (n for n in new if n in old and new[n] != old[n]):
        keys = sorted(k for k in {*old[name], *new[name]} if old[name].get(k) != new[name].get(k))
        differences += [f"feature {name!r} {k}: {old[name].get(k)!r} -> {new[name].get(k)!r}" for k in keys]
    if not differences and [f["name"] for f in before] != [f["name"] for f in after]:
        differences = ["the features' order"]
    what = "; ".join(differences) or "its fingerprint"
    raise RecordForgeError(f"--append: the schema differs from the published version's ({what}); {redo}")
