"""Inputs resolved at construction: files matched, their format, the declared or inferred schema
compiled to a plan, an image folder's listing, and the fingerprint --if_changed compares."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from recordforge.errors import RecordForgeError
from recordforge.files.storage import is_local, open_input
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.delta_inputs import delta_inputs
from recordforge.pipelines.record_inputs import FORMATS as RECORD_FORMATS
from recordforge.pipelines.record_inputs import is_records, record_inputs
from recordforge.schemas import Plan, compile_schema, load_schema
from recordforge.schemas.infer import inferred_schema
from recordforge.schemas.loader import dump_schema
from recordforge.sources.delta import Snapshot
from recordforge.sources.probe import format_from_path, parquet_footers, read_arrow_schema
from recordforge.transforms.image_folder import ImageFolder, folder_schema, list_image_folder
from recordforge.transforms.source_types import FileInfo, expand_patterns

__all__ = [
    "Inputs",
    "detect_format",
    "inferred_schema",
    "input_fingerprint",
    "resolve_inputs",
    "resolve_plan",
]

_LOGGER = logging.getLogger("recordforge.pipelines.convert")  # the messages users know


@dataclasses.dataclass(frozen=True)
class Inputs:
    """The inputs as resolved at construction: files, format, plan, an image folder, and the
    fingerprint of inputs, schema and output-changing flags (--if_changed compares it)."""

    files: list[FileInfo]
    fmt: str
    plan: Plan
    fingerprint: str
    folder: ImageFolder | None = None
    rows: int | None = None  # from the Parquet footers, where they were read (progress total)
    json_types: pa.Schema | None = None  # JSON Lines: the types lines are parsed with (the first file's)
    delta: Snapshot | None = None  # --format delta: the table's snapshot read (sources/delta.py)


def resolve_inputs(config: ConvertConfig, *, first_rows: bool = False) -> Inputs:
    """Expands the patterns (no match is an error) and compiles the declared or inferred schema.
    An inferred CSV schema takes its types from every row of the first file, or with
    `first_rows` from its first block, to be checked as the run converts (Plan.retype_file)."""
    if config.source_format == "images" and format_from_path(config.sources[0]) is None:
        # A folder of images: labels from folder names.
        folder = list_image_folder(config.sources[0])
        plan = compile_schema(
            load_schema(config.schema_path) if config.schema_path else folder_schema(folder)
        )
        # The folder stands as one input: its names' digest, its size where the listing gave it.
        size = sum(folder.sizes) if folder.sizes is not None else None
        info = FileInfo(folder.root, size, folder.modified, digest=folder.digest)
        return Inputs([info], "images", plan, input_fingerprint([info], plan, config), folder)
    given = config.source_format
    if given == "delta":  # one snapshot of a Delta table: its Parquet files
        files, plan, snap = delta_inputs(config)
        return Inputs(files, "delta", plan, input_fingerprint(files, plan, config), delta=snap)
    if given in RECORD_FORMATS or (given is None and is_records(config.sources[0])):
        files, fmt, plan = record_inputs(config)  # Examples: the schema of their bundle, or inferred
        return Inputs(files, fmt, plan, input_fingerprint(files, plan, config))
    files = expand_patterns(config.sources)
    fmt = detect_format(files[0].path) if config.source_format in (None, "images") else config.source_format
    paths = [f.path for f in files]
    # Each footer is read once here: for the schema inferred (columns without nulls) or, of local
    # files, for the progress line's total. Remote footers with a declared schema are left to the
    # workers, which read them anyway.
    footers = None
    if fmt == "parquet" and (not config.schema_path or all(is_local(p) for p in paths)):
        footers = parquet_footers(paths)
    plan = resolve_plan(config, fmt, files[0].path, paths, first_rows=first_rows, footers=footers)
    rows = sum(f.num_rows for f in footers.values()) if footers is not None else None
    json_types = read_arrow_schema(files[0].path, fmt) if fmt == "jsonl" else None
    return Inputs(files, fmt, plan, input_fingerprint(files, plan, config), rows=rows, json_types=json_types)


def input_fingerprint(files: list[FileInfo], plan: Plan, config: ConvertConfig) -> str:
    """Inputs (path, size, modification time), schema and settings: equal fingerprints mean the
    same output, so --if_changed can skip the run."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f"{f.path}\0{f.size}\0{f.modified}\n".encode())
        if f.digest:
            digest.update(f.digest.encode())
    digest.update(plan.fingerprint.encode())
    digest.update(json.dumps(config.settings(), sort_keys=True).encode())
    module = (config.preprocessing_fn or "").rpartition(":")[0]
    if module.endswith(".py"):  # the preprocessing code is an input too
        try:
            with open_input(module) as code:
                digest.update(code.read())
        except OSError as exn:
            raise RecordForgeError(f"--preprocessing_fn: cannot load {module}: {exn}") from exn
    return digest.hexdigest()


def detect_format(path: str) -> str:
    """A source file's format from its name."""
    fmt = format_from_path(path)
    if fmt is None:
        raise RecordForgeError(f"cannot tell the format of {path} from its name; pass --format")
    return fmt


def resolve_plan(
    config: ConvertConfig,
    fmt: str,
    first_file: str,
    files: list[str] | None = None,
    *,
    first_rows: bool = False,
    footers: Mapping[str, pq.FileMetaData] | None = None,
) -> Plan:
    """The declared schema, or one inferred from the input files (`inferred_schema`, logged as
    YAML); with `first_rows` a CSV file's types from its first block, to be checked as the run
    converts (Plan.retype_file)."""
    if config.schema_path:
        return compile_schema(load_schema(config.schema_path))
    schema, retype = inferred_schema(
        first_file, fmt, files or [first_file], first_rows=first_rows, footers=footers
    )
    _LOGGER.info(
        "No --schema given: inferred from %s (written to the bundle as schema.yaml; save it, edit "
        "it and pass it with --schema to pin it):\n%s",
        first_file,
        dump_schema(schema),
    )
    for note in schema.notes:
        _LOGGER.warning("inferred schema: %s", note)
    return dataclasses.replace(compile_schema(schema), retype_file=first_file if retype else None)
