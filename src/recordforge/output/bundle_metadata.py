"""metadata.json's content: a run's facts, counts and shards, checked (rows in = written + rejected)."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.files.layout import (
    REJECTED_DIR,
)
from recordforge.records.array_records import ARRAY_RECORD, writer_options
from recordforge.records.tfrecord import Compression, ShardInfo
from recordforge.records.webdataset import WEBDATASET, webdataset_facts
from recordforge.schemas.plan import Plan
from recordforge.schemas.sequence_spec import POLICY_RULES
from recordforge.version import __version__

__all__ = ["BundleSpec", "RunCounts", "RunFacts", "check_counts", "metadata_dict", "package_versions"]

_LOGGER = logging.getLogger("recordforge.transforms.bundle")


@dataclass(frozen=True)
class RunFacts:
    """What metadata.json records about a run beyond counts and shards, known at construction;
    None where it does not apply (written out as nothing)."""

    input_fingerprint: str = ""  # of the inputs, schema and settings (--if_changed compares it)
    span: str | None = None
    labels: tuple[str, ...] | None = None  # an image folder's, sorted (label_id indexes them)
    splits: tuple[str, ...] | None = None  # an image folder's split folders
    images: int | None = None  # in an image folder
    split_weights: dict[str, int] | None = None  # the output's splits, by name
    split_salt: str | None = None
    split_key: str | None = None
    split_column: str | None = None
    transform: dict[str, Any] | None = None  # the declared transforms and the split fitted on
    shuffle_seed: int | None = None
    sharding: dict[str, dict[str, Any]] | None = None  # how each split's shards were cut
    settings: dict[str, Any] | None = None  # the flags that change the output (--append compares)
    estimated: dict[str, Any] | None = None  # what the plan estimated (pipelines/planning.py)
    delta: dict[str, Any] | None = None  # --format delta: the table and the version read

    def metadata(self) -> dict[str, Any]:
        out: dict[str, Any] = {"input_fingerprint": self.input_fingerprint}
        for name, value in (
            ("span", self.span),
            ("labels", self.labels),
            ("splits", self.splits),
            ("images", self.images),
            ("split_column", self.split_column),
            ("transform", self.transform),
            ("shuffle_seed", self.shuffle_seed),
            ("sharding", self.sharding),
            ("settings", self.settings),
            ("estimated", self.estimated),
            ("delta", self.delta),
        ):
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        if self.split_weights is not None:
            out.update(split_weights=self.split_weights, split_salt=self.split_salt, split_key=self.split_key)
        return out


@dataclass(frozen=True)
class BundleSpec:
    """What the bundle records about the run, known at construction."""

    output: str
    version: str  # the folder below `output` that this run wrote (layout.py)
    plan: Plan
    source_format: str
    sources: tuple[tuple[str, int | None, float], ...]  # (path, size in bytes or None, modified)
    compression: str
    output_format: str = "tfrecord"
    command: tuple[str, ...] = ()
    max_rejected: int = 0
    max_rejected_fraction: float = 0.0
    facts: RunFacts = RunFacts()
    # With tensorflow-transform: `plan` describes the transformed records, `raw_plan` the schema
    # they were transformed from; `temp_dirs` are TFT's working files, deleted before publishing.
    raw_plan: Plan | None = None
    temp_dirs: tuple[str, ...] = ()
    # --append: the published manifest this version extends; its shards, sources and counts are
    # listed again beside this run's (its shards stay where they are).
    base: dict[str, Any] | None = None
    # A rerun that kept a killed run's pieces (pieces.Reuse.describe): their rows were read by
    # that run, and are counted with this one's.
    resumed: dict[str, Any] | None = None

    @property
    def root(self) -> str:
        return layout.version_root(self.output, self.version)

    @property
    def source_plan(self) -> Plan:
        """The schema the input was read with."""
        return self.raw_plan or self.plan


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in (
        "recordforge",
        "apache-beam",
        "pyarrow",
        "numpy",
        "protobuf",
        "isal",
        "array-record",
        "tensorflow-metadata",
        "tensorflow-transform",
        "tensorflow",
        "pillow",
    ):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out


@dataclass(frozen=True)
class RunCounts:
    """What the pipeline counted on its way, as opposed to what is on disk."""

    rows_read: int
    rejected_by_rule: dict[str, int]
    unreadable: tuple[dict[str, Any], ...] = ()
    sequences: tuple[int, int] | None = None  # (SequenceExamples, rows in them) of a sequence run

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected_by_rule.values())


def _split_totals(spec: BundleSpec, shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Records and shards per split; an empty split is reported with 0, not written."""
    weights = spec.facts.split_weights
    if not weights:
        return {}
    totals = {name: {"records": 0, "shards": 0} for name in weights}
    for s in shards:
        totals[s["split"]]["records"] += s["records"]
        totals[s["split"]]["shards"] += 1
    return {"split_counts": totals, "empty_splits": [n for n, t in totals.items() if t["records"] == 0]}


def _format_facts(spec: BundleSpec) -> dict[str, Any]:
    """How the shards are written: the file format, its compression and how to read them."""
    if spec.output_format == WEBDATASET:
        return {"format": WEBDATASET, "compression": "none", "webdataset": webdataset_facts()}
    if spec.output_format == ARRAY_RECORD:
        return {
            "format": ARRAY_RECORD,
            "compression": spec.compression,
            "array_record_options": writer_options(spec.compression),
        }
    return {
        "format": "tfrecord",
        "compression": spec.compression,
        "tf_compression_type": Compression.tf(spec.compression),
    }


def _appended(base: dict[str, Any], shards: list[dict[str, Any]], counts: RunCounts) -> dict[str, Any]:
    """What an append converted, beside what it kept: the scheduler's answer to "what did this
    run do?"."""
    return {
        "base_version": base["version"],
        "reused": {"shards": len(base["shards"]), "rows": base["rows_read"]},
        "converted": {
            "files": 0,  # filled in by metadata_dict, which knows the sources
            "shards": len(shards),
            "rows_read": counts.rows_read,
            "rows_written": sum(s["records"] for s in shards),
            "rows_rejected": counts.rows_rejected,
        },
    }


def metadata_dict(
    spec: BundleSpec, shards: list[ShardInfo], counts: RunCounts, previous_version: str | None = None
) -> dict[str, Any]:
    """metadata.json of a version; `previous_version` is the one it replaces (kept until the next)."""
    splits = bool(spec.facts.split_weights)
    own: list[dict[str, Any]] = [
        {
            "file": layout.relative(s.path, spec.output),
            **({"split": layout.relative(s.path, spec.root).split("/", 1)[0]} if splits else {}),
            "records": s.records,
            "bytes": s.bytes,
            "sha256": s.sha256,
            **({"index": layout.relative(s.index, spec.output)} if s.index else {}),
        }
        for s in shards
    ]
    base = spec.base
    # An append lists the base's shards first, in the base's order, then its own: version names
    # have one-second resolution, so a path sort could put the new shards first.
    listed = [*(base["shards"] if base else []), *sorted(own, key=lambda s: s["file"])]
    records = sum(s["records"] for s in listed)
    # A sequence's record holds many rows: rows_written counts the rows in written sequences.
    written = records
    if counts.sequences is not None:
        written = counts.sequences[1] + (base["rows_written"] if base else 0)
    sources = [{"path": p, "bytes": b, "modified": m} for p, b, m in spec.sources]
    grown: dict[str, Any] = {}
    if spec.resumed is not None:
        grown["resumed"] = {**spec.resumed, "rows_converted": counts.rows_read - spec.resumed["rows"]}
    if base is not None:
        grown["appended"] = _appended(base, own, counts)
        grown["appended"]["converted"]["files"] = len(sources)
        sources = [*base["sources"], *sources]
        counts = RunCounts(
            rows_read=counts.rows_read + base["rows_read"],
            rejected_by_rule=_summed(base["rejected_by_rule"], counts.rejected_by_rule),
            unreadable=(*base.get("unreadable_files", []), *counts.unreadable),
        )
    schema = spec.source_plan.schema
    return {
        "recordforge_version": __version__,
        "version": spec.version,
        "previous_version": previous_version,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": list(spec.command),
        "source_format": spec.source_format,
        "sources": sources,
        "versions": package_versions(),
        "schema_origin": schema.origin,
        "schema_fingerprint": spec.source_plan.fingerprint,
        "schema_notes": list(schema.notes),
        "columns": {f.name: f.source_column for f in schema.features},
        "null_policies": {f.name: f.nulls.value for f in schema.features},
        **_format_facts(spec),
        "rows_read": counts.rows_read,
        "rows_written": written,
        "rows_rejected": counts.rows_rejected,
        "rejected_by_rule": dict(sorted(counts.rejected_by_rule.items())),
        "rejected_bounds": {
            "max_rejected": spec.max_rejected,
            "max_rejected_fraction": spec.max_rejected_fraction,
        },
        "invariant": "rows_read == rows_written + rows_rejected",
        "unreadable_files": list(counts.unreadable),
        "num_records": records,
        **({"sequence": schema.sequence.to_dict()} if schema.sequence is not None else {}),
        **spec.facts.metadata(),
        **grown,
        "shards": listed,
        **_split_totals(spec, listed),
    }


def _summed(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def check_counts(spec: BundleSpec, records: int, written: int, counts: RunCounts) -> None:
    """This run's own shards (`records`, holding `written` rows) against what it read."""
    if counts.sequences is not None and counts.sequences[0] != records:
        raise RuntimeError(
            f"{spec.output}: {counts.sequences[0]} sequences were encoded but the shards hold "
            f"{records} records; refusing to publish"
        )
    if written + counts.rows_rejected != counts.rows_read:
        raise RuntimeError(
            f"{spec.output}: read {counts.rows_read} rows but the shards hold "
            f"{written} records and {counts.rows_rejected} were rejected; refusing "
            "to publish a dataset that lost rows"
        )
    allowed = max(spec.max_rejected, int(spec.max_rejected_fraction * counts.rows_read))
    # Rows a sequence's declared length policy leaves out are not bad rows: not bounded.
    by_policy = sum(n for rule, n in counts.rejected_by_rule.items() if rule in POLICY_RULES)
    if counts.rows_rejected - by_policy > allowed:
        top = sorted(counts.rejected_by_rule.items(), key=lambda kv: -kv[1])[:5]
        raise RecordForgeError(
            f"{counts.rows_rejected} of {counts.rows_read} rows were rejected, more than the "
            f"{allowed} allowed (--max_rejected {spec.max_rejected}, --max_rejected_fraction "
            f"{spec.max_rejected_fraction}); top reasons: "
            + ", ".join(f"{rule}: {n}" for rule, n in top)
            + f"; nothing was published; the rejected rows are in {layout.join(spec.root, REJECTED_DIR)}/"
        )
