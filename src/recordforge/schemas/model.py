"""The schema model: what a feature is, as data, with everything else derived from it."""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DType", "ExampleKind", "Feature", "NullPolicy", "Schema", "normalize_name"]


class DType(enum.Enum):
    """The logical type a feature holds."""

    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    BYTES = "bytes"
    STRING = "string"
    BOOL = "bool"


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


VARIABLE = -1
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
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
    or `(-1,)` for a variable-length list.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...] = ()
    column: str | None = None
    nulls: NullPolicy = NullPolicy.ABSENT
    default: Any = None
    narrow: bool = False
    description: str = ""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ValueError(f"feature {self.name!r}: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason this feature is invalid, so that all can be reported at once."""
        out = []
        if not _NAME_RE.match(self.name):
            out.append(
                f"{self.name!r} is not a valid feature name (letters, digits, '_', '.', '-', '/'; "
                f"'{normalize_name(self.name)}' would be)"
            )
        if any(d == 0 or d < VARIABLE for d in self.shape):
            out.append(f"shape {list(self.shape)} has a dimension that is 0 or below -1")
        if VARIABLE in self.shape and self.shape != (VARIABLE,):
            out.append(f"shape {list(self.shape)}: only [-1] may be variable-length")
        if len(self.shape) > 2:
            out.append(f"shape {list(self.shape)} has more than two dimensions")
        if self.dtype is DType.FLOAT64 and not self.narrow:
            out.append(
                "float64 cannot be stored in a tf.train.Example float_list (32-bit) without losing "
                "precision; add `narrow: true` to accept float32, or declare `type: float32`"
            )
        if self.narrow and self.dtype is not DType.FLOAT64:
            out.append("`narrow` applies only to float64 features")
        if self.nulls is NullPolicy.DEFAULT:
            if self.default is None:
                out.append("`nulls: default` needs a `default:` value")
            else:
                out.extend(_default_problems(self))
        elif self.default is not None:
            out.append(f"`default:` is given but `nulls` is {self.nulls.value!r}")
        return out

    @property
    def source_column(self) -> str:
        return self.column if self.column is not None else self.name

    @property
    def kind(self) -> ExampleKind:
        if self.dtype in (DType.INT64, DType.BOOL):
            return ExampleKind.INT64
        if self.dtype in (DType.FLOAT32, DType.FLOAT64):
            return ExampleKind.FLOAT
        return ExampleKind.BYTES

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    @property
    def is_variable(self) -> bool:
        return self.shape == (VARIABLE,)

    @property
    def num_values(self) -> int | None:
        """Values per record for fixed shapes (1 for scalars), None for variable length."""
        return None if self.is_variable else math.prod(self.shape)


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
        DType.BOOL: (bool,),
        DType.FLOAT32: (int, float),
        DType.FLOAT64: (int, float),
        DType.BYTES: (str, bytes),
        DType.STRING: (str,),
    }[feature.dtype]
    bad = [v for v in values if not isinstance(v, expected) or (
        feature.dtype is DType.INT64 and isinstance(v, bool))]
    if bad:
        return [f"default value {bad[0]!r} is not a {feature.dtype.value}"]
    return []


@dataclass(frozen=True)
class Schema:
    """An ordered set of features; the order is the order of the written feature map's keys."""

    features: tuple[Feature, ...]
    origin: str = "declared"  # "declared", "inferred" or the path of the file it was loaded from
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.features:
            raise ValueError("a schema needs at least one feature")
        names = [f.name for f in self.features]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate feature names: {', '.join(dupes)}")

    @property
    def source_columns(self) -> tuple[str, ...]:
        """Source columns to read, each once, in first-use order."""
        return tuple(dict.fromkeys(f.source_column for f in self.features))

    def to_dict(self) -> dict[str, Any]:
        """The YAML/JSON form the loader reads back (round-trips through `schema_from_dict`)."""
        out = []
        for f in self.features:
            d: dict[str, Any] = {"name": f.name, "type": f.dtype.value, "shape": list(f.shape)}
            if f.column is not None and f.column != f.name:
                d["column"] = f.column
            d["nulls"] = f.nulls.value
            if f.default is not None:
                d["default"] = f.default
            if f.narrow:
                d["narrow"] = True
            if f.description:
                d["description"] = f.description
            out.append(d)
        return {"features": out}
