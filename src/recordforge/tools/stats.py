"""stats: per-feature counts, missing, min/max/mean/std, top values and list-length histograms."""

from __future__ import annotations

import html
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recordforge.tools.progress import Progress
from recordforge.tools.records import parse_example, read_records, record_files

__all__ = ["FeatureStats", "format_stats", "stats", "stats_html"]

_CHUNK = 8192
_SAMPLE = 20000


@dataclass
class FeatureStats:
    """Exact running statistics of one feature (numeric moments merged chunk by chunk)."""

    kind: str = "none"
    present: int = 0
    values: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float | None = None
    max: float | None = None
    top: Counter = field(default_factory=Counter)
    lengths: Counter = field(default_factory=Counter)
    sample: list[float] = field(default_factory=list)
    _pending: list[float] = field(default_factory=list)

    def add(self, kind: str, values: list[Any]) -> None:
        if kind != "none":
            self.kind = kind
        self.present += 1
        self.lengths[len(values)] += 1
        if kind == "bytes":
            self.top.update(v[:64] for v in values)
        elif kind in ("int64", "float"):
            self._pending.extend(values)
            if len(self._pending) >= _CHUNK:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk = np.asarray(self._pending, dtype=np.float64)
        self._pending = []
        if len(self.sample) < _SAMPLE:
            self.sample.extend(chunk[: _SAMPLE - len(self.sample)].tolist())
        finite = chunk[np.isfinite(chunk)]
        n, m = len(finite), float(finite.mean()) if len(finite) else 0.0
        m2 = float(((finite - m) ** 2).sum()) if len(finite) else 0.0
        total = self.values + n
        if n:
            delta = m - self.mean
            self.mean += delta * n / total
            self.m2 += m2 + delta * delta * self.values * n / total
            lo, hi = float(finite.min()), float(finite.max())
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
        self.values = total

    def finish(self) -> None:
        self._flush()

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.values) if self.values else float("nan")


def stats(path: str) -> dict[str, Any]:
    """Statistics of every record of a bundle (all shards) or of one TFRecord file."""
    files = record_files(path)
    per: dict[str, FeatureStats] = {}
    records = 0
    progress = Progress("stats", len(files))
    for file, compression in files:
        n = 0
        for _, raw in read_records(file, compression):
            n += 1
            for name, (kind, values) in parse_example(raw).items():
                per.setdefault(name, FeatureStats()).add(kind, values)
        records += n
        progress.update(files=1, records=n)
    progress.done()
    for s in per.values():
        s.finish()
    return {"path": path.rstrip("/"), "records": records, "features": dict(sorted(per.items()))}


def format_stats(result: dict[str, Any]) -> str:
    n = result["records"]
    head = (
        f"{'feature':28} {'kind':6} {'count':>9} {'missing':>8} {'min':>12} {'max':>12} "
        f"{'mean':>12} {'std':>12}  lengths / top values"
    )
    lines = [f"{result['path']}: {n} records", "", head, "-" * len(head)]
    for name, s in result["features"].items():
        if s.kind in ("int64", "float") and s.values:
            nums = f"{s.min:>12.6g} {s.max:>12.6g} {s.mean:>12.6g} {s.std:>12.6g}"
        else:
            nums = f"{'':>12} {'':>12} {'':>12} {'':>12}"
        lengths = ",".join(f"{k}:{v}" for k, v in sorted(s.lengths.items())[:6])
        top = ""
        if s.kind == "bytes":
            top = "  top " + ", ".join(f"{_short(v)}:{c}" for v, c in s.top.most_common(3))
        lines.append(
            f"{name[:28]:28} {s.kind:6} {s.present:>9} {n - s.present:>8} {nums}  len {lengths}{top}"
        )
    return "\n".join(lines)


def _short(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = value.hex()
    return repr(text if len(text) <= 16 else text[:15] + "…")


def _svg_bars(counts: list[int], labels: list[str], width: int = 220, height: int = 60) -> str:
    if not counts:
        return ""
    top = max(counts) or 1
    bar = width / len(counts)
    rects = "".join(
        f'<rect x="{i * bar:.1f}" y="{height - c / top * height:.1f}" width="{max(bar - 1, 1):.1f}" '
        f'height="{c / top * height:.1f}"><title>{html.escape(labels[i])}: {c}</title></rect>'
        for i, c in enumerate(counts)
    )
    return f'<svg width="{width}" height="{height}" class="h">{rects}</svg>'


def stats_html(result: dict[str, Any]) -> str:
    """A self-contained page: one row per feature, with a value and a list-length histogram."""
    rows = []
    for name, s in result["features"].items():
        hist = ""
        if s.sample:
            sample = np.asarray(s.sample)
            sample = sample[np.isfinite(sample)]
            if len(sample):
                counts, edges = np.histogram(sample, bins=20)
                hist = _svg_bars(
                    counts.tolist(), [f"{edges[i]:.4g}..{edges[i + 1]:.4g}" for i in range(len(counts))]
                )
        elif s.kind == "bytes":
            common = s.top.most_common(10)
            hist = _svg_bars([c for _, c in common], [_short(v) for v, _ in common])
        lengths = sorted(s.lengths.items())
        len_hist = _svg_bars([c for _, c in lengths], [f"length {k}" for k, _ in lengths])
        nums = (
            f"{s.min:.6g}</td><td>{s.max:.6g}</td><td>{s.mean:.6g}</td><td>{s.std:.6g}"
            if s.values and s.kind != "bytes"
            else "</td><td></td><td></td><td>"
        )
        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{s.kind}</td><td>{s.present}</td>"
            f"<td>{result['records'] - s.present}</td><td>{nums}</td><td>{hist}</td>"
            f"<td>{len_hist}</td></tr>"
        )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>RecordForge stats: {html.escape(result["path"])}</title>
<style>body{{font:14px sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right}}td:first-child{{text-align:left}}
svg.h rect{{fill:#4a78b5}}</style></head><body>
<h1>{html.escape(result["path"])}</h1><p>{result["records"]} records</p>
<table><tr><th>feature</th><th>kind</th><th>count</th><th>missing</th><th>min</th><th>max</th>
<th>mean</th><th>std</th><th>values</th><th>list lengths</th></tr>
{"".join(rows)}</table></body></html>
"""
