"""The kinds a schema is made of: value types, Example lists, null policies, ops and shape markers."""

from __future__ import annotations

import enum
import re

__all__ = [
    "DECIMAL_AS",
    "DType",
    "ExampleKind",
    "IMAGE_ENCODINGS",
    "IMAGE_PARTS",
    "NullPolicy",
    "Op",
    "RAGGED",
    "RESIZE_METHODS",
    "TIME_UNITS",
    "VARIABLE",
    "normalize_name",
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
_NORMALIZE_RE = re.compile(r"[^a-z0-9_]+")


def normalize_name(column: str) -> str:
    """Map a source column name to a valid feature name: lower case, other characters to `_`."""
    name = _NORMALIZE_RE.sub("_", column.strip().lower()).strip("_")
    if not name:
        name = "feature"
    if name[0].isdigit():
        name = "_" + name
    return name
