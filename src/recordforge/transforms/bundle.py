"""WriteBundle: the self-describing files of a version, then the commit that publishes it."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam

from recordforge import __version__, layout
from recordforge.array_records import ARRAY_RECORD, writer_options
from recordforge.errors import RecordForgeError
from recordforge.layout import (
    CROISSANT,
    FEATURE_SPEC,
    RAW_FEATURE_SPEC,
    REJECTED_DIR,
    SCHEMA_PBTXT,
    SCHEMA_YAML,
    TRANSFORMED_SCHEMA,
)
from recordforge.publishing import (
    check_inputs_unchanged,
    commit_version,
    drop_empty_rejected,
    replaced_version,
)
from recordforge.schemas.croissant import croissant_json
from recordforge.schemas.export import tfmd_text
from recordforge.schemas.loader import dump_schema
from recordforge.schemas.plan import Plan
from recordforge.schemas.sequence import POLICY_RULES, sequence_feature_spec, sequence_tfmd_text
from recordforge.schemas.tfds_metadata import tfds_metadata
from recordforge.storage import read_bytes
from recordforge.tfrecord import Compression, ShardInfo

__all__ = [
    "BundleSpec",
    "metadata_dict",
    "package_versions",
    "rule_of",
    "RunCounts",
    "RunFacts",
    "WriteBundle",
]

_LOGGER = logging.getLogger(__name__)


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
    own = [
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
    listed = sorted([*(base["shards"] if base else []), *own], key=lambda s: s["file"])
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


def _check_counts(spec: BundleSpec, records: int, written: int, counts: RunCounts) -> None:
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


class _Facts(beam.CombineFn):
    """What the bundle step needs from the whole run, gathered in bounded memory: row and
    rejection counts are summed where they are made (a combine's partial sums), only the small
    per-shard, per-file and per-rejected-file facts are kept as lists."""

    def create_accumulator(self) -> dict[str, Any]:
        return {
            "rows": 0,
            "rules": {},
            "shards": [],
            "unreadable": [],
            "rejected_files": [],
            "sequences": None,
        }

    def add_input(self, acc: dict[str, Any], fact: tuple[str, Any]) -> dict[str, Any]:
        kind, value = fact
        if kind == "rows":
            acc["rows"] += value
        elif kind == "rule":
            acc["rules"][value] = acc["rules"].get(value, 0) + 1
        elif kind in ("shards", "unreadable", "rejected_files"):
            acc[kind].append(value)
        elif kind == "sequences":
            acc["sequences"] = _add_pairs(acc["sequences"], value)
        return acc  # "waited": only makes the combine wait for it

    def merge_accumulators(self, accumulators: Iterable[dict[str, Any]]) -> dict[str, Any]:
        out = self.create_accumulator()
        for acc in accumulators:
            out["rows"] += acc["rows"]
            for rule, n in acc["rules"].items():
                out["rules"][rule] = out["rules"].get(rule, 0) + n
            for kind in ("shards", "unreadable", "rejected_files"):
                out[kind].extend(acc[kind])
            if acc["sequences"] is not None:
                out["sequences"] = _add_pairs(out["sequences"], acc["sequences"])
        return out

    def extract_output(self, acc: dict[str, Any]) -> dict[str, Any]:
        return acc


def _add_pairs(a: tuple[int, int] | None, b: tuple[int, int]) -> tuple[int, int]:
    return (b[0], b[1]) if a is None else (a[0] + b[0], a[1] + b[1])


def _write_bundle(facts: dict[str, Any], spec: BundleSpec) -> str:
    rejected: dict[str, int] = facts["rules"]
    # Rows the source itself rejected never became a batch; they were read all the same.
    source_rejected = rejected.get("csv_columns", 0)
    kept = spec.resumed["rows"] if spec.resumed is not None else 0
    counts = RunCounts(
        rows_read=facts["rows"] + source_rejected + kept,
        rejected_by_rule=rejected,
        unreadable=tuple(json.loads(u) for u in sorted(facts["unreadable"])),
        sequences=facts["sequences"] or ((0, 0) if spec.plan.schema.sequence is not None else None),
    )
    shards: list[ShardInfo] = facts["shards"]
    meta = metadata_dict(spec, shards, counts, replaced_version(spec.output, spec.version))
    # This run's shards hold what it read, less what it rejected; with --append, so do all.
    records = sum(s.records for s in shards)
    written = counts.sequences[1] if counts.sequences is not None else records
    _check_counts(spec, records, written, counts)
    if meta["rows_written"] + meta["rows_rejected"] != meta["rows_read"]:  # the base's, summed
        raise RuntimeError(
            f"{spec.output}: the appended counts break {meta['invariant']}; nothing was published"
        )
    _check_inputs_unchanged(spec)
    root = spec.root
    drop_empty_rejected(root, facts["rejected_files"])
    source = spec.source_plan
    files = {
        SCHEMA_PBTXT: tfmd_text(spec.plan).encode(),
        SCHEMA_YAML: dump_schema(
            source.schema, header=f"# RecordForge schema ({source.schema.origin})\n"
        ).encode(),
        FEATURE_SPEC: json.dumps(spec.plan.feature_spec, indent=2).encode(),
    }
    if spec.raw_plan is not None:
        # The transformed schema as TFT wrote it (with vocabulary sizes as domains), and the raw
        # spec that serving parses raw Examples with before applying transform_fn.
        files[SCHEMA_PBTXT] = read_bytes(layout.join(root, TRANSFORMED_SCHEMA))
        files[RAW_FEATURE_SPEC] = json.dumps(spec.raw_plan.feature_spec, indent=2).encode()
    if source.schema.sequence is not None:
        # SequenceExamples: context and sequence specs, and the TFMD schema TFXIO reads them
        # with. TFDS and Croissant metadata describe flat records: not written (README).
        files[SCHEMA_PBTXT] = sequence_tfmd_text(source.schema).encode()
        files[FEATURE_SPEC] = json.dumps(sequence_feature_spec(source.schema), indent=2).encode()
    else:
        # Catalog metadata for TFDS (where it can read the shards) and Croissant.
        files[CROISSANT] = croissant_json(spec.plan, meta, output=spec.output)
        files.update(tfds_metadata(spec.plan, meta, output=spec.output))
    manifest = json.dumps(meta, indent=2).encode()
    commit_version(spec.output, spec.version, files, manifest, temp_dirs=spec.temp_dirs)
    _LOGGER.info(
        "%s: published version %s, %d records in %d shards",
        spec.output,
        spec.version,
        meta["num_records"],
        len(meta["shards"]),
    )
    return spec.output


def _check_inputs_unchanged(spec: BundleSpec) -> None:
    """A folder of images stands as one input, sized by its listing where the store gives sizes:
    it is not one file to look up again, and its images are read whole, each one a row or a
    rejected row. Any other input is checked as it was listed (`check_inputs_unchanged`)."""
    if spec.source_format != "images":
        check_inputs_unchanged(spec.sources)


def rule_of(line: str) -> str:
    return json.loads(line)["rule"]


class WriteBundle(beam.PTransform):
    """Writes schema.pbtxt, schema.yaml, feature_spec.json, croissant.json, the TFDS metadata,
    metadata.json, then `_SUCCESS`.

    In: the `ShardInfo`s of the written shards; besides, `rows_per_batch` (the rows of every
    source batch), the rule of every rejected row, the JSON line of every unreadable file, the
    rejected files written (publishing waits for them), and with tensorflow-transform the signal
    that transform_fn/ is written, and for SequenceExamples the (sequences, rows in them) of
    every bucket (`sequence_counts`: rows_written then counts rows, num_records sequences), all
    gathered by one combine. Out: the output path, once.
    Fails, publishing nothing, when rows_read != rows_written + rows_rejected or when more rows
    were rejected than the bounds allow (with the top reasons).
    """

    def __init__(
        self,
        spec: BundleSpec,
        *,
        rows_per_batch: beam.PCollection[int],
        rejected_rules: beam.PCollection[str],
        unreadable: beam.PCollection[str],
        rejected_files: beam.PCollection[str],
        transform_written: beam.PCollection[str] | None = None,
        sequence_counts: beam.PCollection[tuple[int, int]] | None = None,
    ) -> None:
        super().__init__()
        self._spec = spec
        self._rows = rows_per_batch
        self._rules = rejected_rules
        self._unreadable = unreadable
        # A side input, so that publishing waits for the rejected rows to be written.
        self._rejected_files = rejected_files
        self._transform_written = transform_written
        self._sequence_counts = sequence_counts

    def expand(self, shards: beam.PCollection[ShardInfo]) -> beam.PCollection[str]:
        def tagged(kind: str, values: beam.PCollection) -> beam.PCollection:
            return values | f"Tag[{kind}]" >> beam.Map(lambda v, k=kind: (k, v))

        facts = [
            tagged("shards", shards),
            tagged("rows", self._rows),
            tagged("rule", self._rules),
            tagged("unreadable", self._unreadable),
            tagged("rejected_files", self._rejected_files),
        ]
        if self._transform_written is not None:
            facts.append(tagged("waited", self._transform_written))
        if self._sequence_counts is not None:
            facts.append(tagged("sequences", self._sequence_counts))
        # One combine gathers every fact; its single output runs the bundle step once, after
        # everything it depends on is written.
        return (
            facts
            | "AllFacts" >> beam.Flatten()
            | "Gather" >> beam.CombineGlobally(_Facts())
            | "Write" >> beam.Map(_write_bundle, spec=self._spec)
        )
