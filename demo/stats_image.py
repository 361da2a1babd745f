"""The stats page's content drawn with PIL into one PNG, the README's picture (docs/architecture.md)."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from recordforge.tools.stats_format import (
    _BINS,
    _distinct,
    _is_list,
    _positions,
    _short,
    format_number,
    histogram,
    thumbnail,
)

__all__ = ["main", "stats_png"]

_W_HIST, _H_HIST = 190, 54  # one histogram's bars
_COLUMNS = (
    ("feature", 130),
    ("kind", 48),
    ("present", 66),
    ("missing", 60),
    ("min", 150),
    ("max", 150),
    ("mean", 116),
    ("std", 86),
)
_BAR, _INK, _GREY, _RULE = (74, 120, 181), (30, 30, 30), (110, 110, 110), (215, 215, 215)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow without FreeType sizes
        return ImageFont.load_default()


class _Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.image = Image.new("RGB", (width, height), "white")
        self.draw = ImageDraw.Draw(self.image)
        self.small, self.text, self.big = _font(11), _font(13), _font(17)

    def write(
        self, xy: tuple[float, float], text: str, font: Any = None, fill: Any = _INK, **kw: Any
    ) -> None:
        self.draw.text(xy, text, font=font or self.text, fill=fill, **kw)

    def hist(self, x: int, y: int, counts: np.ndarray, lo: str, hi: str, exact: bool, label: str) -> int:
        """Bars with their caption above, the largest count and 0 on the y axis, the value
        range under the x axis, and each bar's count when there are few bars. Returns the width."""
        left, top = 44, _TOP
        self.write((x, y), label, self.small, _GREY)
        base = y + top + _H_HIST
        peak = int(counts.max()) or 1
        bar = _W_HIST / len(counts)
        for i, c in enumerate(counts.tolist()):
            h = c / peak * (_H_HIST - 4)
            x0 = x + left + i * bar
            if c:
                self.draw.rectangle([x0, base - h, x0 + max(bar - 1, 1), base], fill=_BAR)
            if len(counts) <= 12 and c:
                self.write((x0 + bar / 2, base - h - 1), f"{c:,}", self.small, anchor="mb")
        self.draw.line([x + left, y + top, x + left, base], fill=_GREY)
        self.draw.line([x + left, base, x + left + _W_HIST, base], fill=_GREY)
        self.write((x + left - 3, y + top), ("" if exact else "~") + f"{peak:,}", self.small, anchor="ra")
        self.write((x + left - 3, base), "0", self.small, anchor="rs")
        self.write((x + left, base + 2), lo, self.small, _GREY)
        self.write((x + left + _W_HIST, base + 2), hi, self.small, _GREY, anchor="ra")
        return left + _W_HIST + 16


_TOP = 26  # caption, then room for the counts written over the tallest bars
_H_CELL = _TOP + _H_HIST + 18  # a histogram's height with its caption and x labels


def _value_hist(c: _Canvas, s: Any, x: int, y: int, position: int | None = None) -> int:
    counts, edges, exact = histogram(s, position)
    if not len(counts):
        return 0
    kind = s.kind
    small_ints = kind == "int64" and len(edges) < _BINS + 1
    lo = format_number(float(edges[0] + 0.5) if small_ints else float(edges[0]), kind, s.logical)
    hi = format_number(float(edges[-1] - 0.5) if small_ints else float(edges[-1]), kind, s.logical)
    label = "values" if position is None else f"position [{position}]"
    return c.hist(x, y, counts, lo, hi, exact, label + ("" if exact else " (sample, scaled)"))


def _pictures(c: _Canvas, name: str, s: Any, result: dict[str, Any], x: int, y: int, draw: bool) -> int:
    """The distribution cell of one feature from (x, y); returns its height (draws if `draw`)."""
    lines: list[list[tuple[str, Any]]] = []  # rows of (what, argument)
    if s.kind in ("int64", "float") and s.values:
        positions = _positions(s)
        lines.append([("hist", p) for p in positions] if positions else [("hist", None)])
    if s.formats:
        formats = ", ".join(f"{k}: {v:,}" for k, v in s.formats.most_common())
        lines.append([("text", f"image formats: {formats}")])
        lines.append([("thumbs", None)])
        sizes = [
            ("dim", (part, result["features"].get(f"{name}/{part}") or s.dims.get(part)))
            for part in ("height", "width", "channels")
        ]
        lines.append([d for d in sizes if d[1][1] is not None and d[1][1].values])
    elif s.top:
        lines.append([("text", _distinct(s) + ", most common:")])
        for v, n in s.top.most_common(4):
            lines.append([("text", f"   {_short(v, 40)}  {n:,}")])
    if _is_list(s):
        lines.append([("lengths", None)])
    height = 0
    for row in lines:
        if not row:
            continue
        what = row[0][0]
        h = {"text": 16, "thumbs": 52}.get(what, _H_CELL)
        if draw:
            at = x
            for kind, arg in row:
                if kind == "hist":
                    at += _value_hist(c, s, at, y + height, arg)
                elif kind == "dim":
                    part, dim = arg
                    at += _value_hist(c, dim, at, y + height) if dim.values else 0
                    c.write((at - _W_HIST - 16 + 44, y + height), part, c.small, _GREY)
                elif kind == "text":
                    c.write((at, y + height), arg, c.small)
                elif kind == "thumbs":
                    _thumbs(c, s, at, y + height)
                elif kind == "lengths":
                    items = sorted(s.lengths.items())
                    counts = np.array([n for _, n in items])
                    c.hist(at, y + height, counts, str(items[0][0]), str(items[-1][0]), True, "list lengths")
        height += h
    return height


def _per_row(s: Any) -> int:
    """The most histograms one row of a feature's cell holds."""
    return max(len(_positions(s)), 3 if s.formats else 1)


def _thumbs(c: _Canvas, s: Any, x: int, y: int) -> None:
    for raw in s.thumbs:
        tile = thumbnail(raw, 48, 40, 48)
        if tile is None:
            continue
        c.image.paste(tile, (x, y))
        x += tile.width + 4


def stats_png(result: dict[str, Any], path: str, features: list[str] | None = None) -> None:
    """Draws `stats()`'s result (all features, or those named) into a PNG at `path`."""
    names = [n for n in result["features"] if features is None or n in features]
    table_w = sum(w for _, w in _COLUMNS)
    widest = max((_per_row(result["features"][n]) for n in names), default=1)
    width = 12 + table_w + widest * (_W_HIST + 60)
    probe = _Canvas(1, 1)
    heights = [max(_pictures(probe, n, result["features"][n], result, 0, 0, False), 34) + 12 for n in names]
    head = 78
    c = _Canvas(width, head + sum(heights) + 10)
    n = result["records"]
    c.write((12, 10), f"recordforge stats {result['path']}: {n:,} records", c.big)
    c.write(
        (12, 32),
        "A rendering of the stats page's content (recordforge stats --html) drawn with PIL, "
        "not a browser screenshot.",
        c.small,
        _GREY,
    )
    x = 12
    for title, w in _COLUMNS:
        c.write((x, 56), title, c.text, _GREY)
        x += w
    c.write((x, 56), "distribution", c.text, _GREY)
    y = head
    for name, h in zip(names, heights, strict=True):
        s = result["features"][name]
        c.draw.line([0, y - 4, width, y - 4], fill=_RULE)
        numeric = s.kind in ("int64", "float") and s.values
        cells = [
            name,
            s.kind,
            f"{s.present:,}",
            f"{n - s.present:,}",
            format_number(s.min, s.kind, s.logical) if numeric else "",
            format_number(s.max, s.kind, s.logical) if numeric else "",
            format_number(s.mean, "float", s.logical) if numeric else "",
            format_number(s.std) if numeric else "",
        ]
        x = 12
        for (_, w), text in zip(_COLUMNS, cells, strict=True):
            c.write((x, y), text)
            x += w
        if s.logical:
            c.write((12, y + 16), s.logical, c.small, _GREY)
        _pictures(c, name, s, result, x, y, True)
        y += h
    # A few colours are all the picture has: a palette keeps the file small.
    c.image.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(path, optimize=True)


def main(argv: list[str] | None = None) -> None:
    from recordforge.tools.stats import stats

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("path", help="a bundle or TFRecord file, as `recordforge stats` takes")
    parser.add_argument("png", help="where to write the picture")
    parser.add_argument("--features", default=None, help="comma-separated features to draw (default: all)")
    args = parser.parse_args(argv)
    result = stats(args.path)
    stats_png(result, args.png, args.features.split(",") if args.features else None)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
