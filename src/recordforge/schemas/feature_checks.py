"""Why a feature is not valid: every problem of its name, shape, types, checks and default, at once."""

from __future__ import annotations

import math
import re
import struct
from typing import TYPE_CHECKING, Any

from recordforge.schemas.kinds import (
    DECIMAL_AS,
    IMAGE_ENCODINGS,
    RAGGED,
    RESIZE_METHODS,
    TIME_UNITS,
    VARIABLE,
    DType,
    ExampleKind,
    NullPolicy,
    Op,
    normalize_name,
)

if TYPE_CHECKING:
    from recordforge.schemas.model import Feature

__all__ = ["feature_problems"]

# fullmatch, not match with `$`: `$` also matches before a final newline.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_INT64_MAX = 2**63 - 1


def feature_problems(f: Feature) -> list[str]:
    """Every reason this feature is invalid, so that all can be reported at once."""
    out = []
    if not _NAME_RE.fullmatch(f.name):
        out.append(
            f"{f.name!r} is not a valid feature name (letters, digits, '_', '.', '-', '/'; "
            f"'{normalize_name(f.name)}' would be)"
        )
    out.extend(_shape_problems(f))
    out.extend(_type_problems(f))
    out.extend(_image_problems(f))
    out.extend(_check_problems(f))
    out.extend(_transform_problems(f))
    if f.nulls is NullPolicy.DEFAULT:
        if f.default is None:
            out.append("`nulls: default` needs a `default:` value")
        elif f.is_ragged:
            out.append("a ragged feature cannot have a default")
        else:
            out.extend(_default_problems(f))
    elif f.default is not None:
        out.append(f"`default:` is given but `nulls` is {f.nulls.value!r}")
    return out


def _shape_problems(f: Feature) -> list[str]:
    out = []
    if any(d == 0 or d < VARIABLE for d in f.shape):
        out.append(f"shape {list(f.shape)} has a dimension that is 0 or below -1")
    if VARIABLE in f.shape and f.shape not in ((VARIABLE,), RAGGED):
        out.append(f"shape {list(f.shape)}: variable lengths are [-1] or [-1, -1] (ragged)")
    if len(f.shape) > 2:
        out.append(f"shape {list(f.shape)} has more than two dimensions")
    return out


def _type_problems(f: Feature) -> list[str]:
    out = []
    if f.dtype is DType.IMAGE:
        pass
    elif f.dtype is DType.FLOAT64:
        if f.encode not in (None, "bytes"):
            out.append("`encode` must be `bytes` (float64 kept bit-exact)")
        if f.narrow == (f.encode == "bytes"):
            out.append(
                "float64 does not fit a tf.train.Example float_list (32-bit): add `narrow: "
                "true` to accept float32 precision, or `encode: bytes` to keep all 64 bits"
            )
        if f.float64_bytes and f.is_ragged:
            out.append("`encode: bytes` does not support ragged shapes")
    else:
        # A float32 feature with `narrow` takes float64 columns too (what a TFMD FLOAT is).
        if f.narrow and f.dtype is not DType.FLOAT32:
            out.append("`narrow` applies only to float64 and float32 features")
        if f.encode is not None:
            out.append("`encode` applies only to float64 features")
    if (f.dtype in (DType.TIMESTAMP, DType.TIME)) != (f.unit is not None):
        out.append(f"timestamps and times need `unit` (one of {', '.join(TIME_UNITS)}), other types not")
    elif f.unit is not None and f.unit not in TIME_UNITS:
        out.append(f"`unit: {f.unit}` is not one of {', '.join(TIME_UNITS)}")
    if f.dtype is DType.DECIMAL:
        if f.decimal_as not in DECIMAL_AS:
            out.append(f"decimals need `as:` one of {', '.join(DECIMAL_AS)}")
        if (f.decimal_as == "scaled_int") != (f.scale is not None):
            out.append("`as: scaled_int` needs `scale` (digits after the point), and only it")
    elif f.decimal_as is not None or f.scale is not None:
        out.append("`as` and `scale` apply only to decimal features")
    return out


def _image_problems(f: Feature) -> list[str]:
    out = []
    image_keys = [f.resize, f.method, f.quality, f.channels]
    if f.dtype is not DType.IMAGE:
        if any(k is not None for k in image_keys):
            out.append("`resize`, `method`, `quality` and `channels` apply to images")
        return out
    if f.shape != ():
        out.append("an image feature is one image per row (shape [])")
    if f.encode not in (None, *IMAGE_ENCODINGS):
        out.append(
            f"images: `encode` is one of {', '.join(IMAGE_ENCODINGS)} (default: keep the original bytes)"
        )
    if f.resize is not None and (
        len(f.resize) != 2 or any(not isinstance(d, int) or d < 1 for d in f.resize)
    ):
        out.append("`resize` is [height, width] in pixels")
    if f.method is not None and f.method not in RESIZE_METHODS:
        out.append(f"`method` is one of {', '.join(RESIZE_METHODS)}")
    if f.method is not None and f.resize is None:
        out.append("`method` needs `resize`")
    if f.quality is not None and (f.encode != "jpeg" or not 1 <= f.quality <= 100):
        out.append("`quality` (1-100) applies to `encode: jpeg`")
    if f.channels not in (None, 1, 3, 4):
        out.append("`channels` is 1, 3 or 4")
    if f.resize is not None and f.encode is None:
        out.append("a resized image must be encoded again: add `encode: jpeg|png|raw`")
    if f.nulls is NullPolicy.DEFAULT:
        out.append("an image cannot have a default")
    return out


def _transform_problems(f: Feature) -> list[str]:
    """Why this feature cannot take its transform (empty when it can, or has none)."""
    if f.transform is None:
        return []
    name = f.transform.analyzer.value
    if f.is_image:
        return [f"`{name}` does not apply to images"]
    if len(f.shape) > 1 and -1 in f.shape:
        return [f"`{name}` does not apply to ragged features"]
    if f.transform.analyzer.takes_strings:
        if f.dtype not in (DType.STRING, DType.BYTES) or f.value_kind is not ExampleKind.BYTES:
            return [f"`{name}` applies to string or bytes features, not {f.dtype.value}"]
        return []
    if f.value_kind not in (ExampleKind.INT64, ExampleKind.FLOAT):
        return [f"`{name}` applies to numeric features, not {f.dtype.value}"]
    if f.float64_bytes and -1 in f.shape:
        return [f"`{name}` on `encode: bytes` float64 needs a fixed shape"]
    return []


def _check_problems(f: Feature) -> list[str]:
    out = []
    numeric = f.value_kind is ExampleKind.INT64 or f.value_kind is ExampleKind.FLOAT
    if (f.min is not None or f.max is not None) and not numeric:
        out.append("`min`/`max` apply to numeric features")
    bounds_ok = True
    for key in ("min", "max"):
        value = getattr(f, key)
        if value is not None and not _is_number(value):
            out.append(f"`{key}` must be a finite number within int64 range, not {value!r}")
            bounds_ok = False
    if bounds_ok and f.min is not None and f.max is not None and f.min > f.max:
        out.append(f"`min` {f.min} is above `max` {f.max}")
    if f.regex is not None:
        if f.dtype is not DType.STRING:
            out.append("`regex` applies to string features")
        else:
            out.extend(_regex_problems(f.regex))
    if f.max_length is not None and not (_is_int(f.max_length) and 0 <= f.max_length <= _INT64_MAX):
        out.append(f"`max_length` must be an integer from 0 to 2^63-1, not {f.max_length!r}")
    if f.scale is not None and not (_is_int(f.scale) and 0 <= f.scale <= 38):
        out.append(f"`scale` must be an integer from 0 to 38, not {f.scale!r}")
    for op, arg in f.ops:
        if op in (Op.LOWER, Op.UPPER, Op.STRIP) and f.dtype is not DType.STRING:
            out.append(f"op `{op.value}` applies to string features")
        if op in (Op.CLIP, Op.ABS) and not numeric:
            out.append(f"op `{op.value}` applies to numeric features")
        if op is Op.CLIP:
            if not (isinstance(arg, list) and len(arg) == 2 and all(_is_number(v) for v in arg)):
                out.append(f"op `clip` takes [low, high] (two numbers), not {arg!r}")
            elif arg[0] > arg[1]:
                # Arrow's clip would turn every value into `high` without a word.
                out.append(f"op `clip`: low {arg[0]} is above high {arg[1]}")
        if op is Op.HASH_BUCKET:
            if not (_is_int(arg) and 0 < arg <= _INT64_MAX):
                out.append("op `hash_bucket` takes a positive number of buckets")
            if f.dtype not in (DType.STRING, DType.BYTES):
                out.append("op `hash_bucket` applies to string or bytes features")
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A bound Arrow can compare with: finite, and an int64 if an integer."""
    if _is_int(value):
        return -_INT64_MAX - 1 <= value <= _INT64_MAX
    return isinstance(value, float) and math.isfinite(value)


def _regex_problems(regex: Any) -> list[str]:
    """Compiled by the engine that runs it (Arrow's RE2, in casts.py): Python's `re` would accept
    backreferences and lookarounds that RE2 refuses only once the data is read."""
    if not isinstance(regex, str):
        return [f"`regex` must be a string, not {regex!r}"]
    import pyarrow as pa
    import pyarrow.compute as pc

    try:
        pc.match_substring_regex(pa.array([""], pa.string()), regex)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exn:
        reason = str(exn).removeprefix("Invalid regular expression: ")
        return [f"`regex` is not valid RE2 syntax: {reason}"]
    return []


def _default_problems(feature: Feature) -> list[str]:
    values = feature.default if isinstance(feature.default, list) else [feature.default]
    if not feature.is_scalar and not isinstance(feature.default, list):
        return ["the default of a list feature must be a list"]
    if feature.is_scalar and isinstance(feature.default, list):
        return ["the default of a scalar feature must be a scalar"]
    n = feature.num_values
    if n is not None and len(values) != n:
        return [f"the default has {len(values)} values, the shape needs {n}"]
    expected: tuple[type, ...] = {
        DType.INT64: (int,),
        DType.TIMESTAMP: (int,),
        DType.DATE: (int,),
        DType.TIME: (int,),
        DType.BOOL: (bool,),
        DType.FLOAT32: (int, float),
        DType.FLOAT64: (int, float),
        DType.BYTES: (str, bytes),
        DType.STRING: (str,),
        DType.DECIMAL: (str, int),
    }[feature.dtype]
    bad = [
        v
        for v in values
        if not isinstance(v, expected) or (feature.dtype is DType.INT64 and isinstance(v, bool))
    ]
    if bad:
        return [f"default value {bad[0]!r} is not a valid {feature.dtype.value}"]
    if feature.value_kind is ExampleKind.FLOAT and not feature.float64_bytes:
        beyond = [v for v in values if not _fits_float32(v)]
        if beyond:
            return [f"default value {beyond[0]!r} is outside float32 range"]
    return []


def _fits_float32(value: float) -> bool:
    """False for a finite value that float32 rounds to infinity (written, it would be one)."""
    try:
        struct.pack("<f", value)
    except OverflowError:
        return False
    return True
