"""WriteBundle: the self-describing files of a version, then the commit that publishes it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

import apache_beam as beam

from recordforge.files import layout
from recordforge.files.layout import (
    CROISSANT,
    FEATURE_SPEC,
    RAW_FEATURE_SPEC,
    SCHEMA_PBTXT,
    SCHEMA_YAML,
    TRANSFORMED_SCHEMA,
)
from recordforge.files.storage import read_bytes
from recordforge.output.bundle_metadata import (
    BundleSpec,
    RunCounts,
    RunFacts,
    check_counts,
    metadata_dict,
    package_versions,
)
from recordforge.output.publishing import (
    check_inputs_unchanged,
    commit_version,
    drop_empty_rejected,
    replaced_version,
)
from recordforge.records.tfrecord import ShardInfo
from recordforge.schemas.croissant import croissant_json
from recordforge.schemas.export import tfmd_text
from recordforge.schemas.loader import dump_schema
from recordforge.schemas.sequence import sequence_feature_spec, sequence_tfmd_text
from recordforge.schemas.tfds_metadata import tfds_metadata

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
    source_rejected = sum(rejected.get(rule, 0) for rule in ("csv_columns", "json_line", "example"))
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
    check_counts(spec, records, written, counts)
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
