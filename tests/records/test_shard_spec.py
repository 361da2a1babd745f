"""ShardSpec: how shards are sized, checked when it is made; and the sizes it parses."""

from __future__ import annotations

from typing import Any

import pytest

from recordforge.records.shard_spec import DEFAULT_LEVEL, ShardSpec, Sizing, parse_size


@pytest.mark.parametrize(
    ("text", "size"),
    [("128MB", 128 * 10**6), ("1.5GB", 1_500_000_000), ("64MiB", 64 << 20), ("0", 0), (" 2 kib ", 2048)],
)
def test_sizes_parse_in_decimal_and_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["lots", "1TB", "-1MB", "", "1.MB"])
def test_what_is_not_a_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


@pytest.mark.parametrize(
    "spec",
    [
        ShardSpec(Sizing.BYTES, "gzip", max_bytes=1),
        ShardSpec(Sizing.RECORDS, "zlib", 0, "train", max_bytes=10, max_records=3),
        ShardSpec(Sizing.COUNT, "none", 3, count=1),
        ShardSpec(Sizing.PLACED, "gzip", count=4),
        ShardSpec(Sizing.PLACED, "gzip", count=4, seed=0),
    ],
)
def test_a_valid_spec_is_frozen_data(spec: ShardSpec) -> None:
    assert spec == ShardSpec(**{f: getattr(spec, f) for f in spec.__dataclass_fields__})
    assert spec.sizing.rolling == (spec.sizing is not Sizing.PLACED)
    with pytest.raises(AttributeError):
        spec.count = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sizing": Sizing.BYTES}, "bytes sizing takes a positive max_bytes, not 0"),
        ({"sizing": Sizing.BYTES, "max_bytes": 5, "count": 2}, "bytes sizing takes no count, not 2"),
        ({"sizing": Sizing.RECORDS, "max_records": 5}, "records sizing takes a positive max_bytes"),
        ({"sizing": Sizing.RECORDS, "max_bytes": 5}, "records sizing takes a positive max_records"),
        ({"sizing": Sizing.COUNT, "count": -1}, "count sizing takes a positive count, not -1"),
        ({"sizing": Sizing.COUNT, "count": 2, "max_records": 3}, "count sizing takes no max_records"),
        ({"sizing": Sizing.PLACED}, "placed sizing takes a positive count, not 0"),
        ({"sizing": Sizing.COUNT, "count": 2, "seed": 1}, "a seed places records"),
        ({"sizing": Sizing.BYTES, "max_bytes": 5, "compression": "lz4"}, "compression must be one of"),
        ({"sizing": Sizing.BYTES, "max_bytes": 5, "level": 4}, "level must be 0-3"),
    ],
)
def test_an_invalid_spec_is_refused_when_made(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ShardSpec(**{"compression": "gzip", "level": DEFAULT_LEVEL, **fields})
