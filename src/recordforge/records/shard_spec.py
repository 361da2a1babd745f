"""How shards are sized and written (`ShardSpec`): checked once, when it is made."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from recordforge.records.array_records import ARRAY_RECORD, COMPRESSIONS
from recordforge.records.tfrecord import Compression
from recordforge.records.webdataset import WEBDATASET

__all__ = [
    "DEFAULT_LEVEL",
    "DEFAULT_SEED",
    "DEFAULT_SHARD_SIZE",
    "OUTPUT_FORMATS",
    "ShardSpec",
    "Sizing",
    "parse_size",
]

TFRECORD = "tfrecord"
OUTPUT_FORMATS = (TFRECORD, ARRAY_RECORD, WEBDATASET)

DEFAULT_SHARD_SIZE = 128 << 20  # TensorFlow's guidance: 100-200 MB per shard
# ISA-L levels run 0-3; level 1 trades a few percent of size for most of the throughput
# (docs/performance.md).
DEFAULT_LEVEL = 1
# The seed of --shuffle unless one is given: a placed writer permutes records by it (shuffle.py).
DEFAULT_SEED = 42
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """`128MB`, `1.5GB`, `64MiB` or a number of bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 128MB, 1GB, 64MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


class Sizing(enum.Enum):
    """The four ways to size shards: three planners of the rolling writer (rolling.py), and the
    placed writer (placed.py)."""

    BYTES = "bytes"  # rolled at `max_bytes` compressed bytes
    RECORDS = "records"  # rolled at `max_records` records (or `max_bytes`, if reached first)
    COUNT = "count"  # exactly `count` shards of about equal compressed bytes
    PLACED = "placed"  # exactly `count` shards, every record given a global place

    @property
    def rolling(self) -> bool:
        return self is not Sizing.PLACED


@dataclass(frozen=True)
class ShardSpec:
    """How one writer sizes, compresses and names its shards (`{name}-SSSSS-of-NNNNN`).

    PLACED: shard s of `count` holds the places [s*N/count, (s+1)*N/count) of the N records;
    with `seed`, a record's place is drawn by a permutation seeded by it (and the name), without,
    it is the record's position in the input. `format`: TFRecord or ArrayRecord files (whose
    `compression` is riegeli's: none or zstd); `index`: a record index beside each uncompressed
    TFRecord shard. Invalid combinations raise `ValueError` here, so that a writer given a spec
    checks nothing."""

    sizing: Sizing
    compression: str
    level: int = DEFAULT_LEVEL
    name: str = "data"
    max_bytes: int = 0
    max_records: int = 0
    count: int = 0
    seed: int | None = None
    format: str = TFRECORD
    index: bool = False

    def __post_init__(self) -> None:
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"format must be one of {OUTPUT_FORMATS}, not {self.format!r}")
        choices = tuple(COMPRESSIONS) if self.format == ARRAY_RECORD else Compression.CHOICES
        choices = ("none",) if self.format == WEBDATASET else choices
        if self.compression not in choices:
            raise ValueError(f"{self.format} compression must be one of {choices}, not {self.compression!r}")
        if self.index and (self.format != TFRECORD or self.compression != "none"):
            raise ValueError("a record index is written beside uncompressed TFRecord shards only")
        if not 0 <= self.level <= 3:
            raise ValueError(f"level must be 0-3 (ISA-L levels), not {self.level}")
        wanted = {
            Sizing.BYTES: (True, False, False),
            Sizing.RECORDS: (True, True, False),
            Sizing.COUNT: (False, False, True),
            Sizing.PLACED: (False, False, True),
        }[self.sizing]
        given = (self.max_bytes, self.max_records, self.count)
        for field, want, value in zip(("max_bytes", "max_records", "count"), wanted, given, strict=True):
            if value < 0 or bool(value) != want:
                need = "a positive" if want else "no"
                raise ValueError(f"{self.sizing.value} sizing takes {need} {field}, not {value}")
        if self.seed is not None and self.sizing is not Sizing.PLACED:
            raise ValueError("a seed places records: it needs placed sizing")

    def describe(self) -> dict[str, object]:
        """How the shards were cut, as metadata.json records it."""
        if self.sizing is Sizing.PLACED:
            order = "input order" if self.seed is None else "a permutation drawn from shuffle_seed"
            # Boundaries fall on records, not on the input's batches: shard s of S holds the
            # records at places [sN/S, (s+1)N/S).
            return {"by": "placed", "shards": self.count, "places": f"records, in {order}"}
        if self.sizing is Sizing.COUNT:
            return {"by": "count", "shards": self.count}
        if self.sizing is Sizing.RECORDS:
            return {"by": "records", "records_per_shard": self.max_records}
        return {"by": "size", "shard_bytes": self.max_bytes}
