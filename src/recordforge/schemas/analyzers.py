"""Full-pass transforms a feature may declare (`transform:` in the schema), as plain data."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

__all__ = ["Analyzer", "Transform"]


class Analyzer(enum.Enum):
    VOCABULARY = "vocabulary"  # strings -> int64 ids, most frequent first (tft.compute_and_apply_vocabulary)
    SCALE_TO_Z_SCORE = "scale_to_z_score"  # (x - mean) / std over the fitting data
    SCALE_TO_0_1 = "scale_to_0_1"  # (x - min) / (max - min)
    BUCKETIZE = "bucketize"  # int64 quantile bucket ids
    HASH_STRINGS = "hash_strings"  # strings -> int64 in [0, hash_buckets) (no analysis pass)

    @property
    def takes_strings(self) -> bool:
        """Whether the analyzer reads strings (otherwise numbers)."""
        return self in (Analyzer.VOCABULARY, Analyzer.HASH_STRINGS)


# Parameters each analyzer takes: name -> (type, required).
_PARAMS: dict[Analyzer, dict[str, tuple[type[int] | type[float], bool]]] = {
    Analyzer.VOCABULARY: {
        "top_k": (int, False),
        "frequency_threshold": (int, False),
        "num_oov_buckets": (int, False),
    },
    Analyzer.SCALE_TO_Z_SCORE: {},
    Analyzer.SCALE_TO_0_1: {},
    Analyzer.BUCKETIZE: {"num_buckets": (int, True), "epsilon": (float, False)},
    Analyzer.HASH_STRINGS: {"hash_buckets": (int, True)},
}

_MAY_BE_ZERO = ("frequency_threshold", "num_oov_buckets")


@dataclass(frozen=True)
class Transform:
    """One analyzer applied to one feature; `output` names the written feature (default: the
    feature's own name, replacing the raw value)."""

    analyzer: Analyzer
    params: tuple[tuple[str, Any], ...] = ()
    output: str | None = None

    def param(self, name: str, default: Any = None) -> Any:
        return dict(self.params).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {self.analyzer.value: dict(self.params)}
        if self.output is not None:
            d["output"] = self.output
        return d

    @staticmethod
    def from_dict(raw: Any) -> tuple[Transform | None, list[str]]:
        """`{vocabulary: {top_k: 10}, output: name}`: one analyzer key, its parameters, an output."""
        if not isinstance(raw, dict):
            return None, ["`transform` must be a mapping like {scale_to_z_score: {}}"]
        raw = {k: v for k, v in raw.items() if not str(k).startswith("__")}
        output = raw.pop("output", None)
        errs = []
        if output is not None and not isinstance(output, str):
            errs.append("`transform.output` must be a feature name")
        known = ", ".join(a.value for a in Analyzer)
        if len(raw) != 1:
            return None, [*errs, f"`transform` needs exactly one of {known} (and optionally `output`)"]
        ((key, params),) = raw.items()
        try:
            analyzer = Analyzer(key)
        except ValueError:
            return None, [*errs, f"unknown transform {key!r} (known: {known})"]
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return None, [*errs, f"`{key}` takes a mapping of parameters, e.g. {{}}"]
        params = {k: v for k, v in params.items() if not str(k).startswith("__")}
        allowed = _PARAMS[analyzer]
        for name, value in params.items():
            if name not in allowed:
                errs.append(f"`{key}` has no parameter {name!r} (known: {', '.join(allowed) or 'none'})")
            elif isinstance(value, bool) or not isinstance(value, allowed[name][0] | int):
                errs.append(f"`{key}.{name}` must be a {allowed[name][0].__name__}")
            elif value < (0 if name in _MAY_BE_ZERO else 1e-12):
                errs.append(f"`{key}.{name}` must be {'0 or more' if name in _MAY_BE_ZERO else 'positive'}")
        for name, (_, required) in allowed.items():
            if required and name not in params:
                errs.append(f"`{key}` needs `{name}`")
        if errs:
            return None, errs
        return Transform(analyzer, tuple(sorted(params.items())), output), []
