"""A feature of the schema: what it is, as data, and every reason it can be invalid, found at once."""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass
from typing import Any

from recordforge.schemas.analyzers import Transform
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

__all__ = ["Feature"]


@dataclass(frozen=True)
class Feature:
    """One feature of the output records and the source column it comes from.

    `shape` is `()` for a scalar, `(N,)` or `(N, M)` for fixed shapes (written flattened, row-major),
    `(-1,)` for a variable-length list, `(-1, -1)` for a ragged list of lists (values plus a
    `{name}.row_lengths` feature, restored by `tf.io.RaggedFeature`).
    """

    name: str
    dtype: DType
    shape: tuple[int, ...] = ()
    column: str | None = None
    nulls: NullPolicy = NullPolicy.ABSENT
    default: Any = None
    narrow: bool = False  # float64 written as float32; float32: float64 source columns accepted
    encode: str | None = None  # "bytes": float64 kept bit-exact as little-endian bytes
    unit: str | None = None  # timestamp and time unit
    decimal_as: str | None = None
    scale: int | None = None
    min: float | None = None
    max: float | None = None
    allowed: tuple[Any, ...] | None = None
    max_length: int | None = None
    regex: str | None = None
    ops: tuple[tuple[Op, Any], ...] = ()
    resize: tuple[int, int] | None = None  # images: [height, width]
    method: str | None = None  # images: resize filter
    quality: int | None = None  # images: JPEG quality
    channels: int | None = None  # images: convert to 1 (L), 3 (RGB) or 4 (RGBA)
    transform: Transform | None = None  # a full-pass analyzer, applied by tensorflow-transform
    description: str = ""

    def __post_init__(self) -> None:
        problems = _problems(self)
        if problems:
            raise ValueError(f"feature {self.name!r}: " + "; ".join(problems))

    @property
    def source_column(self) -> str:
        return self.column if self.column is not None else self.name

    @property
    def hashed(self) -> bool:
        return any(op is Op.HASH_BUCKET for op, _ in self.ops)

    @property
    def value_kind(self) -> ExampleKind:
        """The kind of the feature's values (before `encode: bytes` packing)."""
        if self.hashed:
            return ExampleKind.INT64
        if self.dtype in (DType.INT64, DType.BOOL, DType.TIMESTAMP, DType.DATE, DType.TIME):
            return ExampleKind.INT64
        if self.dtype is DType.DECIMAL:
            return ExampleKind.INT64 if self.decimal_as == "scaled_int" else ExampleKind.BYTES
        if self.dtype in (DType.FLOAT32, DType.FLOAT64):
            return ExampleKind.FLOAT
        return ExampleKind.BYTES

    @property
    def kind(self) -> ExampleKind:
        """The list the written Example carries the values in."""
        return ExampleKind.BYTES if self.encode is not None else self.value_kind

    @property
    def is_image(self) -> bool:
        return self.dtype is DType.IMAGE

    @property
    def float64_bytes(self) -> bool:
        return self.dtype is DType.FLOAT64 and self.encode == "bytes"

    def part_name(self, part: str) -> str:
        """`{name}/height` etc.: the header values written beside an image."""
        return f"{self.name}/{part}"

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    @property
    def is_variable(self) -> bool:
        return self.shape == (VARIABLE,)

    @property
    def is_ragged(self) -> bool:
        return self.shape == RAGGED

    @property
    def num_values(self) -> int | None:
        """Values per record for fixed shapes (1 for scalars), None for variable length."""
        return None if VARIABLE in self.shape else math.prod(self.shape)

    @property
    def transformed_name(self) -> str | None:
        """The feature a declared transform writes (None without one)."""
        if self.transform is None:
            return None
        return self.transform.output or self.name

    @property
    def row_lengths_name(self) -> str:
        return f"{self.name}.row_lengths"


# fullmatch, not match with `$`: `$` also matches before a final newline.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_INT64_MAX = 2**63 - 1


def _problems(f: Feature) -> list[str]:
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
