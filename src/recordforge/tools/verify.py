"""verify: every shard of a bundle exists, has its size and checksum, every record's CRCs hold,
every record parses with the feature spec, the counts match the manifest and its invariant, and
nothing lies in the output that the manifest does not account for."""

from __future__ import annotations

import json
import math
import posixpath
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from recordforge import layout
from recordforge.storage import exists, list_files, open_read, read_bytes
from recordforge.tfrecord import FileDigest
from recordforge.tools.progress import Progress
from recordforge.tools.records import CorruptRecord, parse_example, read_records

__all__ = ["verify"]

# Folders of a version that tensorflow-transform writes (their contents are its own).
_TRANSFORM_DIRS = (layout.TRANSFORM_FN, layout.TRANSFORMED_METADATA, layout.RAW_METADATA)
_KINDS = {"int64": "int64", "float32": "float", "string": "bytes"}


def _spec_problems(record: dict[str, tuple[str, list]], spec: dict[str, dict]) -> list[str]:
    out = []
    for name, entry in spec.items():
        if entry["kind"] == "RaggedFeature":
            values = record.get(entry["value_key"], ("", []))[1]
            lengths = record.get(entry["partitions"][0]["row_lengths"], ("", []))[1]
            if sum(lengths) != len(values):
                out.append(
                    f"ragged feature {name!r}: row lengths sum to {sum(lengths)}, {len(values)} values"
                )
            continue
        kind, values = record.get(name, (None, []))
        want = _KINDS[entry["dtype"]]
        if kind is not None and kind not in (want, "none"):
            out.append(f"feature {name!r} is {kind}, the spec says {entry['dtype']}")
        if entry["kind"] == "FixedLenFeature":
            n = math.prod(entry["shape"])
            if kind is None:
                out.append(f"feature {name!r} is missing (FixedLenFeature)")
            elif len(values) != n:
                out.append(
                    f"feature {name!r} has {len(values)} values, the spec's shape {entry['shape']} needs {n}"
                )
    return out


def _check_shard(args: tuple[str, dict[str, Any], str, dict[str, dict]]) -> tuple[int, list[str]]:
    path, shard, compression, spec = args
    problems: list[str] = []
    name = posixpath.basename(path)
    if not exists(path):
        return 0, [f"{name}: missing shard"]
    digest = FileDigest()
    records = 0
    try:
        for offset, raw in read_records(path, compression, on_raw=digest):
            records += 1
            try:
                bad = _spec_problems(parse_example(raw), spec)
            except Exception as exn:  # protobuf's DecodeError and friends
                bad = [f"not a tf.train.Example ({exn})"]
            if bad and len(problems) < 20:
                problems.append(
                    f"{name}: record {records} at byte {offset} does not parse with "
                    f"the spec: {'; '.join(bad)}"
                )
    except CorruptRecord as exn:
        problems.append(f"{name}: corrupt record at byte {exn.offset}: {exn}".replace(f"{path}: ", ""))
    except Exception as exn:  # a truncated or non-gzip stream
        problems.append(f"{name}: cannot be read as {compression}: {exn}")
    if digest.size != shard["bytes"]:
        problems.append(f"{name}: size {digest.size} bytes, the manifest says {shard['bytes']}")
    if digest.hexdigest() != shard["sha256"]:
        problems.append(
            f"{name}: sha256 {digest.hexdigest()[:16]}..., the manifest says {shard['sha256'][:16]}..."
        )
    if records != shard["records"]:
        problems.append(f"{name}: {records} records, the manifest says {shard['records']}")
    return records, problems


def _escapes(file: str, root: str) -> bool:
    """A shard path that is absolute, climbs out, or lies outside the version's folder."""
    parts = file.split("/")
    return file.startswith("/") or "://" in file or ".." in parts or not (root == "" or parts[0] == root)


def _unlisted(out: str, meta: dict[str, Any], listed: set[str]) -> list[str]:
    """Files below the output that the manifest does not account for."""
    version = meta.get("version") or ""
    journal = {layout.relative(p, layout.journal_dir(out)) for p in list_files(layout.journal_dir(out))}
    # Other versions RecordForge recorded (the one before, or a failed run's rejected rows) are
    # its own; the published version must hold exactly what the manifest lists.
    keep = {layout.STATE_DIR, meta.get("previous_version"), *journal} - {None, "", version}
    at = f"{version}/" if version else ""  # where the version's own files are
    transform = [f"{at}{d}/" for d in _TRANSFORM_DIRS] if "transform" in meta else []
    rejected = f"{at}{layout.REJECTED_DIR}/"
    bundle = {f"{at}{n}" for n in (*layout.TOP_COPIES, layout.METADATA)}
    extra = []
    for path in list_files(out):
        rel = layout.relative(path, out)
        if (
            rel in listed
            or rel in layout.TOP_FILES
            or rel in bundle
            or rel.split("/", 1)[0] in keep
            or any(rel.startswith(t) for t in transform)
            or (rel.startswith(rejected) and rel.endswith(".jsonl") and "/" not in rel[len(rejected) :])
        ):
            continue
        extra.append(rel)
    return extra


def _copy_problems(out: str, version: str) -> list[str]:
    """The top-level copies must be the published version's files, byte for byte."""
    out_of_date = []
    for name in layout.TOP_COPIES:
        top, own = f"{out}/{name}", layout.join(out, version, name)
        if exists(top) != exists(own):
            out_of_date.append(f"{name}: present in only one of the output and the published version")
        elif exists(top) and read_bytes(top) != read_bytes(own):
            out_of_date.append(f"{name}: differs from the published version's copy")
    return out_of_date


def _count_problems(meta: dict[str, Any]) -> list[str]:
    try:
        read, written, rejected = meta["rows_read"], meta["rows_written"], meta["rows_rejected"]
    except KeyError as exn:
        return [f"the manifest has no {exn.args[0]}"]
    out = []
    if read != written + rejected:
        out.append(
            "the manifest breaks rows_read == rows_written + rows_rejected "
            f"({read} != {written} + {rejected})"
        )
    if sum(s.get("records", 0) for s in meta.get("shards", [])) != written:
        out.append(f"the manifest's shards do not add up to rows_written ({written})")
    return out


def verify(path: str, *, workers: int | None = None) -> list[str]:
    """One line per problem; an empty list means the bundle is complete and intact."""
    out = path.rstrip("/")
    problems = []
    if not exists(f"{out}/{layout.SUCCESS}"):
        problems.append("_SUCCESS is missing: the output was never published, or only in part")
    try:
        with open_read(f"{out}/{layout.METADATA}") as f:
            meta = json.loads(f.read())
        version = meta.get("version") or ""
        with open_read(layout.join(out, version, layout.FEATURE_SPEC)) as f:
            spec = json.loads(f.read())
    except Exception as exn:
        return [*problems, f"cannot read the manifest: {exn}"]
    shards = meta.get("shards", [])
    escaping = [s["file"] for s in shards if _escapes(s["file"], version)]
    problems.extend(f"{f}: shard path escapes the bundle's folder" for f in escaping)
    shards = [s for s in shards if s["file"] not in escaping]
    listed = {s["file"] for s in shards}
    problems.extend(f"{extra}: extra file, not in the manifest" for extra in _unlisted(out, meta, listed))
    problems.extend(_count_problems(meta))
    if version:
        problems.extend(_copy_problems(out, version))
    if "transform" in meta:
        problems.extend(
            f"{f}: missing"
            for f in layout.TRANSFORM_FILES
            if not exists(layout.join(out, version, f) if version else f"{out}/{f}")
        )
    total = 0
    progress = Progress("verify", len(shards))
    jobs = [(f"{out}/{s['file']}", s, meta["compression"], spec) for s in shards]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for records, shard_problems in pool.map(_check_shard, jobs):
            total += records
            problems.extend(shard_problems)
            progress.update(files=1, records=records)
    progress.done()
    if total != meta.get("num_records"):
        problems.append(f"the shards hold {total} records, the manifest says {meta.get('num_records')}")
    return problems
