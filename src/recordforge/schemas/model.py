"""The schema model: what a feature is, as data, with everything else derived from it."""

from __future__ import annotations

import enum
import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

from recordforge.schemas.analyzers import Transform

__all__ = [
    "DType",
    "ExampleKind",
    "Feature",
    "feature_to_dict",
    "normalize_name",
    "NullPolicy",
    "Op",
    "Schema",
    "VARIABLE",
]


class DType(enum.Enum):
    """The logical type a feature holds."""

    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BYTES = "bytes"
    STRING = "string"
    BOOL = "bool"
    TIMESTAMP = "timestamp"  # int64 since the epoch, in `unit`
    DATE = "date"  # int64 days since 1970-01-01
    TIME = "time"  # int64 since midnight, in `unit`
    DECIMAL = "decimal"  # `as: string`, or `as: scaled_int` with `scale`
    IMAGE = "image"  # a path/URI (or the encoded bytes) of an image file


class ExampleKind(enum.Enum):
    """Which of tf.train.Feature's three lists carries the values."""

    BYTES = 1  # Feature.bytes_list, field number 1
    FLOAT = 2  # Feature.float_list, field number 2
    INT64 = 3  # Feature.int64_list, field number 3


class NullPolicy(enum.Enum):
    """What a null in the source means for the written record."""

    ABSENT = "absent"  # the feature is omitted from that record
    REQUIRED = "required"  # a null is a bad row
    DEFAULT = "default"  # the declared default value is written


class Op(enum.Enum):
    """Safe, built-in row-local derivations, applied in order after the type cast."""

    LOWER = "lower"
    UPPER = "upper"
    STRIP = "strip"
    CLIP = "clip"  # argument [low, high]
    HASH_BUCKET = "hash_bucket"  # argument n; strings to int64 in [0, n), as tf.strings.to_hash_bucket_fast
    ABS = "abs"


VARIABLE = -1
RAGGED = (VARIABLE, VARIABLE)
TIME_UNITS = ("s", "ms", "us", "ns")
DECIMAL_AS = ("string", "scaled_int")
IMAGE_ENCODINGS = ("jpeg", "png", "raw")
RESIZE_METHODS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
IMAGE_PARTS = ("height", "width", "channels", "format")
# fullmatch, not match with `$`: `$` also matches before a final newline.
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_INT64_MAX = 2**63 - 1
_NORMALIZE_RE = re.compile(r"[^a-z0-9_]+")


def normalize_name(column: str) -> str:
    """Map a source column name to a valid feature name: lower case, other characters to `_`."""
    name = _NORMALIZE_RE.sub("_", column.strip().lower()).strip("_")
    if not name:
        name = "feature"
    if name[0].isdigit():
        name = "_" + name
    return name


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
        problems = self.problems()
        if problems:
            raise ValueError(f"feature {self.name!r}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this feature is invalid, so that all can be reported at once."""
        out = []
        if not _NAME_RE.fullmatch(self.name):
            out.append(
                f"{self.name!r} is not a valid feature name (letters, digits, '_', '.', '-', '/'; "
                f"'{normalize_name(self.name)}' would be)"
            )
        out.extend(self._shape_problems())
        out.extend(self._type_problems())
        out.extend(self._image_problems())
        out.extend(self._check_problems())
        out.extend(self._transform_problems())
        if self.nulls is NullPolicy.DEFAULT:
            if self.default is None:
                out.append("`nulls: default` needs a `default:` value")
            elif self.is_ragged:
                out.append("a ragged feature cannot have a default")
            else:
                out.extend(_default_problems(self))
        elif self.default is not None:
            out.append(f"`default:` is given but `nulls` is {self.nulls.value!r}")
        return out

    def _shape_problems(self) -> list[str]:
        out = []
        if any(d == 0 or d < VARIABLE for d in self.shape):
            out.append(f"shape {list(self.shape)} has a dimension that is 0 or below -1")
        if VARIABLE in self.shape and self.shape not in ((VARIABLE,), RAGGED):
            out.append(f"shape {list(self.shape)}: variable lengths are [-1] or [-1, -1] (ragged)")
        if len(self.shape) > 2:
            out.append(f"shape {list(self.shape)} has more than two dimensions")
        return out

    def _type_problems(self) -> list[str]:
        out = []
        if self.dtype is DType.IMAGE:
            pass
        elif self.dtype is DType.FLOAT64:
            if self.encode not in (None, "bytes"):
                out.append("`encode` must be `bytes` (float64 kept bit-exact)")
            if self.narrow == (self.encode == "bytes"):
                out.append(
                    "float64 does not fit a tf.train.Example float_list (32-bit): add `narrow: "
                    "true` to accept float32 precision, or `encode: bytes` to keep all 64 bits"
                )
            if self.float64_bytes and self.is_ragged:
                out.append("`encode: bytes` does not support ragged shapes")
        else:
            # A float32 feature with `narrow` takes float64 columns too (what a TFMD FLOAT is).
            if self.narrow and self.dtype is not DType.FLOAT32:
                out.append("`narrow` applies only to float64 and float32 features")
            if self.encode is not None:
                out.append("`encode` applies only to float64 features")
        if (self.dtype in (DType.TIMESTAMP, DType.TIME)) != (self.unit is not None):
            out.append(f"timestamps and times need `unit` (one of {', '.join(TIME_UNITS)}), other types not")
        elif self.unit is not None and self.unit not in TIME_UNITS:
            out.append(f"`unit: {self.unit}` is not one of {', '.join(TIME_UNITS)}")
        if self.dtype is DType.DECIMAL:
            if self.decimal_as not in DECIMAL_AS:
                out.append(f"decimals need `as:` one of {', '.join(DECIMAL_AS)}")
            if (self.decimal_as == "scaled_int") != (self.scale is not None):
                out.append("`as: scaled_int` needs `scale` (digits after the point), and only it")
        elif self.decimal_as is not None or self.scale is not None:
            out.append("`as` and `scale` apply only to decimal features")
        return out

    def _image_problems(self) -> list[str]:
        out = []
        image_keys = [self.resize, self.method, self.quality, self.channels]
        if self.dtype is not DType.IMAGE:
            if any(k is not None for k in image_keys):
                out.append("`resize`, `method`, `quality` and `channels` apply to images")
            return out
        if self.shape != ():
            out.append("an image feature is one image per row (shape [])")
        if self.encode not in (None, *IMAGE_ENCODINGS):
            out.append(
                f"images: `encode` is one of {', '.join(IMAGE_ENCODINGS)} (default: keep the original bytes)"
            )
        if self.resize is not None and (
            len(self.resize) != 2 or any(not isinstance(d, int) or d < 1 for d in self.resize)
        ):
            out.append("`resize` is [height, width] in pixels")
        if self.method is not None and self.method not in RESIZE_METHODS:
            out.append(f"`method` is one of {', '.join(RESIZE_METHODS)}")
        if self.method is not None and self.resize is None:
            out.append("`method` needs `resize`")
        if self.quality is not None and (self.encode != "jpeg" or not 1 <= self.quality <= 100):
            out.append("`quality` (1-100) applies to `encode: jpeg`")
        if self.channels not in (None, 1, 3, 4):
            out.append("`channels` is 1, 3 or 4")
        if self.resize is not None and self.encode is None:
            out.append("a resized image must be encoded again: add `encode: jpeg|png|raw`")
        if self.nulls is NullPolicy.DEFAULT:
            out.append("an image cannot have a default")
        return out

    def _transform_problems(self) -> list[str]:
        """Why this feature cannot take its transform (empty when it can, or has none)."""
        if self.transform is None:
            return []
        name = self.transform.analyzer.value
        if self.is_image:
            return [f"`{name}` does not apply to images"]
        if len(self.shape) > 1 and -1 in self.shape:
            return [f"`{name}` does not apply to ragged features"]
        if self.transform.analyzer.takes_strings:
            if self.dtype not in (DType.STRING, DType.BYTES) or self.value_kind is not ExampleKind.BYTES:
                return [f"`{name}` applies to string or bytes features, not {self.dtype.value}"]
            return []
        if self.value_kind not in (ExampleKind.INT64, ExampleKind.FLOAT):
            return [f"`{name}` applies to numeric features, not {self.dtype.value}"]
        if self.float64_bytes and -1 in self.shape:
            return [f"`{name}` on `encode: bytes` float64 needs a fixed shape"]
        return []

    def _check_problems(self) -> list[str]:
        out = []
        numeric = self.value_kind is ExampleKind.INT64 or self.value_kind is ExampleKind.FLOAT
        if (self.min is not None or self.max is not None) and not numeric:
            out.append("`min`/`max` apply to numeric features")
        bounds_ok = True
        for key in ("min", "max"):
            value = getattr(self, key)
            if value is not None and not _is_number(value):
                out.append(f"`{key}` must be a finite number within int64 range, not {value!r}")
                bounds_ok = False
        if bounds_ok and self.min is not None and self.max is not None and self.min > self.max:
            out.append(f"`min` {self.min} is above `max` {self.max}")
        if self.regex is not None:
            if self.dtype is not DType.STRING:
                out.append("`regex` applies to string features")
            else:
                out.extend(_regex_problems(self.regex))
        if self.max_length is not None and not (
            _is_int(self.max_length) and 0 <= self.max_length <= _INT64_MAX
        ):
            out.append(f"`max_length` must be an integer from 0 to 2^63-1, not {self.max_length!r}")
        if self.scale is not None and not (_is_int(self.scale) and 0 <= self.scale <= 38):
            out.append(f"`scale` must be an integer from 0 to 38, not {self.scale!r}")
        for op, arg in self.ops:
            if op in (Op.LOWER, Op.UPPER, Op.STRIP) and self.dtype is not DType.STRING:
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
                if self.dtype not in (DType.STRING, DType.BYTES):
                    out.append("op `hash_bucket` applies to string or bytes features")
        return out

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


@dataclass(frozen=True)
class Schema:
    """An ordered set of features."""

    features: tuple[Feature, ...]
    origin: str = "declared"  # "declared", "inferred" or the path of the file it was loaded from
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.features:
            raise ValueError("a schema needs at least one feature")
        names = [f.name for f in self.features]
        names += [f.row_lengths_name for f in self.features if f.is_ragged]
        names += [f.part_name(p) for f in self.features if f.is_image for p in IMAGE_PARTS]
        names += [f.transformed_name for f in self.features if f.transformed_name not in (None, f.name)]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate feature names: {', '.join(dupes)}")

    @property
    def has_transforms(self) -> bool:
        return any(f.transform is not None for f in self.features)

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Top-level source columns to read, each once, in first-use order."""
        return tuple(dict.fromkeys(f.source_column for f in self.features))

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form the loader reads back (round-trips through `schema_from_dict`)."""
        return {"features": [feature_to_dict(f) for f in self.features]}


def feature_to_dict(f: Feature) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f.name, "type": f.dtype.value, "shape": list(f.shape)}
    if f.column is not None and f.column != f.name:
        d["column"] = f.column
    d["nulls"] = f.nulls.value
    optional = {
        "resize": list(f.resize) if f.resize else None,
        "method": f.method,
        "quality": f.quality,
        "channels": f.channels,
        "default": f.default,
        "unit": f.unit,
        "as": f.decimal_as,
        "scale": f.scale,
        "encode": f.encode,
        "min": f.min,
        "max": f.max,
        "max_length": f.max_length,
        "regex": f.regex,
        "description": f.description or None,
        "allowed": list(f.allowed) if f.allowed is not None else None,
    }
    d.update({k: v for k, v in optional.items() if v is not None})
    if f.narrow:
        d["narrow"] = True
    if f.transform is not None:
        d["transform"] = f.transform.to_dict()
    if f.ops:
        d["ops"] = [op.value if arg is None else {op.value: arg} for op, arg in f.ops]
    return d
