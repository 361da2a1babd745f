"""The convert pipeline's flags, declared once; every other flag goes to Beam."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterator

from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from recordforge.errors import UsageError
from recordforge.tfrecord import Compression
from recordforge.transforms.shuffle import DEFAULT_SEED
from recordforge.transforms.sinks import DEFAULT_LEVEL, SINKS

__all__ = ["ConvertOptions", "FORMATS", "check_flags"]

FORMATS = ("parquet", "csv", "images")


def _bool(text: str) -> bool:
    """`--flag`, `--flag=true` and `--flag=false` all work (Flex Templates pass `--name=value`)."""
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")
    return lowered in ("true", "1", "yes")


class ConvertOptions(PipelineOptions):
    """Flags of `recordforge convert`; names here are also the Flex Template's parameter names."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--source",
            action="append",
            default=None,
            help="Input file pattern (local path or any Beam filesystem such as gs://); "
            "repeat the flag for several patterns.",
        )
        parser.add_argument("--output", default=None, help="Output folder for shards and bundle.")
        parser.add_argument(
            "--schema",
            default=None,
            help="Schema YAML file; without it the schema is inferred from the first source file.",
        )
        parser.add_argument(
            "--format",
            default=None,
            choices=FORMATS,
            help="Source format; defaults from the file extension of the first match. images: "
            "--source is a folder (labels from folder names) or a CSV/Parquet manifest whose "
            "schema marks `type: image` columns.",
        )
        parser.add_argument(
            "--compression",
            default=None,
            choices=Compression.CHOICES,
            help="Compression of the TFRecord shards: gzip by default, none when the schema holds "
            "images (encoded images gain ~3%% from GZIP at 8-9x the CPU).",
        )
        parser.add_argument(
            "--num_shards",
            type=int,
            default=0,
            help="Number of output shards; 0 (default) lets the runner decide.",
        )
        parser.add_argument(
            "--shard_size",
            default=None,
            help="Target compressed bytes per shard, e.g. 128MB (the default when --num_shards "
            "is 0): every shard but one per split is within 25%% of it, however the runner "
            "splits the work. With --deterministic: one shard per this much input.",
        )
        parser.add_argument(
            "--records_per_shard",
            type=int,
            default=0,
            help="At most this many records per shard (exact); 0: no limit.",
        )
        parser.add_argument(
            "--compression_level",
            type=int,
            default=DEFAULT_LEVEL,
            choices=range(4),
            help=f"ISA-L deflate level 0-3 for the fast sink (default {DEFAULT_LEVEL}).",
        )
        parser.add_argument(
            "--sink",
            default="fast",
            choices=SINKS,
            help="fast: batches through Beam's file-based sink, vectorised framing, ISA-L "
            "deflate (default); beam: beam.io.WriteToTFRecord, one element per record.",
        )
        parser.add_argument(
            "--batch_size",
            type=int,
            default=16384,
            help="Rows per Arrow record batch moved between pipeline steps (Parquet); also the "
            "piece of a row group that local workers hand over to one another.",
        )
        parser.add_argument(
            "--deterministic",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="Byte-identical output for the same input and config on any runner: exactly "
            "--num_shards shards (default: one per --shard_size of input), each a contiguous "
            "run of the input in order, written in parallel.",
        )
        parser.add_argument(
            "--shuffle",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="Write the records in a random order drawn from --seed, across and within shards: "
            "exactly --num_shards shards (default: one per --shard_size of input), each split "
            "shuffled apart. Deterministic like --deterministic (implied; both may be given).",
        )
        parser.add_argument(
            "--seed",
            type=int,
            default=DEFAULT_SEED,
            help=f"Seed of --shuffle (default {DEFAULT_SEED}), recorded in metadata.json.",
        )
        parser.add_argument(
            "--max_rejected",
            type=int,
            default=0,
            help="Bad rows allowed into {output}/_rejected/ before the job fails; 0 (default): "
            "the first bad row fails the job, naming file, row, column, value and rule.",
        )
        parser.add_argument(
            "--max_rejected_fraction",
            type=float,
            default=0.0,
            help="Bad rows allowed as a fraction of rows read (the larger bound applies).",
        )
        parser.add_argument(
            "--skip_unreadable_files",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="List unreadable input files in metadata.json instead of failing the job.",
        )
        parser.add_argument(
            "--splits",
            default=None,
            help="Named splits with weights, e.g. train=8,eval=1,test=1: each split gets its own "
            "folder {output}/{split}/ of {split}-SSSSS-of-NNNNN shards. With --split_column, the "
            "names alone: train,eval,test.",
        )
        parser.add_argument(
            "--split_key",
            default=None,
            help="Feature whose value decides a row's split (a salted stable hash); default: the "
            "whole record.",
        )
        parser.add_argument(
            "--split_column",
            default=None,
            help="Source column whose values are the split names (instead of hashing).",
        )
        parser.add_argument(
            "--split_salt",
            default="recordforge",
            help="Salt of the split hash, recorded in metadata.json.",
        )
        parser.add_argument(
            "--preprocessing_fn",
            default=None,
            help="A tensorflow-transform preprocessing_fn, as path/to/module.py:function or "
            "package.module:function. The records then hold what it returns plus the outputs of "
            "the schema's `transform:` entries.",
        )
        parser.add_argument(
            "--analyze_split",
            default=None,
            help="With --splits: the split analyzers are fitted on (default: train).",
        )
        parser.add_argument(
            "--span",
            default=None,
            help="For patterns (and --output) with {YYYY}, {MM}, {DD} or {SPAN}: latest (default "
            "when tokens are present), a date YYYY-MM-DD, or a span number.",
        )
        parser.add_argument(
            "--if_changed",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="Skip the run when the published output was built from the same inputs (paths, "
            "sizes, modification times), schema and settings; rebuild it otherwise.",
        )
        parser.add_argument(
            "--overwrite",
            type=_bool,
            nargs="?",
            const=True,
            default=False,
            help="Replace a dataset already published at --output.",
        )


class _CheckingParser(_BeamArgumentParser):
    """Beam's parser (it knows `add_value_provider_argument`), raising instead of exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _option_classes(cls: type[PipelineOptions] = PipelineOptions) -> Iterator[type[PipelineOptions]]:
    """Every PipelineOptions subclass imported so far, at any depth: what Beam itself would parse."""
    for sub in cls.__subclasses__():
        yield sub
        yield from _option_classes(sub)


def _parser() -> _CheckingParser:
    parser = _CheckingParser(prog="recordforge convert", add_help=False, allow_abbrev=False)
    # The same class can be defined twice (a module run as __main__ and imported); one per name.
    classes = {f"{c.__module__}.{c.__qualname__}": c for c in _option_classes()}
    for cls in classes.values():
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:
            # A user-defined options class re-declaring a flag Beam declares: Beam's own parse
            # would fail on it the same way, later; its flags are not ours to check.
            continue
    return parser


def _load_dask_options() -> None:
    """Beam declares its Dask flags (--dask_client_address, ...) only once its Dask runner module
    is imported; RecordForge's runner imports it."""
    try:
        import recordforge.pipelines.dask_runner  # noqa: F401
    except ImportError as exn:
        raise UsageError(
            f"the Dask runner needs dask[distributed] ({exn}): pip install 'recordforge[dask]'"
        ) from exn


def check_flags(argv: list[str]) -> None:
    """Raises UsageError for a flag that neither RecordForge nor Beam knows (with the nearest
    known name), a value a flag does not accept, or a stray argument (a shell-expanded glob).

    Beam only warns about unknown flags and drops them, so a typo such as `--num-shards 2` would
    otherwise convert with the default and exit 0. Pure: calling it twice is harmless.
    """
    if any("dask" in a.lower() for a in argv):
        _load_dask_options()
    parser = _parser()
    _, unknown = parser.parse_known_args(list(argv))
    if not unknown:
        return
    known = sorted({s for action in parser._actions for s in action.option_strings if s.startswith("--")})
    first = unknown[0]
    if first.startswith("-") and first != "-":
        name = first.split("=", 1)[0]
        # Beam's flags use underscores; a dashed spelling is the most common slip.
        guesses = difflib.get_close_matches(name.replace("-", "_").replace("__", "--", 1), known, n=1)
        hint = f"; did you mean {guesses[0]}?" if guesses else ""
        raise UsageError(f"unknown flag {name}{hint}")
    stray = " ".join(a for a in unknown if not a.startswith("-"))
    raise UsageError(
        f"unexpected argument(s) {stray}: each flag takes one value. If the shell expanded an "
        "unquoted pattern such as --source data/*.parquet, quote it: --source 'data/*.parquet'"
    )
