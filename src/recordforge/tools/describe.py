"""inspect and head: what a bundle or any TFRecord file holds, as text a person can read."""

from __future__ import annotations

import itertools
from typing import Any

import yaml

from recordforge.files import layout
from recordforge.files.storage import exists, open_read
from recordforge.records import webdataset
from recordforge.records.array_records import ARRAY_RECORD, reading
from recordforge.records.bundle_json import load_feature_spec, load_metadata
from recordforge.records.example_pb import parse_example
from recordforge.records.tfrecord import detect_compression, read_records
from recordforge.records.webdataset import ustar
from recordforge.tools.records import infer_feature_spec, parsed_records

__all__ = [
    "feature_description_code",
    "format_head",
    "format_inspect",
    "format_record",
    "head",
    "inspect",
    "spec_to_schema_yaml",
]

_TF_DTYPE = {"int64": "tf.int64", "float32": "tf.float32", "string": "tf.string"}


def feature_description_code(spec: dict[str, dict[str, Any]]) -> str:
    """The spec as a `feature_description` dict to paste into tf.io.parse_example code."""
    lines = ["feature_description = {"]
    for name, e in spec.items():
        if e["kind"] == "FixedLenFeature":
            lines.append(f"    {name!r}: tf.io.FixedLenFeature({e['shape']}, {_TF_DTYPE[e['dtype']]}),")
        elif e["kind"] == "RaggedFeature":
            parts = ", ".join(
                f"tf.io.RaggedFeature.RowLengths({p['row_lengths']!r})" for p in e["partitions"]
            )
            lines.append(
                f"    {name!r}: tf.io.RaggedFeature({_TF_DTYPE[e['dtype']]}, value_key="
                f"{e['value_key']!r}, partitions=[{parts}]),"
            )
        else:
            lines.append(f"    {name!r}: tf.io.VarLenFeature({_TF_DTYPE[e['dtype']]}),")
    lines.append("}")
    return "\n".join(lines)


def spec_to_schema_yaml(spec: dict[str, dict[str, Any]]) -> str:
    """A RecordForge schema matching an inferred spec (float lists read as float32)."""
    types = {"int64": "int64", "float32": "float32", "string": "bytes"}
    features = []
    for name, e in spec.items():
        if e["kind"] == "FixedLenFeature":
            features.append(
                {"name": name, "type": types[e["dtype"]], "shape": e["shape"], "nulls": "required"}
            )
        else:
            features.append({"name": name, "type": types[e["dtype"]], "shape": [-1]})
    return yaml.safe_dump({"features": features}, sort_keys=False, default_flow_style=None)


def _show_value(kind: str, values: list[Any]) -> str:
    def one(v: Any) -> str:
        if isinstance(v, bytes):
            text = v[:60]
            try:
                shown = repr(text.decode("utf-8"))
            except UnicodeDecodeError:
                shown = repr(text)
            return shown + (f"... ({len(v)} bytes)" if len(v) > 60 else "")
        return repr(v)

    shown = ", ".join(one(v) for v in values[:8])
    more = f", ... ({len(values)} values)" if len(values) > 8 else ""
    return f"{kind}[{shown}{more}]"


def _parse_sequence(raw: bytes) -> dict[str, tuple[str, list[Any]]]:
    """A SequenceExample as one record to show: context features, then each feature list as
    `name[steps]` holding one list of values per step."""
    from recordforge.records.sequence_records import parse_sequence_example

    context, lists = parse_sequence_example(raw)
    return {**context, **{f"{name}[steps]": value for name, value in lists.items()}}


def format_record(record: dict[str, tuple[str, list[Any]]]) -> str:
    return "\n".join(f"  {name}: {_show_value(*record[name])}" for name in sorted(record))


def head(path: str, n: int = 5, *, sample: int = 1000) -> dict[str, Any]:
    """Works on any TFRecord, ArrayRecord or WebDataset shard of tf.train.Examples, no bundle
    needed."""
    with open_read(path) as f:
        first = f.read(512)
    compression = webdataset.WEBDATASET if ustar.is_tar(first) else detect_compression(path)
    records = list(
        parsed_records(path, itertools.islice(read_records(path, compression), sample), compression)
    )
    summaries, spec = infer_feature_spec(records)
    return {
        "path": path,
        "compression": compression,
        "sampled": len(records),
        "feature_spec": spec,
        "presence": {k: s.present / max(len(records), 1) for k, s in sorted(summaries.items())},
        "records": records[:n],
    }


def _kind(compression: str) -> str:
    if compression == webdataset.WEBDATASET:
        return "a WebDataset shard"
    return "an ArrayRecord file" if compression == ARRAY_RECORD else f"{compression} compression"


def format_head(result: dict[str, Any]) -> str:
    out = [
        f"{result['path']}: {_kind(result['compression'])}, {result['sampled']} records sampled",
        "",
        "Inferred tf.io parsing spec (paste into your code):",
        "",
        feature_description_code(result["feature_spec"]),
        "",
        "As a RecordForge schema (--schema):",
        "",
        spec_to_schema_yaml(result["feature_spec"]),
    ]
    for i, rec in enumerate(result["records"]):
        out.append(f"record {i}:")
        out.append(format_record(rec))
    return "\n".join(out)


def inspect(path: str, *, split: str | None = None, n: int = 5) -> dict[str, Any]:
    """A bundle's schema, counts per shard and first records; a plain file is `head`ed."""
    out = path.rstrip("/")
    if not exists(f"{out}/metadata.json"):
        if exists(out) and not out.endswith("/"):
            return {"kind": "file", **head(out, n)}
        raise FileNotFoundError(f"{out}: neither a RecordForge output folder nor a TFRecord file")
    meta = load_metadata(f"{out}/metadata.json")
    spec = load_feature_spec(f"{out}/feature_spec.json", sequence="sequence" in meta)
    if split:
        meta = {**meta, "shards": [s for s in meta["shards"] if s.get("split") == split]}
    records: list[dict[str, Any]] = []
    parse, message = (
        (_parse_sequence, "tf.train.SequenceExample")
        if "sequence" in meta
        else (parse_example, "tf.train.Example")
    )
    for shard in meta["shards"]:
        path = f"{out}/{shard['file']}"
        got = read_records(path, reading(meta))
        records += itertools.islice(
            parsed_records(path, got, reading(meta), parse=parse, message=message), n - len(records)
        )
        if len(records) >= n:
            break
    return {
        "kind": "bundle",
        "path": out,
        "metadata": meta,
        "feature_spec": spec,
        "published": exists(layout.join(out, layout.SUCCESS)),
        "records": records,
    }


def format_inspect(result: dict[str, Any]) -> str:
    if result["kind"] == "file":
        return format_head(result)
    # load_metadata checks their types where present; one the manifest lacks shows as "?".
    unknown = ["num_records", "rows_read", "rows_written", "rows_rejected"]
    unknown += ["schema_origin", "schema_fingerprint"]
    meta: dict[str, Any] = {**dict.fromkeys(unknown, "?"), **result["metadata"]}
    lines = [
        f"{result['path']}: {meta['num_records']} records in {len(meta['shards'])} shards "
        f"({meta['compression']}), {'published' if result['published'] else 'NOT published (no _SUCCESS)'}",
        f"  rows read {meta['rows_read']}, written {meta['rows_written']}, rejected "
        f"{meta['rows_rejected']}; schema {meta['schema_origin']} ({meta['schema_fingerprint'][:12]})",
        "",
        "Features:",
    ]
    spec = result["feature_spec"]
    sections = (
        [("", spec)]
        if "sequence" not in meta
        else [("context ", spec["context"]), ("steps ", spec["sequence"])]
    )
    for where, entries in sections:
        for name, e in entries.items():
            shape = f" shape {e['shape']}" if "shape" in e else ""
            extra = f" ({e['logical']})" if "logical" in e else ""
            lines.append(f"  {where}{name}: {e['kind']} {e['dtype']}{shape}{extra}")
    lines += ["", "Shards:"]
    for s in meta["shards"]:
        lines.append(f"  {s['file']}: {s['records']} records, {s['bytes']} bytes")
    for i, rec in enumerate(result["records"]):
        lines += ["", f"record {i}:", format_record(rec)]
    return "\n".join(lines)
