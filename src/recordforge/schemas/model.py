"""The schema model: what a feature is, as data, with everything else derived from it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from recordforge.schemas.analyzers import Transform
from recordforge.schemas.feature_checks import feature_problems
from recordforge.schemas.kinds import IMAGE_PARTS, RAGGED, VARIABLE, DType, ExampleKind, NullPolicy, Op

if TYPE_CHECKING:
    from recordforge.schemas.sequence import SequenceSpec

__all__ = ["Feature", "Schema", "feature_to_dict"]


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
        problems = feature_problems(self)
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


@dataclass(frozen=True)
class Schema:
    """An ordered set of features."""

    features: tuple[Feature, ...]
    origin: str = "declared"  # "declared", "inferred" or the path of the file it was loaded from
    notes: tuple[str, ...] = field(default=())
    sequence: SequenceSpec | None = None  # rows grouped by key into SequenceExamples (sequence.py)

    def __post_init__(self) -> None:
        if not self.features:
            raise ValueError("a schema needs at least one feature")
        if self.sequence is not None and self.sequence.problems(self.features):
            raise ValueError("sequence: " + "; ".join(self.sequence.problems(self.features)))
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
        out: dict[str, Any] = {"features": [feature_to_dict(f) for f in self.features]}
        if self.sequence is not None:
            out["sequence"] = self.sequence.to_dict()
        return out


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
