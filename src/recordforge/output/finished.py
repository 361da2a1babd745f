"""A killed run's finished version (its manifest written, not committed), committed by its rerun.

A run killed after its version folder was complete (`manifest_written`, `staged`) leaves no
record of pieces (the commit deletes `_pieces/` with the other working folders before it writes
the manifest): the manifest is the record. It was written after every shard and counted, so the
rerun of the same command (the journal's resume key: patterns, output, format, schema,
output-changing flags) commits it as it is when the inputs are listed exactly as that run listed
them and as its manifest lists them, its counts hold, and every shard of the version is there with
the size and sha256 the manifest gives, its record index too. Nothing is converted again.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from recordforge.files import layout
from recordforge.files.storage import exists, open_read, read_bytes, stat
from recordforge.output.publishing import check_inputs_unchanged, commit_version, replaced_version

__all__ = ["commit_finished", "finished_manifest", "finished_resumed"]


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open_read(path) as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _there(output: str, shard: dict[str, Any], *, hashed: bool) -> bool:
    """The shard is at its name with its recorded size (and, `hashed`, bytes), its index too."""
    path = layout.join(output, shard["file"])
    index = shard.get("index")
    if index is not None and not exists(layout.join(output, index)):
        return False
    if not exists(path) or stat(path).size != shard["bytes"]:
        return False
    return not hashed or _sha256(path) == shard["sha256"]


def _own(version: str, meta: dict[str, Any]) -> list[dict[str, Any]]:
    """The shards the version itself wrote (an append lists its base's too, published already)."""
    return [s for s in meta["shards"] if s["file"].startswith(version + "/")]


def finished_manifest(
    output: str, version: str, listed_then: dict[str, list[Any]], listed_now: dict[str, list[Any]]
) -> dict[str, Any] | None:
    """The killed run `version`'s own metadata.json where its rerun may commit it as it is (see
    the module), else None. `listed_then`, `listed_now`: {path: [size, modified]} of the inputs
    as that run (its journal entry) and this one list them. Hashes every shard of the version."""
    path = layout.join(layout.version_root(output, version), layout.METADATA)
    if not listed_now or listed_then != listed_now or not exists(path):
        return None
    try:
        meta = json.loads(read_bytes(path))
        if not isinstance(meta, dict) or meta.get("version") != version:
            return None
        listed = {s["path"]: [s["bytes"], s["modified"]] for s in meta["sources"]}
        counted = meta["rows_read"] == meta["rows_written"] + meta["rows_rejected"]
        counted = counted and sum(s["records"] for s in meta["shards"]) == meta["num_records"]
        own = _own(version, meta)
    except (KeyError, TypeError, ValueError):  # not a manifest RecordForge wrote whole
        return None
    if not counted or any(listed.get(p) != list(v) for p, v in listed_now.items()):
        return None
    if not all(_there(output, s, hashed=s in own) for s in meta["shards"]):
        return None
    return meta


def finished_resumed(version: str, meta: dict[str, Any]) -> dict[str, Any]:
    """metadata.json's `resumed` for a finished version committed as it is: every row kept."""
    appended = meta.get("appended")
    rows = appended["converted"]["rows_read"] if appended else meta["rows_read"]
    shards = len(_own(version, meta))
    return {"version": version, "pieces": 0, "rows": rows, "parts": 0, "shards": shards, "finished": True}


def commit_finished(output: str, version: str, meta: dict[str, Any]) -> None:
    """Commits the finished version `version` (its manifest `meta`, from `finished_manifest`),
    under the output's lock: its shards are looked at again (another run may have removed the
    folder since they were hashed), the inputs checked unchanged since listed, the replaced
    version read now, and `resumed` added to its manifest."""
    root = layout.version_root(output, version)
    if not all(_there(output, s, hashed=False) for s in meta["shards"]):
        raise RuntimeError(f"{output}: the shards of {version} changed since they were checked; run it again")
    if meta.get("source_format") != "images":
        check_inputs_unchanged((s["path"], s["bytes"], s["modified"]) for s in meta["sources"])
    resumed = finished_resumed(version, meta)
    manifest = {**meta, "previous_version": replaced_version(output, version)}
    manifest["resumed"] = {**resumed, "rows_converted": 0}
    files = {n: read_bytes(layout.join(root, n)) for n in layout.TOP_COPIES if exists(layout.join(root, n))}
    commit_version(output, version, files, json.dumps(manifest, indent=2).encode())
