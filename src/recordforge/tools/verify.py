"""verify: every shard of a bundle exists, has its size and checksum, every record's CRCs hold,
every record parses with the feature spec, the counts match the manifest and its invariant, and
nothing lies in the output that the manifest does not account for."""

from __future__ import annotations

import functools
import math
import posixpath
from typing import Any

import numpy as np

from recordforge.errors import CorruptFile
from recordforge.files import layout
from recordforge.files.storage import exists, list_files, read_bytes
from recordforge.output.state import committed_versions
from recordforge.records.array_records import reading
from recordforge.records.bundle_json import load_feature_spec, load_metadata
from recordforge.records.chunks import RecordChunk, data_crc_mismatches
from recordforge.records.wire import BYTES, FLOAT, INT64, NONE, Batch, Column, decode_batch, kind_name
from recordforge.records.wire_keys import KeyTable
from recordforge.tools.scan import ShardResult, scan_shards

__all__ = ["verify"]

# Folders of a version that tensorflow-transform writes (their contents are its own).
_TRANSFORM_DIRS = (layout.TRANSFORM_FN, layout.TRANSFORMED_METADATA, layout.RAW_METADATA)
_KINDS = {"int64": INT64, "float32": FLOAT, "string": BYTES}
_MAX_LISTED = 20  # records named per shard; the count of the others is given


class _Checks:
    """Per chunk: the data CRCs, and every record against the feature spec, feature by feature
    over the whole chunk (numpy), each bad record named with its index and byte offset."""

    def __init__(self, spec: dict[str, dict], *, sizes: bool = False) -> None:
        self.spec = spec
        # (first record, framed sizes) per chunk, where the shard's record index is checked.
        self.sizes: list[tuple[int, np.ndarray]] | None = [] if sizes else None
        self.keys = KeyTable()
        self.corrupt: tuple[int, str] | None = None  # (offset, what) of the first bad data CRC
        self.bad: list[tuple[int, int, str]] = []  # (record index, offset, why), the first few
        self.bad_count = 0

    def add(self, chunk: RecordChunk, shard: str) -> None:
        if self.sizes is not None:
            self.sizes.append((chunk.first_record, chunk.lengths + 16))
        crc_bad = data_crc_mismatches(chunk)
        if len(crc_bad):
            offset = chunk.offset + int(chunk.heads[crc_bad[0]])
            if self.corrupt is None or offset < self.corrupt[0]:
                self.corrupt = (offset, "corrupt data (CRC mismatch)")
        batch = decode_batch(chunk.data, chunk.starts, chunk.ends, self.keys, padded=chunk.padded)
        why = _spec_problems(batch, self.spec)
        for r, text in batch.errors.items():
            why.setdefault(r, []).insert(0, text)
        skip = set(crc_bad.tolist())
        found = sorted(r for r in why if r not in skip)
        self.bad_count += len(found)
        for r in found[:_MAX_LISTED]:
            self.bad.append((chunk.first_record + r, chunk.offset + int(chunk.heads[r]), "; ".join(why[r])))
        self.bad = sorted(self.bad)[:_MAX_LISTED]

    def merge(self, other: _Checks) -> None:
        if other.corrupt and (self.corrupt is None or other.corrupt[0] < self.corrupt[0]):
            self.corrupt = other.corrupt
        self.bad = sorted(self.bad + other.bad)[:_MAX_LISTED]
        self.bad_count += other.bad_count
        if self.sizes is not None and other.sizes is not None:
            self.sizes += other.sizes

    def index(self) -> np.ndarray:
        """The (offset, size) of every record read, as its index file must list them."""
        parts = [sizes for _, sizes in sorted(self.sizes or [], key=lambda p: p[0])]
        sizes = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if len(sizes) else sizes
        return np.stack([offsets, sizes], axis=1).astype(np.int64)


def _index_problems(out: str, shard: dict[str, Any], result: ShardResult) -> list[str]:
    """A shard's record index must list every record's offset and size, in order, as read."""
    name = posixpath.basename(shard["index"])
    path = layout.join(out, shard["index"])
    if not exists(path):
        return [f"{name}: missing record index"]
    try:
        listed = np.array(read_bytes(path).split(), dtype=np.int64).reshape(-1, 2)
    except (ValueError, OverflowError):  # not numbers, an odd count, or over 2**63
        return [f"{name}: not a record index (one `offset size` line per record)"]
    expected = result.acc.index()
    if len(listed) != len(expected):
        return [f"{name}: lists {len(listed)} records, the shard holds {len(expected)}"]
    wrong = np.flatnonzero((listed != expected).any(axis=1))
    if len(wrong):
        at = int(wrong[0])
        return [
            f"{name}: line {at + 1} says offset {listed[at][0]} size {listed[at][1]}, the record is "
            f"at {expected[at][0]} with {expected[at][1]} bytes"
        ]
    return []


def _spec_problems(batch: Batch, spec: dict[str, dict]) -> dict[int, list[str]]:
    """{record: [what is wrong]} for the records of a batch that tf.io.parse_example refuses with
    the spec, or parses into a malformed RaggedTensor (it checks no row lengths): each test runs
    over the whole batch; only the records it flags are named one by one."""
    out: dict[int, list[str]] = {}
    refused = set(batch.not_examples)
    for name, entry in spec.items():
        if entry["kind"] == "RaggedFeature":
            found = _ragged_problems(batch, name, entry)
        else:
            col = batch.columns.get(name)
            found = _kind_problems(col, repr(name), entry["dtype"])
            if entry["kind"] == "FixedLenFeature":
                found += _fixed_problems(batch.size, col, name, entry)
        for r, text in found:
            if r not in refused:
                out.setdefault(r, []).append(text)
    return out


def _kind_problems(col: Column | None, what: str, dtype: str) -> list[tuple[int, str]]:
    """Entries whose list is of another kind than the spec's: tf.io refuses them even empty
    ("Data types don't match"); an entry with no list at all is as good as absent."""
    if col is None:
        return []
    wrong = np.flatnonzero((col.kind != _KINDS[dtype]) & (col.kind != NONE))
    return [
        (r, f"feature {what} is {kind_name(k)}, the spec says {dtype}")
        for r, k in zip(col.rec[wrong].tolist(), col.kind[wrong].tolist(), strict=True)
    ]


def _fixed_problems(n: int, col: Column | None, name: str, entry: dict) -> list[tuple[int, str]]:
    """A FixedLenFeature: absent (or with no list) only where the spec has a default, and
    otherwise exactly as many values as its shape holds."""
    found = []
    listed = np.zeros(n, bool)
    if col is not None:
        has_list = col.kind != NONE
        listed[col.rec[has_list]] = True
        need = math.prod(entry["shape"])
        off = np.flatnonzero(has_list & (col.count != need))
        shape = entry["shape"]
        for r, c in zip(col.rec[off].tolist(), col.count[off].tolist(), strict=True):
            found.append((r, f"feature {name!r} has {c} values, the spec's shape {shape} needs {need}"))
    if "default_value" not in entry:
        found += [
            (r, f"feature {name!r} is missing (FixedLenFeature)") for r in np.flatnonzero(~listed).tolist()
        ]
    return found


def _ragged_problems(batch: Batch, name: str, entry: dict) -> list[tuple[int, str]]:
    """A RaggedFeature: its values of the spec's kind, each partition's row lengths int64,
    none negative, and summing to the rows of the next partition (the innermost: to the
    values), as a well-formed RaggedTensor needs."""
    n = batch.size
    values = batch.columns.get(entry["value_key"])
    found = _kind_problems(values, f"{entry['value_key']!r} (values of ragged {name!r})", entry["dtype"])
    inner = np.zeros(n, np.int64)  # values per record, then rows of the partition below
    if values is not None:
        ok = values.kind == _KINDS[entry["dtype"]]
        inner = np.bincount(values.rec[ok], weights=values.count[ok], minlength=n).astype(np.int64)
    below = "values"
    for part in reversed(entry["partitions"]):
        key = part["row_lengths"]
        lengths = batch.columns.get(key)
        found += _kind_problems(lengths, f"{key!r} (row lengths of ragged {name!r})", "int64")
        rows: np.ndarray = np.zeros(n, np.int64)
        total: np.ndarray = np.zeros(n, np.int64)
        shown: np.ndarray = np.zeros(n)
        negative: np.ndarray = np.zeros(0, np.int64)
        if lengths is not None:
            ints = lengths.kind == INT64
            owner = np.repeat(lengths.rec[ints], lengths.count[ints])
            negative = np.unique(owner[lengths.ints < 0]).astype(np.int64)
            found += [
                (r, f"ragged feature {name!r}: a negative row length in {key!r}") for r in negative.tolist()
            ]
            # Clipped, the sum cannot wrap around, and still differs wherever it did.
            np.add.at(total, owner, np.clip(lengths.ints, 0, int(inner.max(initial=0)) + 1))
            shown = np.bincount(owner, weights=lengths.ints, minlength=n)
            rows = np.bincount(owner, minlength=n).astype(np.int64)
        mismatch = total != inner
        mismatch[negative] = False  # named for its negative length already
        for r in np.flatnonzero(mismatch).tolist():
            why = f"row lengths {key!r} sum to {int(shown[r])}, {int(inner[r])} {below}"
            found.append((r, f"ragged feature {name!r}: {why}"))
        inner, below = rows, f"rows in {key!r}"
    return found


def _shard_problems(name: str, shard: dict[str, Any], result: ShardResult) -> list[str]:
    if result.missing:
        return [f"{name}: missing shard"]
    problems = []
    checks: _Checks = result.acc
    corrupt = []
    if result.error is not None:
        if result.error_offset is None:
            problems.append(f"{name}: {result.error}")
        else:
            corrupt.append((result.error_offset, result.error))
    if checks.corrupt is not None:
        corrupt.append(checks.corrupt)
    if corrupt:
        offset, what = min(corrupt)
        problems.append(f"{name}: corrupt record at byte {offset}: {what}")
    for index, offset, why in checks.bad:
        problems.append(f"{name}: record {index + 1} at byte {offset} does not parse with the spec: {why}")
    if checks.bad_count > len(checks.bad):
        problems.append(
            f"{name}: {checks.bad_count - len(checks.bad)} more records do not parse with the spec"
        )
    if result.size != shard["bytes"]:
        problems.append(f"{name}: size {result.size} bytes, the manifest says {shard['bytes']}")
    if result.sha256 != shard["sha256"]:
        problems.append(
            f"{name}: sha256 {result.sha256[:16]}..., the manifest says {shard['sha256'][:16]}..."
        )
    if result.records != shard["records"]:
        problems.append(f"{name}: {result.records} records, the manifest says {shard['records']}")
    return problems


def _escapes(file: str, roots: set[str]) -> bool:
    """A shard path outside the version folders it may lie in (`roots`; {""}: the output's own).
    One that is absolute, has a scheme or climbs out never gets here: load_metadata refuses it."""
    return not ("" in roots or file.split("/")[0] in roots)


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
            or (
                rel.startswith(rejected)
                and rel.endswith(layout.REJECTED_SUFFIX)
                and "/" not in rel[len(rejected) :]
            )
        ):
            continue
        extra.append(rel)
    return extra


def _copy_problems(out: str, version: str) -> list[str]:
    """The top-level copies must be the published version's files, byte for byte."""
    out_of_date = []
    for name in layout.TOP_COPIES:
        top, own = layout.join(out, name), layout.join(out, version, name)
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
    # A SequenceExample holds many rows: its shards add up to num_records, its rows to rows_written.
    records = meta.get("num_records") if "sequence" in meta else written
    if sum(s.get("records", 0) for s in meta.get("shards", [])) != records:
        what = "num_records" if "sequence" in meta else "rows_written"
        out.append(f"the manifest's shards do not add up to {what} ({records})")
    return out


def _damaged(out: str, what: str) -> str:
    """The line for a manifest that is gone or unreadable, naming what the journal still knows."""
    journal = sorted(layout.relative(p, layout.journal_dir(out)) for p in list_files(layout.journal_dir(out)))
    committed = committed_versions(out, journal)
    if not committed:
        return f"{what}: the published version cannot be found"
    return (
        f"{what}: the published version cannot be found (the run journal records "
        f"{', '.join(committed)}); `recordforge convert --overwrite` rebuilds the bundle"
    )


def verify(path: str, *, workers: int | None = None) -> list[str]:
    """One line per problem; an empty list means the bundle is complete and intact."""
    out = path.rstrip("/")
    problems = []
    if not exists(layout.join(out, layout.SUCCESS)):
        problems.append(f"{layout.SUCCESS} is missing: the output was never published, or only in part")
    if not exists(layout.join(out, layout.METADATA)):
        return [*problems, _damaged(out, f"{layout.METADATA} is missing")]
    try:
        meta = load_metadata(layout.join(out, layout.METADATA))
    except CorruptFile as exn:
        return [*problems, _damaged(out, str(exn))]
    version = meta.get("version") or ""
    try:
        spec_path = (
            layout.join(out, version, layout.FEATURE_SPEC)
            if version
            else layout.join(out, layout.FEATURE_SPEC)
        )
        spec = load_feature_spec(spec_path, sequence="sequence" in meta)
    except (CorruptFile, OSError) as exn:
        return [*problems, f"cannot read the manifest: {exn}"]
    if "sequence" in meta:
        # SequenceExamples: a record's context (field 1, laid out as an Example's features) is
        # checked against the context spec; its feature lists by the CRCs alone.
        spec = spec["context"]
    shards = meta.get("shards", [])
    roots = {version}
    if "appended" in meta:  # also the versions it grew from, which RecordForge's journal records
        roots |= {layout.relative(p, layout.journal_dir(out)) for p in list_files(layout.journal_dir(out))}
    escaping = [s["file"] for s in shards if _escapes(s["file"], roots)]
    problems.extend(f"{f}: shard path escapes the bundle's folder" for f in escaping)
    shards = [s for s in shards if s["file"] not in escaping]
    listed = {s["file"] for s in shards} | {s["index"] for s in shards if "index" in s}
    problems.extend(f"{extra}: extra file, not in the manifest" for extra in _unlisted(out, meta, listed))
    problems.extend(_count_problems(meta))
    if version:
        problems.extend(_copy_problems(out, version))
    if "transform" in meta:
        problems.extend(
            f"{f}: missing"
            for f in layout.TRANSFORM_FILES
            if not exists(layout.join(out, version, f) if version else layout.join(out, f))
        )
    files = [(layout.join(out, s["file"]), reading(meta)) for s in shards]
    results = scan_shards(
        files,
        functools.partial(_Checks, spec, sizes=any("index" in s for s in shards)),
        what="verify",
        total_bytes=sum(int(s.get("bytes", 0)) for s in shards),
        workers=workers,
    )
    total = 0
    for shard, result in zip(shards, results, strict=True):
        total += result.records
        problems.extend(_shard_problems(posixpath.basename(result.path), shard, result))
        if "index" in shard and not result.missing and result.error is None:
            problems.extend(_index_problems(out, shard, result))
    if total != meta.get("num_records"):
        problems.append(f"the shards hold {total} records, the manifest says {meta.get('num_records')}")
    return problems
