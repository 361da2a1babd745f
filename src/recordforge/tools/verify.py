"""verify: every shard of a bundle exists, has its size and checksum, every record's CRCs hold,
every record parses with the feature spec, and the counts match the manifest."""

from __future__ import annotations

import json
import math
import posixpath
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from apache_beam.io.filesystems import FileSystems

from recordforge.tfrecord import FileDigest
from recordforge.tools.progress import Progress
from recordforge.tools.records import CorruptRecord, parse_example, read_records

__all__ = ["verify"]

_BUNDLE_FILES = {
    "_SUCCESS",
    "metadata.json",
    "feature_spec.json",
    "schema.pbtxt",
    "schema.yaml",
    "raw_feature_spec.json",
}
# Written by tensorflow-transform's own writers when the run had transforms.
_TRANSFORM_FILES = (
    "transform_fn/saved_model.pb",
    "transformed_metadata/schema.pbtxt",
    "metadata/schema.pbtxt",
)
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
    if not FileSystems.exists(path):
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


def verify(path: str, *, workers: int | None = None) -> list[str]:
    """One line per problem; an empty list means the bundle is complete and intact."""
    out = path.rstrip("/")
    problems = []
    if not FileSystems.exists(f"{out}/_SUCCESS"):
        problems.append("_SUCCESS is missing: the output was never published, or only in part")
    try:
        with FileSystems.open(f"{out}/metadata.json") as f:
            meta = json.loads(f.read())
        with FileSystems.open(f"{out}/feature_spec.json") as f:
            spec = json.loads(f.read())
    except Exception as exn:
        return [*problems, f"cannot read the manifest: {exn}"]
    shards = meta.get("shards", [])
    listed = {s["file"] for s in shards}
    on_disk = {posixpath.basename(m.path) for m in FileSystems.match([f"{out}/*"])[0].metadata_list}
    for extra in sorted(on_disk - listed - _BUNDLE_FILES - {"_rejected"}):
        problems.append(f"{extra}: extra file, not in the manifest")
    if "transform" in meta:
        problems.extend(f"{f}: missing" for f in _TRANSFORM_FILES if not FileSystems.exists(f"{out}/{f}"))
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
