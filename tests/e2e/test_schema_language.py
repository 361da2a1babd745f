"""Every type x shape x null policy, round-tripped through tf.data with the generated spec."""

from __future__ import annotations

import datetime
import decimal
import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import read_with_tf

from recordforge.pipelines.convert import run

N = 24
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _f32(x: float) -> bytes:
    return struct.pack("<f", x)


def _f64(x: float) -> bytes:
    return struct.pack("<d", x)


# type name -> (YAML keys, Arrow type, value generator(rng, i), expected written value(v))
TYPES: dict[str, tuple[dict, pa.DataType, Any, Any]] = {
    "int64": (
        {"type": "int64"},
        pa.int64(),
        lambda r, i: [0, -1, 2**63 - 1, -(2**63), int(r.integers(-99, 99))][i % 5],
        int,
    ),
    "float32": (
        {"type": "float32"},
        pa.float32(),
        lambda r, i: float(np.float32([0.0, -0.0, np.inf, 1e-40, r.normal()][i % 5])),
        lambda v: _f32(v),
    ),
    "float64_narrow": (
        {"type": "float64", "narrow": True},
        pa.float64(),
        lambda r, i: [0.1, -1e30, 1e-300, float(r.normal())][i % 4],
        lambda v: _f32(float(np.float32(v))),
    ),
    "float64_bytes": (
        {"type": "float64", "encode": "bytes"},
        pa.float64(),
        lambda r, i: [0.1, -1e300, 5e-324, float("nan"), float(r.normal())][i % 5],
        _f64,
    ),
    "bytes": (
        {"type": "bytes"},
        pa.binary(),
        lambda r, i: [b"", b"\xff\x00", bytes(r.integers(0, 256, 5, dtype=np.uint8))][i % 3],
        bytes,
    ),
    "string": (
        {"type": "string"},
        pa.string(),
        lambda r, i: ["", "héllo", 'a,b\n"c"', "x" * int(r.integers(0, 9))][i % 4],
        lambda v: v.encode(),
    ),
    "bool": ({"type": "bool"}, pa.bool_(), lambda r, i: bool(i % 2), int),
    "timestamp": (
        {"type": "timestamp", "unit": "us"},
        pa.timestamp("us", tz="UTC"),
        lambda r, i: EPOCH + datetime.timedelta(microseconds=int(r.integers(-(10**15), 10**15))),
        lambda v: (v - EPOCH) // datetime.timedelta(microseconds=1),
    ),
    "date": (
        {"type": "date"},
        pa.date32(),
        lambda r, i: datetime.date(1970, 1, 1) + datetime.timedelta(days=int(r.integers(-9999, 99999))),
        lambda v: (v - datetime.date(1970, 1, 1)).days,
    ),
    "time": (
        {"type": "time", "unit": "us"},
        pa.time64("us"),
        lambda r, i: datetime.time(*(int(x) for x in r.integers(0, [24, 60, 60, 10**6]))),
        lambda v: ((v.hour * 60 + v.minute) * 60 + v.second) * 10**6 + v.microsecond,
    ),
    "decimal_string": (
        {"type": "decimal", "as": "string"},
        pa.decimal128(20, 4),
        lambda r, i: decimal.Decimal(int(r.integers(-(10**12), 10**12))).scaleb(-4),
        lambda v: str(v).encode(),
    ),
    "decimal_scaled": (
        {"type": "decimal", "as": "scaled_int", "scale": 4},
        pa.decimal128(20, 4),
        lambda r, i: decimal.Decimal(int(r.integers(-(10**12), 10**12))).scaleb(-4),
        lambda v: int(v.scaleb(4)),
    ),
}
DEFAULTS = {
    "int64": 7,
    "float32": 1.5,
    "float64_narrow": 2.5,
    "float64_bytes": 3.25,
    "bytes": "dflt",
    "string": "dflt",
    "bool": True,
    "timestamp": 0,
    "date": 0,
    "time": 0,
    "decimal_string": "0.5",
    "decimal_scaled": 5,
}
SHAPES = {"scalar": [], "fixed": [2], "matrix": [2, 2], "list": [-1], "ragged": [-1, -1]}
POLICIES = ["absent", "required", "default"]


def _cases() -> list[tuple[str, str, str]]:
    out = []
    for t in TYPES:
        for s in SHAPES:
            for p in POLICIES:
                if p == "default" and s in ("ragged", "list", "matrix"):
                    continue  # defaults are declared for scalars and fixed lists
                if t == "float64_bytes" and s == "ragged":
                    continue  # documented: encode: bytes has no ragged form
                out.append((t, s, p))
    return out


def _values(rng: np.random.Generator, t: str, shape: str, policy: str) -> list[Any]:
    gen = TYPES[t][2]
    out = []
    for i in range(N):
        if policy != "required" and i % 4 == 3:
            out.append(None)
        elif shape == "scalar":
            out.append(gen(rng, i))
        elif shape == "fixed":
            out.append([gen(rng, i), gen(rng, i + 1)])
        elif shape == "matrix":
            out.append([[gen(rng, i), gen(rng, i + 1)], [gen(rng, i + 2), gen(rng, i)]])
        elif shape == "list":
            out.append([gen(rng, i + k) for k in range(i % 4)])
        else:
            out.append([[gen(rng, i + k) for k in range(j)] for j in range(i % 3)])
    return out


def _arrow_type(t: str, shape: str) -> pa.DataType:
    base = TYPES[t][1]
    return {
        "scalar": base,
        "fixed": pa.list_(base),
        "list": pa.list_(base),
        "matrix": pa.list_(pa.list_(base)),
        "ragged": pa.list_(pa.list_(base)),
    }[shape]


def _expected(t: str, shape: str, policy: str, v: Any) -> Any:
    """What tf.data must return for one record, flattened as the spec defines it."""
    conv = TYPES[t][3]
    if v is None:
        if policy != "default":
            return [] if shape != "ragged" else []
        d = DEFAULTS[t]
        d = d.encode() if isinstance(d, str) and t in ("bytes", "string") else d
        if t == "float32" or t == "float64_narrow":
            d = _f32(d)
        elif t == "float64_bytes":
            d = _f64(d)
        elif t == "decimal_string":
            d = d.encode()
        elif t == "bool":
            d = int(d)
        return [d] if shape == "scalar" else [d, d]
    if shape == "ragged":
        return [[conv(x) for x in inner] for inner in v]
    flat = v if shape != "matrix" else [x for row in v for x in row]
    return [conv(x) for x in (flat if isinstance(flat, list) else [flat])]


def _flat(value: Any) -> list[Any]:
    """Flattens without np.ravel on bytes: numpy's S dtype would strip trailing NUL bytes."""
    if isinstance(value, bytes):
        return [value]
    if isinstance(value, np.ndarray):
        return list(value.reshape(-1)) if value.dtype == object else list(np.ravel(value))
    return list(np.ravel(value))


def _observed(t: str, value: Any) -> Any:
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [[_obs_scalar(t, x) for x in inner] for inner in value]
    if t == "float64_bytes":
        raw = _flat(value)
        if raw and isinstance(raw[0], bytes):  # sparse: still the packed bytes, one per record
            return [_f64(x) for b in raw for x in np.frombuffer(b, "<f8")]
        return [_f64(float(x)) for x in raw]
    if isinstance(value, list):
        return [_obs_scalar(t, x) for x in value]
    return [_obs_scalar(t, x) for x in _flat(value)]


def _obs_scalar(t: str, x: Any) -> Any:
    if t in ("float32", "float64_narrow"):
        return _f32(float(x))
    if t == "float64_bytes":
        return _f64(float(x))
    if isinstance(x, bytes):
        return x
    return int(x)


def test_every_type_shape_and_null_policy_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    columns: dict[str, pa.Array] = {"rid": pa.array(range(N), pa.int64())}
    features: list[dict[str, Any]] = [{"name": "rid", "type": "int64", "nulls": "required"}]
    expected: dict[str, list[Any]] = {}
    cases = _cases()
    for t, s, p in cases:
        name = f"{t}__{s}__{p}"
        values = _values(rng, t, s, p)
        columns[name] = pa.array(values, _arrow_type(t, s))
        feature = {"name": name, **TYPES[t][0], "shape": SHAPES[s], "nulls": p}
        if p == "default":
            feature["default"] = DEFAULTS[t] if s == "scalar" else [DEFAULTS[t]] * 2
        features.append(feature)
        expected[name] = [_expected(t, s, p, v) for v in values]
    pq.write_table(pa.table(columns), tmp_path / "all.parquet", row_group_size=10)
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({"features": features}))
    out = tmp_path / "out"
    run(
        [
            "--source",
            str(tmp_path / "all.parquet"),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--output",
            str(out),
            "--batch_size",
            "7",
        ]
    )

    spec = json.loads((out / "feature_spec.json").read_text())
    assert spec["float64_bytes__scalar__required"]["decode"]["raw"] == "float64"
    assert spec["int64__ragged__absent"]["kind"] == "RaggedFeature"
    rows = {int(np.ravel(r["rid"])[0]): r for r in read_with_tf(str(out))}
    assert sorted(rows) == list(range(N))
    assert len(cases) >= 100
    for t, s, p in cases:
        name = f"{t}__{s}__{p}"
        got = [_observed(t, rows[i][name]) for i in range(N)]
        assert got == expected[name], name


@pytest.mark.parametrize("unit", ["s", "ms", "ns"])
def test_timestamp_units_refuse_truncation(tmp_path: Path, unit: str) -> None:
    ts = pa.array([0, 1_500], pa.timestamp("ms"))
    pq.write_table(pa.table({"t": ts}), tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(
        yaml.safe_dump({"features": [{"name": "t", "type": "timestamp", "unit": unit}]})
    )
    args = [
        "--source",
        str(tmp_path / "t.parquet"),
        "--schema",
        str(tmp_path / "s.yaml"),
        "--output",
        str(tmp_path / "o"),
        "--compression",
        "none",
    ]
    if unit == "s":
        with pytest.raises(Exception, match=r"row 2, column 't'.*timestamp"):
            run(args)
    else:
        run(args)
        got = sorted(int(np.ravel(r["t"])[0]) for r in read_with_tf(str(tmp_path / "o")))
        assert got == [0, 1_500 * (1 if unit == "ms" else 1_000_000)]
