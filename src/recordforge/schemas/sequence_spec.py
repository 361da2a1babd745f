"""The schema's `sequence:` block as data: rows grouped by key into tf.train.SequenceExample."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from recordforge.schemas.feature import Feature
from recordforge.schemas.kinds import DType, NullPolicy

__all__ = [
    "CHUNK_FEATURE",
    "DEFAULT_MAX_GROUP_ROWS",
    "Longer",
    "POLICY_RULES",
    "SequenceSpec",
    "TFMD_SEQUENCE_FEATURE",
    "sequence_from_dict",
]

# The context feature that numbers the chunks of a group cut by `longer: split`.
CHUNK_FEATURE = "chunk_index"
# Dead-letter rules of rows the declared length policy leaves out (not bad data): they are
# rejected rows, but neither fail a strict run nor count against --max_rejected.
POLICY_RULES = frozenset(
    {"sequence_min_length", "sequence_max_length", "sequence_keep_last", "sequence_group_rows"}
)
# A group of more rows is never held whole (docs/sequences.md): cut or rejected as it is read.
DEFAULT_MAX_GROUP_ROWS = 1_000_000
# Where tfx-bsl's SequenceExampleRecord TFXIO looks for the feature lists in a TFMD schema.
TFMD_SEQUENCE_FEATURE = "##SEQUENCE##"
_KEYS = ("key", "order", "context", "max_length", "longer", "min_length", "max_group_rows")
_ORDER_TYPES = (DType.INT64, DType.TIMESTAMP, DType.DATE, DType.TIME, DType.FLOAT32, DType.STRING)


class Longer(enum.Enum):
    """What becomes of a group longer than `max_length` steps."""

    SPLIT = "split"  # consecutive chunks of max_length steps, numbered by CHUNK_FEATURE
    KEEP_LAST = "keep_last"  # the last max_length steps; the earlier rows are rejected
    REJECT = "reject"  # every row of the group is rejected


@dataclass(frozen=True)
class SequenceSpec:
    """Rows with the same `key` become one SequenceExample: the key and `context` features once
    (in `context`), every other feature as a feature list of one step per row, steps in `order`
    (ties broken by the step's encoded bytes, so the order never depends on the input's layout)."""

    key: tuple[str, ...]
    order: str
    context: tuple[str, ...] = ()
    max_length: int | None = None
    longer: Longer = Longer.SPLIT
    min_length: int = 1
    # The most rows of one group a worker holds: a larger group is never gathered whole. With
    # `longer: reject` or `keep_last` its rows are rejected or dropped as they are read (what
    # max_length would do to it anyway); otherwise (it cannot be cut without sorting it whole)
    # it is rejected, rule sequence_group_rows.
    max_group_rows: int = DEFAULT_MAX_GROUP_ROWS

    def context_names(self) -> tuple[str, ...]:
        """The features written once per sequence: the key, then the declared context."""
        return tuple(dict.fromkeys((*self.key, *self.context)))

    def problems(self, features: tuple[Feature, ...]) -> list[str]:
        """Every reason this block does not fit `features`, so that all are reported at once."""
        by_name = {f.name: f for f in features}
        out = []
        if not self.key:
            out.append("`key` names at least one feature")
        for name in (*self.key, self.order, *self.context):
            if name not in by_name:
                out.append(f"{name!r} is not a feature of the schema")
        for name in self.key:
            f = by_name.get(name)
            if f is not None and (not f.is_scalar or f.nulls is NullPolicy.ABSENT):
                out.append(f"key {name!r} must be a scalar that is never absent (`nulls: required`)")
        order = by_name.get(self.order)
        if order is not None:
            if not order.is_scalar or order.dtype not in _ORDER_TYPES or order.nulls is NullPolicy.ABSENT:
                out.append(
                    f"order {self.order!r} must be a scalar "
                    f"{'/'.join(t.value for t in _ORDER_TYPES)} that is never absent (`nulls: required`)"
                )
            if self.order in self.context_names():
                out.append(f"order {self.order!r} is a step feature: not in `key` or `context`")
        for f in features:
            if f.is_image:
                out.append(f"{f.name!r}: image features are not supported in sequences")
            elif f.transform is not None:
                out.append(f"{f.name!r}: `transform:` is not supported in sequences")
            elif f.name not in self.context_names() and (f.is_ragged or f.float64_bytes):
                out.append(f"step feature {f.name!r}: ragged and `encode: bytes` steps are not supported")
        if CHUNK_FEATURE in by_name and self.longer is Longer.SPLIT and self.max_length is not None:
            out.append(f"{CHUNK_FEATURE!r} is the chunk number `longer: split` writes: rename the feature")
        if self.max_length is not None and not (_is_int(self.max_length) and self.max_length >= 1):
            out.append(f"`max_length` must be an integer of 1 or more, not {self.max_length!r}")
        if not (_is_int(self.min_length) and self.min_length >= 1):
            out.append(f"`min_length` must be an integer of 1 or more, not {self.min_length!r}")
        elif self.max_length is not None and _is_int(self.max_length) and self.min_length > self.max_length:
            out.append(f"`min_length` {self.min_length} is above `max_length` {self.max_length}")
        if not (_is_int(self.max_group_rows) and self.max_group_rows >= 1):
            out.append(f"`max_group_rows` must be an integer of 1 or more, not {self.max_group_rows!r}")
        else:
            for name in ("max_length", "min_length"):
                value = getattr(self, name)
                if _is_int(value) and value > self.max_group_rows:
                    out.append(f"`{name}` {value} is above `max_group_rows` {self.max_group_rows}")
        return out

    @property
    def chunked(self) -> bool:
        return self.max_length is not None and self.longer is Longer.SPLIT

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": list(self.key), "order": self.order}
        if self.context:
            out["context"] = list(self.context)
        if self.max_length is not None:
            out.update(max_length=self.max_length, longer=self.longer.value)
        if self.min_length != 1:
            out["min_length"] = self.min_length
        if self.max_group_rows != DEFAULT_MAX_GROUP_ROWS:
            out["max_group_rows"] = self.max_group_rows
        return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sequence_from_dict(raw: Any) -> tuple[SequenceSpec | None, list[str]]:
    """The `sequence:` block of a schema document, or the problems with it."""
    if not isinstance(raw, dict):
        return None, [f"`sequence` must be a mapping with `key` and `order`, not {raw!r}"]
    errs = [f"unknown key `{k}` in `sequence` (known: {', '.join(_KEYS)})" for k in raw if k not in _KEYS]
    key = raw.get("key")
    key = [key] if isinstance(key, str) else key
    if not isinstance(key, list) or not key or not all(isinstance(k, str) for k in key):
        errs.append("`sequence.key` is a feature name or a list of them")
        key = []
    order = raw.get("order")
    if not isinstance(order, str):
        errs.append("`sequence.order` is the name of the feature that orders the steps")
    context = raw.get("context", [])
    if not isinstance(context, list) or not all(isinstance(c, str) for c in context):
        errs.append("`sequence.context` is a list of feature names")
        context = []
    longer = raw.get("longer", Longer.SPLIT.value)
    if longer not in [m.value for m in Longer]:
        errs.append(f"`sequence.longer: {longer}` is not one of {', '.join(m.value for m in Longer)}")
    if "longer" in raw and raw.get("max_length") is None:
        errs.append("`sequence.longer` needs `max_length`")
    if errs or not isinstance(order, str):
        return None, errs
    return (
        SequenceSpec(
            key=tuple(key),
            order=order,
            context=tuple(context),
            max_length=raw.get("max_length"),
            longer=Longer(longer),
            min_length=raw.get("min_length", 1),
            max_group_rows=raw.get("max_group_rows", DEFAULT_MAX_GROUP_ROWS),
        ),
        [],
    )
