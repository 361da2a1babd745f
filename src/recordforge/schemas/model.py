"""The schema model: its features and sequence block, as data, with everything else derived from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recordforge.schemas.feature import Feature
from recordforge.schemas.kinds import IMAGE_PARTS
from recordforge.schemas.sequence_spec import SequenceSpec

__all__ = ["Feature", "Schema", "feature_to_dict"]


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
