"""The convert configuration's shard sizing: one ShardSpec per writer, from flags checked once."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from recordforge.errors import RecordForgeError
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.resolve import shard_spec
from recordforge.records.shard_spec import DEFAULT_SHARD_SIZE, ShardSpec, Sizing

# 3 files, 10 MB of input in all (one not sized: it counts for nothing).
FILES = SimpleNamespace(
    files=[SimpleNamespace(size=4_000_000), SimpleNamespace(size=6_000_000), SimpleNamespace(size=None)],
    folder=None,
)
# A local folder of 5,000 images: no sizes, a shard per 1,024 images.
IMAGES = SimpleNamespace(files=[], folder=SimpleNamespace(sizes=None, count=5000))


@pytest.mark.parametrize(
    ("flags", "inputs", "share", "spec"),
    [
        ({}, FILES, 1.0, ShardSpec(Sizing.BYTES, "gzip", max_bytes=DEFAULT_SHARD_SIZE)),
        ({"shard_size": "2MB"}, FILES, 1.0, ShardSpec(Sizing.BYTES, "gzip", max_bytes=2_000_000)),
        (
            {"records_per_shard": 7, "compression_level": 3},
            FILES,
            1.0,
            ShardSpec(Sizing.RECORDS, "gzip", 3, max_bytes=DEFAULT_SHARD_SIZE, max_records=7),
        ),
        ({"num_shards": 5}, FILES, 0.5, ShardSpec(Sizing.COUNT, "gzip", count=5)),
        ({"deterministic": True, "num_shards": 5}, FILES, 0.5, ShardSpec(Sizing.PLACED, "gzip", count=5)),
        # A shard per --shard_size of the split's share of the input, rounded up.
        ({"deterministic": True, "shard_size": "3MB"}, FILES, 1.0, ShardSpec(Sizing.PLACED, "gzip", count=4)),
        (
            {"deterministic": True, "shard_size": "3MB"},
            FILES,
            0.25,
            ShardSpec(Sizing.PLACED, "gzip", count=1),
        ),
        ({"shuffle": True}, FILES, 1.0, ShardSpec(Sizing.PLACED, "gzip", count=1, seed=42)),
        (
            {"shuffle": True, "seed": 7, "num_shards": 2},
            FILES,
            1.0,
            ShardSpec(Sizing.PLACED, "gzip", count=2, seed=7),
        ),
        ({"shuffle": True}, IMAGES, 0.5, ShardSpec(Sizing.PLACED, "gzip", count=3, seed=42)),
    ],
)
def test_each_sizing_flag_gives_its_spec(
    flags: dict[str, Any], inputs: Any, share: float, spec: ShardSpec
) -> None:
    config = ConvertConfig(sources=("in.parquet",), output="out", **flags)
    assert shard_spec(config, inputs, name="data", compression="gzip", share=share) == spec


def test_the_split_names_its_writer_and_the_compression_is_the_runs() -> None:
    config = ConvertConfig(sources=("in.parquet",), output="out", splits="train=1,test=1")
    spec = shard_spec(config, FILES, name="test", compression="zlib", share=0.5)
    assert (spec.name, spec.compression) == ("test", "zlib")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"num_shards": 2, "shard_size": "1MB"}, "do not combine with --num_shards"),
        ({"num_shards": 2, "records_per_shard": 5}, "do not combine with --num_shards"),
        ({"deterministic": True, "records_per_shard": 5}, "does not combine with --deterministic"),
        ({"records_per_shard": -1}, "must be 0"),
        ({"shard_size": "lots"}, "not a size"),
        ({"shard_size": "0MB"}, "at least 1 byte"),
        ({"seed": 7}, "--seed is the seed of --shuffle"),
    ],
)
def test_sizing_flags_that_do_not_combine_are_refused_once(flags: dict[str, Any], message: str) -> None:
    with pytest.raises(RecordForgeError, match=message):
        ConvertConfig(sources=("in.parquet",), output="out", **flags)
