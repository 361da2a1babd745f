"""The convert pipeline's configuration: validated once from flags, then frozen."""

from __future__ import annotations

import re
from dataclasses import dataclass

from recordforge.conforming.splits import SplitSpec
from recordforge.errors import RecordForgeError
from recordforge.output.publishing import Target
from recordforge.pipelines.flags import COMPRESSIONS, FLAGS, FORMATS, default
from recordforge.pipelines.options import ConvertOptions
from recordforge.records.array_records import ARRAY_RECORD
from recordforge.records.array_records import COMPRESSIONS as ARRAY_RECORD_COMPRESSIONS
from recordforge.records.shard_spec import (
    DEFAULT_SHARD_SIZE,
    OUTPUT_FORMATS,
    parse_size,
)
from recordforge.records.tfrecord import Compression
from recordforge.records.webdataset import WEBDATASET
from recordforge.schemas.plan import Plan

__all__ = ["ConvertConfig", "parse_splits"]


def parse_splits(text: str, *, weighted: bool = True) -> tuple[tuple[str, int], ...]:
    """`train=8,eval=1,test=1` -> (("train", 8), ("eval", 1), ("test", 1)). Not `weighted` (split
    names taken from a column), names alone are enough: `train,eval` (weights are then unused)."""
    out = []
    for part in text.split(","):
        name, eq, weight = part.strip().partition("=")
        if not weighted and not eq:
            weight = "1"
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", name) or not weight.isdigit() or int(weight) < 1:
            if not weighted:
                raise ValueError(f"{part!r} is not a split name (example: train,eval,test)")
            raise ValueError(f"{part!r} is not name=positive weight (example: train=8,eval=1)")
        out.append((name, int(weight)))
    if len({n for n, _ in out}) != len(out):
        raise ValueError("split names repeat")
    return tuple(out)


@dataclass(frozen=True)
class ConvertConfig:
    """Everything `build` needs, frozen; `source_format` None means "from the first file"."""

    sources: tuple[str, ...]
    output: str
    schema_path: str | None = default("schema_path")
    source_format: str | None = default("source_format")
    delta_version: int | None = default("delta_version")
    compression: str | None = default("compression")  # None: gzip, or none (images, an index, ArrayRecord)
    output_format: str = default("output_format")
    record_index: bool = default("record_index")
    num_shards: int = default("num_shards")
    batch_size: int = default("batch_size")
    profile: str | None = default("profile")
    shard_size: str | None = default("shard_size")
    records_per_shard: int = default("records_per_shard")
    compression_level: int = default("compression_level")
    deterministic: bool = default("deterministic")
    shuffle: bool = default("shuffle")
    seed: int = default("seed")
    max_rejected: int = default("max_rejected")
    max_rejected_fraction: float = default("max_rejected_fraction")
    max_record_bytes: int = default("max_record_bytes")
    skip_unreadable_files: bool = default("skip_unreadable_files")
    overwrite: bool = default("overwrite")
    span: str | None = default("span")
    if_changed: bool = default("if_changed")
    append: bool = default("append")
    resume: bool = default("resume")
    splits: str | None = default("splits")
    split_key: str | None = default("split_key")
    split_column: str | None = default("split_column")
    split_salt: str = default("split_salt")
    preprocessing_fn: str | None = default("preprocessing_fn")
    analyze_split: str | None = default("analyze_split")
    command: tuple[str, ...] = ()  # as given, for the lock's record of who holds it

    def __post_init__(self) -> None:
        problems = []
        if not self.sources:
            problems.append("--source is required")
        if not self.output:
            problems.append("--output is required")
        if self.source_format is not None and self.source_format not in FORMATS:
            problems.append(f"--format must be one of {', '.join(FORMATS)}")
        if self.delta_version is not None and self.source_format != "delta":
            problems.append("--delta_version needs --format delta")
        if self.compression is not None and self.compression not in COMPRESSIONS:
            problems.append(f"--compression must be one of {', '.join(COMPRESSIONS)}")
        if self.output_format not in OUTPUT_FORMATS:
            problems.append(f"--output_format must be one of {', '.join(OUTPUT_FORMATS)}")
        array_record = self.output_format == ARRAY_RECORD
        if array_record and self.compression not in (None, *ARRAY_RECORD_COMPRESSIONS):
            problems.append(
                f"--output_format array_record compresses each record itself: --compression "
                f"{' or '.join(ARRAY_RECORD_COMPRESSIONS)}, not {self.compression}"
            )
        if self.output_format == WEBDATASET and self.compression not in (None, "none"):
            problems.append("--output_format webdataset writes plain tar shards: --compression none")
        if not array_record and self.compression not in (None, *Compression.CHOICES):
            problems.append(f"--compression {self.compression} is for --output_format array_record")
        if self.record_index and array_record:
            problems.append("--record_index is for TFRecord shards (ArrayRecord files carry their own index)")
        if self.record_index and self.compression not in (None, "none"):
            problems.append(
                f"--record_index needs uncompressed shards, not --compression {self.compression}: an "
                "offset cannot be sought inside a deflate stream, which is read from its start"
            )
        if self.num_shards < 0:
            problems.append("--num_shards must be 0 (as many as --shard_size makes) or more")
        if self.seed != default("seed") and not self.shuffle:
            problems.append("--seed is the seed of --shuffle, which is not given")
        if self.max_rejected < 0:
            problems.append("--max_rejected must be 0 or more")
        if not 0.0 <= self.max_rejected_fraction <= 1.0:
            problems.append("--max_rejected_fraction must be between 0 and 1")
        if self.max_record_bytes < 0:
            problems.append("--max_record_bytes must be 0 (no limit) or more")
        if (self.shard_size or self.records_per_shard) and self.num_shards:
            problems.append("--shard_size and --records_per_shard do not combine with --num_shards")
        if self.records_per_shard and self.fixed_shards:
            flag = "--shuffle" if self.shuffle else "--deterministic"
            problems.append(
                f"--records_per_shard does not combine with {flag} (it takes --num_shards, "
                "or --shard_size for a shard per that much input)"
            )
        if self.records_per_shard < 0:
            problems.append("--records_per_shard must be 0 (no limit) or more")
        if self.shard_size is not None:
            try:
                if parse_size(self.shard_size) < 1:
                    problems.append("--shard_size must be at least 1 byte")
            except ValueError as exn:
                problems.append(f"--shard_size: {exn}")
        if (self.split_key or self.split_column) and not self.splits:
            problems.append("--split_key and --split_column need --splits")
        if self.split_key and self.split_column:
            problems.append("--split_key and --split_column are alternatives")
        if self.splits:
            try:
                parse_splits(self.splits, weighted=self.split_column is None)
            except ValueError as exn:
                problems.append(f"--splits: {exn}")
        if self.analyze_split and not self.splits:
            problems.append("--analyze_split needs --splits")
        if self.preprocessing_fn and ":" not in self.preprocessing_fn:
            problems.append("--preprocessing_fn is path/to/module.py:function or package.module:function")
        if self.append and self.overwrite:
            problems.append("--append keeps the published shards, --overwrite replaces them: choose one")
        if self.append and self.shuffle:
            problems.append(
                "--append does not combine with --shuffle: a permutation across every shard would "
                "rewrite the published ones (rebuild with --overwrite)"
            )
        if self.append and self.num_shards:
            problems.append(
                "--append does not combine with --num_shards: a fixed count of shards cannot grow "
                "(use --shard_size or --records_per_shard)"
            )
        if self.batch_size < 1:
            problems.append("--batch_size must be at least 1")
        if problems:
            raise RecordForgeError("; ".join(problems))

    @property
    def target(self) -> Target:
        """What the publication needs of the flags: the output and what it may do to it."""
        return Target(self.output, self.command, self.overwrite, self.if_changed, self.append)

    @property
    def fixed_shards(self) -> bool:
        """A shard count fixed before the run, each shard written whole by one worker: the
        deterministic writers (--shuffle is one)."""
        return self.deterministic or self.shuffle

    @property
    def shard_bytes(self) -> int:
        return parse_size(self.shard_size) if self.shard_size else DEFAULT_SHARD_SIZE

    def resolved_compression(self, has_images: bool) -> str:
        """An explicit --compression always wins."""
        if self.compression is not None:
            return self.compression
        plain = has_images or self.record_index or self.output_format in (ARRAY_RECORD, WEBDATASET)
        return "none" if plain else "gzip"

    def settings(self) -> dict[str, object]:
        """What, besides inputs and schema, decides the output's bytes (for --if_changed): every
        flag the flag table marks as changing the output."""
        return {f.dest: getattr(self, f.dest) for f in FLAGS if f.changes_output}

    @property
    def strict(self) -> bool:
        """No bad row allowed: the first one fails the job where it is found."""
        return self.max_rejected == 0 and self.max_rejected_fraction == 0.0

    @classmethod
    def from_options(cls, opts: ConvertOptions, command: tuple[str, ...] = ()) -> ConvertConfig:
        values = {f.dest: getattr(opts, f.name) for f in FLAGS}
        values["sources"] = tuple(values["sources"] or ())
        values["output"] = values["output"] or ""
        return cls(**values, command=command)

    def split_spec(self, plan: Plan) -> SplitSpec | None:
        """--splits and its companions, checked against the schema; None without --splits."""
        if not self.splits:
            return None
        pairs = parse_splits(self.splits, weighted=self.split_column is None)
        if self.split_key and self.split_key not in {f.name for f in plan.features}:
            raise RecordForgeError(f"--split_key {self.split_key!r} is not a feature of the schema")
        return SplitSpec(
            names=tuple(n for n, _ in pairs),
            weights=tuple(w for _, w in pairs),
            key_feature=self.split_key,
            column=self.split_column,
            salt=self.split_salt,
        )

    def fit_split(self, splits: SplitSpec | None) -> str | None:
        """The split analyzers are fitted on: --analyze_split, else `train`; None: all rows."""
        if splits is None:
            return None
        name = self.analyze_split or "train"
        if name not in splits.names:
            raise RecordForgeError(
                f"analyzers are fitted on the {name!r} split, which --splits does not have "
                f"({', '.join(splits.names)}); name one with --analyze_split"
            )
        return name
