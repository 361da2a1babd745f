"""Croissant metadata for a bundle: `croissant.json` (MLCommons Croissant 1.0, JSON-LD)."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from recordforge.schemas.kinds import DType, NullPolicy
from recordforge.schemas.model import Feature
from recordforge.schemas.plan import Plan

__all__ = ["CONFORMS_TO", "croissant_json", "croissant_metadata", "split_regex"]

CONFORMS_TO = "http://mlcommons.org/croissant/1.0"
TFRECORD_MIME = "application/x-tfrecord"  # no registered type; the one in common use
ARRAY_RECORD_MIME = "application/x-array-record"  # no registered type either
WEBDATASET_MIME = "application/x-tar"
# The recommended 1.0 context (as mlcroissant writes it), plus the two array terms.
_CONTEXT: dict[str, Any] = {
    "@language": "en",
    "@vocab": "https://schema.org/",
    "arrayShape": "cr:arrayShape",
    "citeAs": "cr:citeAs",
    "column": "cr:column",
    "conformsTo": "dct:conformsTo",
    "cr": "http://mlcommons.org/croissant/",
    "rai": "http://mlcommons.org/croissant/RAI/",
    "data": {"@id": "cr:data", "@type": "@json"},
    "dataType": {"@id": "cr:dataType", "@type": "@vocab"},
    "dct": "http://purl.org/dc/terms/",
    "equivalentProperty": "cr:equivalentProperty",
    "examples": {"@id": "cr:examples", "@type": "@json"},
    "extract": "cr:extract",
    "field": "cr:field",
    "fileProperty": "cr:fileProperty",
    "fileObject": "cr:fileObject",
    "fileSet": "cr:fileSet",
    "format": "cr:format",
    "includes": "cr:includes",
    "isArray": "cr:isArray",
    "isLiveDataset": "cr:isLiveDataset",
    "jsonPath": "cr:jsonPath",
    "key": "cr:key",
    "md5": "cr:md5",
    "parentField": "cr:parentField",
    "path": "cr:path",
    "recordSet": "cr:recordSet",
    "references": "cr:references",
    "regex": "cr:regex",
    "repeated": "cr:repeated",
    "replace": "cr:replace",
    "samplingRate": "cr:samplingRate",
    "sc": "https://schema.org/",
    "separator": "cr:separator",
    "source": "cr:source",
    "subField": "cr:subField",
    "transform": "cr:transform",
}
_KNOWN_SPLITS = {
    "train": "cr:TrainingSplit",
    "training": "cr:TrainingSplit",
    "validation": "cr:ValidationSplit",
    "valid": "cr:ValidationSplit",
    "val": "cr:ValidationSplit",
    "eval": "cr:ValidationSplit",
    "dev": "cr:ValidationSplit",
    "test": "cr:TestSplit",
    "testing": "cr:TestSplit",
}
_TYPES = {"int64": "cr:Int64", "float32": "cr:Float32", "string": "sc:Text"}
_SHARDS = "shards"  # the FileSet of every shard
_RECORDS = "records"
_SPLITS = "splits"


def split_regex(split_names: Sequence[str]) -> str:
    """Takes a shard's split (its folder in the version) from the shard's path."""
    names = "|".join(re.escape(n) for n in split_names)
    return rf"^(?:.*/)?({names})/[^/]+$"


def _dims(dims: Sequence[int]) -> dict[str, Any]:
    if not dims:
        return {}
    return {"repeated": True, "isArray": True, "arrayShape": ",".join(str(d) for d in dims)}


def _field_type(
    name: str, entry: dict[str, Any], feature: Feature | None
) -> tuple[str, list[int], list[str]]:
    """(dataType, shape when present, notes) of one feature_spec.json entry."""
    notes = []
    may_be_absent = entry["kind"] == "VarLenFeature" or (
        entry["kind"] == "RaggedFeature" and feature is not None and feature.nulls is NullPolicy.ABSENT
    )
    if may_be_absent and not (feature is not None and feature.is_variable):
        notes.append("absent from records where the source was null")
    if "logical" in entry:
        notes.append(entry["logical"])
    if "image" in entry:
        decode = entry.get("decode")
        if entry["image"]["encoding"] == "raw":
            notes.append("raw uint8 pixels, row-major, in one bytes value")
            return "cr:UInt8", list(decode["shape"]) if decode else [-1], notes
        notes.append(f"the encoded image ({entry['image']['encoding']} bytes)")
        return "sc:ImageObject", [], notes
    if "decode" in entry:
        notes.append("float64 as little-endian bytes (8 per value) in one bytes value")
        return "cr:Float64", list(entry["decode"]["shape"]), notes
    dtype = entry["dtype"]
    if entry["kind"] == "RaggedFeature":
        notes.append(f"ragged: flat values under {name}, row lengths under {name}.row_lengths")
        shape = [-1, -1]
    elif entry["kind"] == "FixedLenFeature":
        shape = list(entry["shape"])
    elif feature is not None:
        shape = list(feature.shape)
    else:
        shape = []  # only an image's header values have no feature of their own: one value each
    if feature is not None and feature.dtype is DType.BOOL and dtype == "int64":
        return "sc:Boolean", shape, notes
    image_format = feature is None and name.endswith("/format")  # an image's format name
    if dtype == "string" and not image_format and (feature is None or feature.dtype is DType.BYTES):
        notes.append("bytes, not necessarily UTF-8")
    return _TYPES[dtype], shape, notes


def _record_fields(plan: Plan, split_field: dict[str, Any] | None) -> list[dict[str, Any]]:
    by_name = {f.name: f for f in plan.features}
    fields = []
    for name, entry in sorted(plan.feature_spec.items()):
        feature = by_name.get(name)
        data_type, shape, notes = _field_type(name, entry, feature)
        if feature is not None and feature.description:
            notes.insert(0, feature.description)
        field: dict[str, Any] = {
            "@type": "cr:Field",
            "@id": f"{_RECORDS}/{name}",
            "name": name,
            "dataType": data_type,
            **_dims(shape),
            "source": {"fileSet": {"@id": _SHARDS}, "extract": {"column": name}},
        }
        if notes:
            field["description"] = "; ".join(notes)
        fields.append(field)
    return fields if split_field is None else [*fields, split_field]


def _split_field(record_set: str, name: str, split_names: Sequence[str]) -> dict[str, Any]:
    return {
        "@type": "cr:Field",
        "@id": f"{record_set}/{name}",
        "name": name,
        "description": "the split: the folder of the shard in the version",
        "dataType": "sc:Text",
        "references": {"field": {"@id": f"{_SPLITS}/name"}},
        "source": {
            "fileSet": {"@id": _SHARDS},
            "extract": {"fileProperty": "fullpath"},
            "transform": {"regex": split_regex(split_names)},
        },
    }


def _splits_record_set(meta: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
    counts = meta.get("split_counts", {})
    urls = [_KNOWN_SPLITS.get(n.lower()) for n in names]
    fields = [{"@type": "cr:Field", "@id": f"{_SPLITS}/name", "name": "name", "dataType": "sc:Text"}]
    if all(urls):  # the split's meaning, when every name says it plainly
        fields.append({"@type": "cr:Field", "@id": f"{_SPLITS}/url", "name": "url", "dataType": "sc:URL"})
    return {
        "@type": "cr:RecordSet",
        "@id": _SPLITS,
        "name": _SPLITS,
        "description": "records per split: "
        + ", ".join(f"{n} {counts.get(n, {}).get('records', 0)}" for n in names),
        "dataType": "cr:Split",
        "key": {"@id": f"{_SPLITS}/name"},
        "field": fields,
        "data": [
            {f"{_SPLITS}/name": n, **({f"{_SPLITS}/url": u} if all(urls) else {})}
            for n, u in zip(names, urls, strict=True)
        ],
    }


def croissant_metadata(plan: Plan, meta: Mapping[str, Any], *, output: str) -> dict[str, Any]:
    """croissant.json's content for a bundle, given its metadata.json."""
    version = meta["version"]
    weights = meta.get("split_weights")
    split_names = list(weights) if weights else []
    compression = meta["compression"]
    suffix = meta["shards"][0]["file"].rsplit("/", 1)[-1].split(".", 1)[1] if meta["shards"] else "tfrecord"
    mime = TFRECORD_MIME
    if meta.get("format") == "webdataset":
        mime = WEBDATASET_MIME
        reading = "WebDataset tar files, one sample per record (docs/webdataset.md), each a"
    elif meta.get("format") == "array_record":
        mime = ARRAY_RECORD_MIME
        reading = f"ArrayRecord files (writer options {meta['array_record_options']})"
    elif compression == "none":
        reading = "uncompressed TFRecords"
    else:
        reading = (
            f"{compression}-compressed TFRecords (tf.data compression_type {meta['tf_compression_type']})"
        )
    distribution: list[dict[str, Any]] = [
        {
            "@type": "cr:FileObject",
            "@id": s["file"],
            "name": s["file"],
            "description": f"{s['records']} records" + (f", split {s['split']}" if "split" in s else ""),
            "contentUrl": s["file"],
            "contentSize": f"{s['bytes']} B",
            "encodingFormat": mime,
            "sha256": s["sha256"],
        }
        for s in meta["shards"]
    ]
    distribution.append(
        {
            "@type": "cr:FileSet",
            "@id": _SHARDS,
            "name": _SHARDS,
            "description": f"every shard: {reading} of tf.train.Example",
            "encodingFormat": mime,
            "includes": f"{version}/*/*.{suffix}" if split_names else f"{version}/*.{suffix}",
        }
    )
    taken = set(plan.feature_spec)
    split_name = next(n for n in ("split", "shard_split", "recordforge_split") if n not in taken)
    records = {
        "@type": "cr:RecordSet",
        "@id": _RECORDS,
        "name": _RECORDS,
        "description": f"{meta['num_records']} tf.train.Example records; each field is one "
        "feature key (feature_spec.json says how to parse it)",
        "field": _record_fields(
            plan, _split_field(_RECORDS, split_name, split_names) if split_names else None
        ),
    }
    record_sets = [*([_splits_record_set(meta, split_names)] if split_names else []), records]
    base = output.rstrip("/").rsplit("/", 1)[-1]
    return {
        "@context": _CONTEXT,
        "@type": "sc:Dataset",
        "conformsTo": CONFORMS_TO,
        "name": base or "dataset",
        "description": f"{meta['num_records']} records in {len(meta['shards'])} shards of {reading}, "
        f"written by RecordForge {meta['recordforge_version']} (version {version})",
        "datePublished": meta["created"],
        "distribution": distribution,
        "recordSet": record_sets,
    }


def croissant_json(plan: Plan, meta: Mapping[str, Any], *, output: str) -> bytes:
    return json.dumps(croissant_metadata(plan, meta, output=output), indent=2).encode()
