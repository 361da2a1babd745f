"""Every flag of `recordforge convert`, declared once (what is derived from it: docs/architecture.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from recordforge.records.shard_spec import DEFAULT_LEVEL, DEFAULT_SEED, DEFAULT_SHARD_SIZE, OUTPUT_FORMATS
from recordforge.records.tfrecord import Compression

__all__ = ["add_flags", "COMPRESSIONS", "default", "Flag", "FLAGS", "FORMATS", "parse_bool", "readme_table"]

FORMATS = ("parquet", "csv", "images", "jsonl", "orc", "arrow", "tfrecord", "array_record", "delta")
# TFRecord's (Compression.CHOICES) and zstd, which only ArrayRecord shards take.
COMPRESSIONS = (*Compression.CHOICES, "zstd")
_ANY = r"^\S+$"
_NUMBER = "^[0-9]+$"
_BOOL = "^(true|false)$"


def parse_bool(text: str) -> bool:
    """`--flag`, `--flag=true` and `--flag=false` all work (Flex Templates pass `--name=value`)."""
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")
    return lowered in ("true", "1", "yes")


@dataclass(frozen=True)
class Flag:
    """One flag. `changes_output` has no default on purpose: every flag must say whether it
    belongs in the `--if_changed` fingerprint (a flag that changes the bytes but is left out
    would let a changed run be skipped)."""

    name: str  # without the dashes; also the Flex Template's parameter name
    help: str  # `convert --help` and the template's helpText
    changes_output: bool
    label: str  # the template's label
    regex: str  # the template's validation
    summary: str  # the README's line (several flags of one `row` share it)
    type: Callable[[str], Any] = str
    default: Any = None
    choices: tuple[Any, ...] | None = None
    field: str = ""  # the ConvertConfig field; default: the name
    repeated: bool = False
    required: bool = False
    row: str = ""  # flags with the same row share one README line; default: the name
    metavar: str = ""  # how help and the README show the value

    @property
    def dest(self) -> str:
        return self.field or self.name

    @property
    def is_bool(self) -> bool:
        return self.type is parse_bool


def _bool_flag(
    name: str, help: str, *, changes_output: bool, label: str, summary: str, row: str = ""
) -> Flag:
    return Flag(
        name,
        help,
        changes_output,
        label,
        _BOOL,
        summary,
        type=parse_bool,
        default=False,
        row=row,
    )


FLAGS: tuple[Flag, ...] = (
    Flag(
        "source",
        "Input file pattern (local path or any Beam filesystem such as gs://); repeat the flag "
        "for several patterns. A pattern that matches nothing is an error before anything runs.",
        False,  # the inputs' paths, sizes and modification times are fingerprinted themselves
        "Input file pattern",
        _ANY,
        "input pattern, any Beam filesystem (`gs://bucket/data/*.parquet`); repeatable; one "
        "matching nothing is an error before anything runs",
        field="sources",
        repeated=True,
        required=True,
    ),
    Flag(
        "output",
        "Output folder for shards and bundle.",
        False,
        "Output folder",
        _ANY,
        "output folder; schema YAML or TFMD `schema.pbtxt` (default: inferred)",
        required=True,
        row="output",
    ),
    Flag(
        "schema",
        "Schema YAML file (or a TFMD schema.pbtxt); without it the schema is inferred from the "
        "first source file.",
        False,  # the schema's content is fingerprinted itself
        "Schema file (YAML or TFMD schema.pbtxt)",
        _ANY,
        "",
        field="schema_path",
        row="output",
    ),
    Flag(
        "format",
        "Source format; defaults from the file extension of the first match. images: --source "
        "is a folder (labels from folder names) or a CSV/Parquet manifest whose schema marks "
        "`type: image` columns. jsonl: JSON Lines (.jsonl, .json, .jsonl.gz); orc; arrow: Arrow "
        "IPC file or stream, Feather v2. tfrecord, array_record: tf.train.Examples (or an output "
        "folder as --source), the schema from their bundle, else --schema, else inferred. delta: "
        "--source is a Delta Lake table; one snapshot (--delta_version) is read.",
        True,
        "Source format",
        "^(parquet|csv|images|jsonl|orc|arrow|tfrecord|array_record|delta)$",
        "default: from the file extension",
        choices=FORMATS,
        field="source_format",
        row="format",
    ),
    Flag(
        "delta_version",
        "--format delta: the table version to convert (default: the latest). Its data files are "
        "the inputs (fingerprinted themselves); metadata.json records the version.",
        False,  # the snapshot's files are fingerprinted themselves
        "Delta table version",
        _NUMBER,
        "",
        type=int,
        row="format",
        metavar="N",
    ),
    Flag(
        "output_format",
        "Shard file format: tfrecord (default), array_record (random access: Grain, "
        "tfds.data_source, recordforge.data_source), or webdataset (tar shards for PyTorch).",
        True,
        "Shard file format",
        "^(tfrecord|array_record|webdataset)$",
        "`array_record` for random access (`recordforge.data_source`, Grain, TFDS), "
        "`webdataset` for PyTorch; see Output formats and random access",
        default=OUTPUT_FORMATS[0],
        choices=OUTPUT_FORMATS,
        row="output_format",
    ),
    _bool_flag(
        "record_index",
        "Write a record index (one `offset size` line per record, as DALI and the tfrecord "
        "package read) beside each TFRecord shard; implies uncompressed shards.",
        changes_output=True,
        label="Record index per TFRecord shard",
        summary="",
        row="output_format",
    ),
    Flag(
        "compression",
        "Compression of the shards: TFRecord gzip by default, none when the schema holds images "
        "(encoded images gain ~3% from GZIP at 8-9x the CPU) or with --record_index; "
        "ArrayRecord none by default, or zstd.",
        True,
        "Shard compression",
        "^(gzip|zlib|none|zstd)$",
        "default gzip (none when the schema holds images; zlib shards are `.deflate`, which "
        "Beam and TFDV detect, tf.data reads as `ZLIB`; ArrayRecord: none or zstd); ISA-L level, default 1",
        choices=COMPRESSIONS,
        row="compression",
    ),
    Flag(
        "compression_level",
        f"ISA-L deflate level 0-3 (default {DEFAULT_LEVEL}).",
        True,
        "Deflate level",
        "^[0-3]$",
        "",
        type=int,
        default=DEFAULT_LEVEL,
        choices=(0, 1, 2, 3),
        row="compression",
        metavar="0-3",
    ),
    Flag(
        "shard_size",
        f"Target compressed bytes per shard, e.g. 128MB (default {DEFAULT_SHARD_SIZE >> 20}MiB): "
        "every shard but one per split is within 25% of it, however the runner splits the work. "
        "With --deterministic or --shuffle: one shard per this much input.",
        True,
        "Target shard size",
        r"^[0-9]+(\.[0-9]+)?\s*([KMG]i?B|B)?$",
        "shards of this compressed size (default 128MiB; all but one per split within 25%); "
        "exactly K records per shard (but one); or exactly N shards",
        row="shards",
        metavar="128MB",
    ),
    Flag(
        "records_per_shard",
        "Exactly this many records in every shard but one per split, however many workers "
        "write them (unless a shard reaches --shard_size first); 0 (default): no limit.",
        True,
        "Records per shard",
        _NUMBER,
        "",
        type=int,
        default=0,
        row="shards",
        metavar="K",
    ),
    Flag(
        "num_shards",
        "Exactly this many shards per split; 0 (default): as many as --shard_size makes.",
        True,
        "Number of shards",
        _NUMBER,
        "",
        type=int,
        default=0,
        row="shards",
        metavar="N",
    ),
    Flag(
        "batch_size",
        "Rows per Arrow record batch moved between pipeline steps (default 16384); also the "
        "piece of a Parquet row group that local workers hand over to one another.",
        True,
        "Rows per batch",
        "^[1-9][0-9]*$",
        "rows per Arrow record batch (default 16,384);",
        type=int,
        default=16384,
    ),
    Flag(
        "profile",
        "Write a timeline of the run to this path (Chrome trace-event JSON; open it in "
        "ui.perfetto.dev): the spans of each stage per worker and thread, and print where the "
        "time went. Local runs only (workers are forked from this process).",
        False,
        "Timeline of the run",
        _ANY,
        "`--profile`: a timeline of the run (Chrome trace JSON, for Perfetto) and where the time went",
        default=None,
        row="batch_size",
        metavar="PATH",
    ),
    _bool_flag(
        "deterministic",
        "Byte-identical output for the same input and config on any runner and worker count: "
        "exactly --num_shards shards (default: one per --shard_size of input), each a contiguous "
        "run of the input in order, written in parallel.",
        changes_output=True,
        label="Deterministic output",
        summary="byte-identical output on any runner and worker count: `--num_shards` shards "
        "(default one per `--shard_size` of input), each a contiguous run of the input; with "
        "`--shuffle`, the records in a permutation drawn from `--seed` (default 42, "
        "`shuffle_seed` in `metadata.json`), across and within shards, each split apart",
        row="deterministic",
    ),
    _bool_flag(
        "shuffle",
        "Write the records in a random order drawn from --seed, across and within shards: "
        "exactly --num_shards shards (default: one per --shard_size of input), each split "
        "shuffled apart. Deterministic like --deterministic (implied; both may be given).",
        changes_output=True,
        label="Shuffle the records",
        summary="",
        row="deterministic",
    ),
    Flag(
        "seed",
        f"Seed of --shuffle (default {DEFAULT_SEED}), recorded in metadata.json.",
        True,
        "Shuffle seed",
        "^-?[0-9]+$",
        "",
        type=int,
        default=DEFAULT_SEED,
        row="deterministic",
        metavar="S",
    ),
    Flag(
        "max_rejected",
        "Bad rows allowed into the output's _rejected/ folder before the job fails; 0 (default): "
        "the first bad row fails the job, naming file, row, column, value and rule.",
        True,
        "Bad rows allowed",
        _NUMBER,
        "see Bad rows",
        type=int,
        default=0,
        row="rejected",
        metavar="N",
    ),
    Flag(
        "max_rejected_fraction",
        "Bad rows allowed as a fraction of rows read (the larger bound applies).",
        True,
        "Bad rows allowed, as a fraction",
        r"^(0(\.[0-9]+)?|1(\.0+)?)$",
        "",
        type=float,
        default=0.0,
        row="rejected",
        metavar="F",
    ),
    Flag(
        "max_record_bytes",
        "A record encoded larger is a bad row (rule record_size), rejected like any other (after "
        "transforms: the run fails, docs/preprocessing.md); default 64 MiB, under what TensorFlow's "
        "readers and protobuf parse reliably; 0: no limit.",
        True,
        "Largest record, in bytes",
        _NUMBER,
        "",
        type=int,
        default=64 << 20,
        row="rejected",
        metavar="BYTES",
    ),
    _bool_flag(
        "skip_unreadable_files",
        "List unreadable input files in metadata.json instead of failing the job.",
        changes_output=True,
        label="Skip unreadable files",
        summary="",
        row="rejected",
    ),
    Flag(
        "splits",
        "Named splits with weights, e.g. train=8,eval=1,test=1: each split gets its own folder "
        "{output}/{split}/ of {split}-SSSSS-of-NNNNN shards. With --split_column, the names "
        "alone: train,eval,test.",
        True,
        "Splits and weights",
        r"^[A-Za-z0-9_\-]+(=[0-9]+)?(,[A-Za-z0-9_\-]+(=[0-9]+)?)*$",
        "see Splits",
        row="splits",
    ),
    Flag(
        "split_key",
        "Feature whose value decides a row's split (a salted stable hash); default: the whole record.",
        True,
        "Split key feature",
        _ANY,
        "",
        row="splits",
    ),
    Flag(
        "split_column",
        "Source column whose values are the split names (instead of hashing).",
        True,
        "Split name column",
        r"^.+$",
        "",
        row="splits",
    ),
    Flag(
        "split_salt",
        "Salt of the split hash, recorded in metadata.json.",
        True,
        "Split hash salt",
        r"^.*$",
        "",
        default="recordforge",
        row="splits",
    ),
    Flag(
        "preprocessing_fn",
        "A tensorflow-transform preprocessing_fn, as path/to/module.py:function or "
        "package.module:function. The records then hold what it returns plus the outputs of "
        "the schema's `transform:` entries.",
        True,
        "tensorflow-transform preprocessing_fn (module.py:function)",
        r"^\S+:\w+$",
        "see tensorflow-transform",
        row="tft",
    ),
    Flag(
        "analyze_split",
        "With --splits: the split analyzers are fitted on (default: train).",
        True,
        "Split the analyzers are fitted on",
        r"^[A-Za-z0-9_\-]+$",
        "",
        row="tft",
    ),
    Flag(
        "span",
        "For patterns (and --output) with {YYYY}, {MM}, {DD} or {SPAN}: latest (default when "
        "tokens are present), a date YYYY-MM-DD, or a span number.",
        False,  # it picks the inputs, which are fingerprinted themselves
        "Span: latest, YYYY-MM-DD or a number",
        r"^(latest|\d{4}-\d{2}-\d{2}|\d+)$",
        "for patterns (and `--output`) with `{YYYY}`, `{MM}`, `{DD}`, `{SPAN}`: `latest`, a "
        "date or a span number",
    ),
    _bool_flag(
        "if_changed",
        "Skip the run when the published output was built from the same inputs (paths, sizes, "
        "modification times), schema and settings; rebuild it otherwise.",
        changes_output=False,
        label="Skip when unchanged",
        summary="skip the run when the published output was built from the same inputs, schema and settings",
    ),
    _bool_flag(
        "append",
        "Publish a new version that keeps the published shards where they are and adds shards "
        "converted from the files the patterns now match and the published build did not read; "
        "the files it read must be unchanged, the schema and settings the same.",
        changes_output=False,  # it chooses what is converted, not what a record holds
        label="Append new input files",
        summary="add the files the patterns now match to the published dataset, its shards kept "
        "as they are; a rerun resumes what a killed run finished (`--resume=false`: start clean); "
        "see Long builds and daily data",
        row="grow",
    ),
    Flag(
        "resume",
        "Rerunning the same command after a killed or failed run keeps the pieces that run "
        "finished (each checked against its sha256 and its input) and converts only the rest; "
        "--resume=false discards them and starts clean.",
        False,  # the pieces kept are the bytes a clean run would write
        "Resume an interrupted run",
        _BOOL,
        "",
        type=parse_bool,
        default=True,
        row="grow",
    ),
    _bool_flag(
        "overwrite",
        "Replace a dataset already published at --output.",
        changes_output=False,
        label="Replace existing output",
        summary="replace a dataset already published at `--output`",
    ),
)

_BY_DEST = {f.dest: f for f in FLAGS}


def default(dest: str) -> Any:
    """The default of the flag that fills ConvertConfig's field `dest`."""
    return _BY_DEST[dest].default


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Declares every flag on `parser`, as argparse flags named `--{name}`."""
    for f in FLAGS:
        # argparse formats help with %-interpolation, so a literal % is doubled.
        kwargs: dict[str, Any] = {"dest": f.name, "help": f.help.replace("%", "%%"), "default": f.default}
        if f.repeated:
            kwargs["action"] = "append"
        elif f.is_bool:
            kwargs.update(type=parse_bool, nargs="?", const=True)
        else:
            kwargs.update(type=f.type, choices=f.choices, metavar=f.metavar or None)
        parser.add_argument(f"--{f.name}", **kwargs)


def readme_table() -> str:
    """The README's flag table: one line per `row`, in the table's order."""
    rows: dict[str, list[Flag]] = {}
    for f in FLAGS:
        rows.setdefault(f.row or f.name, []).append(f)
    lines = ["| flag | meaning |", "|---|---|"]
    for group in rows.values():
        names = ", ".join(_readme_name(f) for f in group)
        lines.append(f"| {names} | {' '.join(f.summary for f in group if f.summary)} |")
    return "\n".join(lines) + "\n"


def _readme_name(f: Flag) -> str:
    if f.metavar:
        return f"`--{f.name} {f.metavar}`"
    if f.choices:
        return f"`--{f.name} {'|'.join(map(str, f.choices))}`".replace("|", "\\|")
    return f"`--{f.name}`"


if __name__ == "__main__":
    sys.stdout.write(readme_table())
