"""The stats as a terminal table and as a self-contained HTML page."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from recordforge.tools.stats import FeatureStats

__all__ = ["format_number", "format_stats", "histogram", "stats_html", "thumbnail"]

_UNITS = {"s": 1, "ms": 1e3, "us": 1e6, "ns": 1e9}
_BINS = 20


def format_number(value: float | int | None, kind: str = "float", logical: str | None = None) -> str:
    if value is None:
        return ""
    if logical and logical.startswith("timestamp[") and math.isfinite(value):
        unit = logical[len("timestamp[") : -1]
        seconds = value / _UNITS.get(unit, 1)
        try:
            return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat().replace("+00:00", "Z")
        except (OverflowError, OSError, ValueError):
            pass
    if logical and logical.startswith("date") and math.isfinite(value):
        try:
            return (dt.date(1970, 1, 1) + dt.timedelta(days=round(value))).isoformat()
        except OverflowError:
            pass
    if isinstance(value, int) or (kind == "int64" and float(value).is_integer()):
        return f"{int(value):,}"
    if not math.isfinite(value):
        return str(value)
    magnitude = abs(value)
    if magnitude == 0:
        return "0"
    if 1e-3 <= magnitude < 1e15:
        digits = max(0, 3 - math.floor(math.log10(magnitude)))
        return f"{value:,.{digits}f}"
    return f"{value:.4g}"


def histogram(s: FeatureStats, position: int | None = None) -> tuple[np.ndarray, np.ndarray, bool]:
    """(counts, bin edges, exact?) from the feature's sample, scaled to all its values."""
    sample = s.sample if position is None else s.sample[s.sample_pos == position]
    sample = sample[np.isfinite(sample)]
    if not len(sample):
        return np.zeros(0), np.zeros(0), True
    lo, hi = float(sample.min()), float(sample.max())
    if s.kind == "int64" and hi - lo < _BINS:
        edges = np.arange(lo, hi + 2) - 0.5
    else:
        edges = np.linspace(lo, hi if hi > lo else lo + 1, _BINS + 1)
    counts, edges = np.histogram(sample, bins=edges)
    finite = s.values - s.nan - s.inf
    share = finite / (s.width if position is not None and s.width and s.width > 0 else 1)
    exact = len(sample) >= share
    if not exact:
        counts = np.round(counts * share / len(sample)).astype(np.int64)
    return counts, edges, exact


def _is_list(s: FeatureStats) -> bool:
    """Lengths say something only where they vary beyond present/absent (not for [8])."""
    return len(s.lengths) > 1 and any(k > 1 for k in s.lengths)


def _positions(s: FeatureStats) -> list[int]:
    if s.width is not None and 1 < s.width <= 16 and s.kind in ("int64", "float"):
        return list(range(s.width))
    return []


def _short(value: bytes, limit: int = 24) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(value)} bytes>"
    return repr(text if len(text) <= limit else text[: limit - 1] + "…")


def _distinct(s: FeatureStats) -> str:
    n, exact = s.distinct
    return f"{n:,} distinct" if exact else f"~{n:,} distinct (estimate)"


def format_stats(result: dict[str, Any]) -> str:
    n = result["records"]
    head = (
        f"{'feature':24} {'kind':6} {'present':>10} {'missing':>9} {'min':>22} {'max':>22} "
        f"{'mean':>22} {'std':>12}"
    )
    lines = [f"{result['path']}: {n:,} records", "", head, "-" * len(head)]
    if result.get("note"):
        lines[1:1] = [result["note"]]
    for name, s in result["features"].items():
        kind, logical = s.kind, s.logical
        if kind in ("int64", "float") and s.values:
            nums = (
                f"{format_number(s.min, kind, logical):>22} {format_number(s.max, kind, logical):>22} "
                f"{format_number(s.mean, 'float', logical):>22} {format_number(s.std):>12}"
            )
        else:
            nums = " " * 81
        lines.append(f"{name[:24]:24} {kind:6} {s.present:>10,} {n - s.present:>9,} {nums}".rstrip())
        notes = []
        if _is_list(s):
            lengths = ", ".join(f"{k}: {v:,}" for k, v in sorted(s.lengths.items())[:8])
            notes.append(f"list lengths {lengths}")
        for p in _positions(s):
            sel = s.sample[s.sample_pos == p]
            if len(sel):
                notes.append(
                    f"[{p}] {format_number(float(sel.min()), kind)}..{format_number(float(sel.max()), kind)}"
                    f" (sample)"
                )
        if s.formats:
            notes.append("image formats " + ", ".join(f"{k}: {v:,}" for k, v in s.formats.most_common()))
            sizes = [
                f"{part} {format_number(d.min, 'int64')}..{format_number(d.max, 'int64')}"
                for part, d in s.dims.items()
                if d.values
            ]
            if sizes:
                notes.append("from the headers: " + ", ".join(sizes))
        elif s.top:
            top = ", ".join(f"{_short(v)}: {c:,}" for v, c in s.top.most_common(5))
            notes.append(f"{_distinct(s)}; top {top}")
        if s.long_values and not s.formats:
            notes.append(f"{s.long_values:,} values over 64 bytes (not counted as strings)")
        if s.nan or s.inf:
            notes.append(f"NaN {s.nan:,}, infinite {s.inf:,}")
        lines += [f"{'':24}   {note}" for note in notes]
    return "\n".join(lines)


def _svg(counts: np.ndarray, lo: str, hi: str, exact: bool, title: str) -> str:
    """Bars with the y range (0 to the largest count) and the x range written on the axes."""
    w, h, left, bottom = 260, 80, 46, 16
    if not len(counts):
        return ""
    top = int(counts.max()) or 1
    bar = (w - left) / len(counts)
    parts = [
        f'<svg width="{w}" height="{h + bottom + 4}" class="h" role="img"><title>{html.escape(title)}</title>'
    ]
    for i, c in enumerate(counts.tolist()):
        bh = c / top * (h - 4)
        parts.append(
            f'<rect x="{left + i * bar:.1f}" y="{h - bh:.1f}" width="{max(bar - 1, 1):.1f}" '
            f'height="{bh:.1f}"><title>{c:,}</title></rect>'
        )
        if len(counts) <= 12 and c:
            parts.append(
                f'<text x="{left + (i + 0.5) * bar:.1f}" y="{max(h - bh - 2, 9):.1f}" class="c">{c:,}</text>'
            )
    approx = "" if exact else "~"
    parts += [
        f'<line x1="{left}" y1="{h}" x2="{w}" y2="{h}" class="ax"/>',
        f'<line x1="{left}" y1="0" x2="{left}" y2="{h}" class="ax"/>',
        f'<text x="{left - 3}" y="9" class="y">{approx}{top:,}</text>',
        f'<text x="{left - 3}" y="{h}" class="y">0</text>',
        f'<text x="{left}" y="{h + bottom - 3}" class="x0">{html.escape(lo)}</text>',
        f'<text x="{w}" y="{h + bottom - 3}" class="x1">{html.escape(hi)}</text>',
        "</svg>",
    ]
    return "".join(parts)


def _value_hist(s: FeatureStats, position: int | None = None) -> str:
    counts, edges, exact = histogram(s, position)
    if not len(counts):
        return ""
    kind = s.kind
    lo = format_number(
        float(edges[0] + 0.5) if kind == "int64" and len(edges) < _BINS + 1 else float(edges[0]),
        kind,
        s.logical,
    )
    hi_edge = float(edges[-1] - 0.5) if kind == "int64" and len(edges) < _BINS + 1 else float(edges[-1])
    hi = format_number(hi_edge, kind, s.logical)
    label = "values" if position is None else f"position [{position}]"
    caption = "" if exact else " (from a uniform sample, scaled)"
    return (
        f'<div class="hist"><div class="cap">{label}{caption}</div>{_svg(counts, lo, hi, exact, label)}</div>'
    )


def _lengths_hist(s: FeatureStats) -> str:
    items = sorted(s.lengths.items())
    counts = np.array([c for _, c in items])
    return (
        f'<div class="hist"><div class="cap">list lengths</div>'
        f"{_svg(counts, str(items[0][0]), str(items[-1][0]), True, 'list lengths')}</div>"
    )


def thumbnail(raw: bytes, box: int, least: int, up_to: int) -> Any:
    """An image's bytes as an RGB PIL image fitting `box` pixels, scaled up by a whole factor
    (nearest neighbour, towards `up_to`) when its longer side is under `least`; None when the
    bytes do not decode."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as im:
            tile = im.convert("RGB")
    except Exception:  # noqa: BLE001 - an undecodable image is shown as nothing
        return None
    tile.thumbnail((box, box))
    if max(tile.size) < least:
        k = up_to // max(tile.size)
        tile = tile.resize((tile.width * k, tile.height * k), Image.Resampling.NEAREST)
    return tile


def _thumbnails(s: FeatureStats) -> str:
    out = []
    for raw in s.thumbs:
        tile = thumbnail(raw, 64, 48, 48)
        if tile is None:
            continue
        buf = io.BytesIO()
        tile.save(buf, format="PNG")
        out.append(f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">')
    return f'<div class="thumbs">{"".join(out)}</div>' if out else ""


def _cell(name: str, s: FeatureStats, result: dict[str, Any]) -> str:
    parts = []
    if s.kind in ("int64", "float") and s.values:
        positions = _positions(s)
        parts += [_value_hist(s, p) for p in positions] if positions else [_value_hist(s)]
    if s.formats:
        formats = ", ".join(f"{k}: {v:,}" for k, v in s.formats.most_common())
        parts.append(f'<div class="cap">image formats: {formats}</div>{_thumbnails(s)}')
        for part in ("height", "width", "channels"):
            # The record's own height/width/channels features, else the images' headers.
            sibling = result["features"].get(f"{name}/{part}") or s.dims.get(part)
            if sibling is not None and sibling.values:
                parts.append(_value_hist(sibling).replace(">values<", f">{part}<", 1))
    elif s.top:
        rows = "".join(
            f'<tr class="v"><td>{html.escape(_short(v, 40))}</td><td>{c:,}</td></tr>'
            for v, c in s.top.most_common(10)
        )
        parts.append(f'<div class="cap">{_distinct(s)}</div><table class="top">{rows}</table>')
    if _is_list(s):
        parts.append(_lengths_hist(s))
    return "".join(parts)


def stats_html(result: dict[str, Any]) -> str:
    """A self-contained page: one row per feature, its numbers and its pictures."""
    n = result["records"]
    rows = []
    for name, s in result["features"].items():
        kind, logical = s.kind, s.logical
        numeric = kind in ("int64", "float") and s.values
        nums = [
            format_number(s.min, kind, logical) if numeric else "",
            format_number(s.max, kind, logical) if numeric else "",
            format_number(s.mean, "float", logical) if numeric else "",
            format_number(s.std) if numeric else "",
        ]
        label = html.escape(name) + (f'<div class="lg">{html.escape(logical)}</div>' if logical else "")
        rows.append(
            f"<tr><td>{label}</td><td>{kind}</td><td>{s.present:,}</td><td>{n - s.present:,}</td>"
            + "".join(f"<td>{html.escape(v)}</td>" for v in nums)
            + f'<td class="pics">{_cell(name, s, result)}</td></tr>'
        )
    return f"""<!doctype html><html><head><meta charset="utf-8">
<title>RecordForge stats: {html.escape(result["path"])}</title>
<style>body{{font:14px sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border-bottom:1px solid #ddd;padding:4px 8px;text-align:right;vertical-align:top}}
td:first-child,td.pics{{text-align:left}}.lg{{color:#777;font-size:12px}}
svg.h rect{{fill:#4a78b5}}svg.h text{{font:10px sans-serif;fill:#333}}svg.h .ax{{stroke:#999}}
svg.h .y{{text-anchor:end}}svg.h .x1{{text-anchor:end}}svg.h .c{{text-anchor:middle}}
.hist{{display:inline-block;margin:0 12px 6px 0}}.cap{{font-size:12px;color:#555}}
table.top td{{border:0;padding:0 8px 0 0;font-size:12px}}.thumbs img{{margin:2px;border:1px solid #ccc}}
</style></head><body>
<h1>{html.escape(result["path"])}</h1><p>{n:,} records</p>
<table><tr><th>feature</th><th>kind</th><th>present</th><th>missing</th><th>min</th><th>max</th>
<th>mean</th><th>std</th><th>distribution</th></tr>
{"".join(rows)}</table></body></html>
"""
