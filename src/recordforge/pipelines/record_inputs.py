"""TFRecord and ArrayRecord inputs: their files (a bundle's shards) and the schema of their Examples."""

from __future__ import annotations

import json
import logging
import posixpath
from typing import Any

from recordforge.errors import RecordForgeError, SchemaError
from recordforge.files import layout
from recordforge.files.storage import exists, open_read
from recordforge.pipelines.config import ConvertConfig
from recordforge.records.array_records import ARRAY_RECORD
from recordforge.records.example_pb import parse_example
from recordforge.records.record_pieces import FORMATS, CorruptRecords, Piece, read_piece
from recordforge.records.tfrecord import detect_compression
from recordforge.schemas import Plan, Schema, compile_schema, load_schema
from recordforge.schemas.feature_specs import schema_from_feature_spec
from recordforge.schemas.loader import dump_schema
from recordforge.schemas.tfmd import schema_from_tfmd_text
from recordforge.tools.records import infer_feature_spec
from recordforge.transforms.source_types import FileInfo, expand_patterns

__all__ = ["FORMATS", "SAMPLE_RECORDS", "is_records", "record_inputs"]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the messages users know

SAMPLE_RECORDS = 1000  # records of the first file a schema is inferred from
_SUFFIXES = (".tfrecord", ".tfrecords", ".tfrecord.gz", ".tfrecord.deflate", ".tfrecords.gz", ".array_record")


def is_records(source: str) -> bool:
    """Whether a --source names TFRecord/ArrayRecord files by their suffix, or is an output folder."""
    name = source.rstrip("/").lower()
    return name.endswith(_SUFFIXES) or _is_bundle(source)


def _is_bundle(path: str) -> bool:
    return not any(c in path for c in "*?[") and exists(f"{path.rstrip('/')}/{layout.METADATA}")


def record_inputs(config: ConvertConfig) -> tuple[list[FileInfo], str, Plan]:
    """The files (an output folder stands for its published shards), their format and the plan of
    their Examples: --schema, else the schema of the bundle they belong to (its schema.yaml,
    schema.pbtxt or feature_spec.json), else inferred from the first file's first records."""
    source = config.sources[0]
    bundle: str | None = None
    if _is_bundle(source):
        if len(config.sources) > 1:
            raise RecordForgeError("an output folder given as --source must be the only --source")
        files, fmt, bundle = _bundle_shards(source.rstrip("/"))
    else:
        files = expand_patterns(config.sources)
        fmt = config.source_format or _format_of(files[0].path)
        for parent in (posixpath.dirname(files[0].path), posixpath.dirname(posixpath.dirname(files[0].path))):
            if exists(f"{parent}/{layout.SCHEMA_YAML}") or exists(f"{parent}/{layout.FEATURE_SPEC}"):
                bundle = parent
                break
    found = load_schema(config.schema_path) if config.schema_path else None
    if found is None and bundle is not None:
        found = _bundle_schema(bundle)
    schema = found if found is not None else _sampled_schema(files[0].path)
    if schema.sequence is not None:
        raise SchemaError(
            f"{schema.origin}: the records are SequenceExamples; converting SequenceExamples is not supported"
        )
    return files, fmt, compile_schema(schema)


def _format_of(path: str) -> str:
    return ARRAY_RECORD if detect_compression(path) == ARRAY_RECORD else "tfrecord"


def _bundle_shards(out: str) -> tuple[list[FileInfo], str, str]:
    """The published shards of an output folder, their format and the version's folder."""
    if not exists(f"{out}/{layout.SUCCESS}"):
        raise RecordForgeError(f"{out}: no {layout.SUCCESS} marker; the dataset is missing or incomplete")
    with open_read(f"{out}/{layout.METADATA}") as f:
        meta = json.loads(f.read())
    fmt = meta.get("format", "tfrecord")
    if not meta.get("shards"):
        raise RecordForgeError(f"{out}: the bundle holds no shards")
    if fmt not in FORMATS:
        raise RecordForgeError(f"{out}: its shards are {fmt}; only TFRecord and ArrayRecord bundles are read")
    root = layout.version_root(out, meta["version"]) if meta.get("version") else out
    files = expand_patterns([f"{out}/{s['file']}" for s in meta["shards"]])
    return files, fmt, root


def _bundle_schema(root: str) -> Schema | None:
    """The schema a bundle records: schema.yaml (exact), else schema.pbtxt, else feature_spec.json.
    A schema.yaml whose features are transformed (tensorflow-transform) does not describe the
    records: the feature spec does."""
    yaml_path = f"{root}/{layout.SCHEMA_YAML}"
    if exists(yaml_path):
        schema = load_schema(yaml_path)
        if not schema.has_transforms:
            _LOGGER.info("Schema of the input records: %s", yaml_path)
            return schema
    spec_path = f"{root}/{layout.FEATURE_SPEC}"
    if exists(spec_path):
        with open_read(spec_path) as f:
            spec = json.loads(f.read())
        _LOGGER.info("Schema of the input records: from %s", spec_path)
        return schema_from_feature_spec(spec, origin=spec_path)
    pbtxt = f"{root}/{layout.SCHEMA_PBTXT}"
    if exists(pbtxt):
        with open_read(pbtxt) as f:
            return schema_from_tfmd_text(f.read().decode(), origin=pbtxt)
    return None


def _sampled_schema(path: str) -> Schema:
    """A schema inferred from the first SAMPLE_RECORDS records of a file, as `recordforge head` does."""
    records: list[dict[str, Any]] = []
    try:
        for span in read_piece(Piece(path), max_records=SAMPLE_RECORDS):
            for a, b in zip(span.starts.tolist(), span.ends.tolist(), strict=True):
                try:
                    records.append(parse_example(bytes(span.data[a:b])))
                except Exception as exn:  # protobuf's DecodeError and friends
                    number = span.first + len(records) + 1
                    raise RecordForgeError(
                        f"{path}: record {number} is not a tf.train.Example ({exn})"
                    ) from exn
                if len(records) >= SAMPLE_RECORDS:
                    break
            if len(records) >= SAMPLE_RECORDS:
                break
    except CorruptRecords:
        if not records:
            raise
        # The reader fails on that record, or skips the rest of the file, as the run is told.
    if not records:
        raise SchemaError(f"{path}: no records to infer a schema from; pass --schema")
    _, spec = infer_feature_spec(records)
    schema = schema_from_feature_spec(spec, origin=path)
    _LOGGER.info(
        "No --schema given and no bundle schema beside the records: inferred from %d records of %s "
        "(written to the bundle as schema.yaml; pass it with --schema to pin it):\n%s",
        len(records),
        path,
        dump_schema(schema),
    )
    return schema
