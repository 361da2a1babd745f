"""A labelled grid of the first images of a bundle or file, like the tutorials' image grids."""

from __future__ import annotations

import io
import math
from typing import Any

from recordforge.tools.records import parse_example, read_records, record_files

__all__ = ["image_grid"]

TILE = 128
_LABEL_H = 14


def _is_image(value: bytes) -> bool:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(value)) as im:
            im.verify()
        return True
    except Exception:
        return False


def _records(path: str, n: int) -> list[dict[str, tuple[str, list[Any]]]]:
    records = []
    for file, compression in record_files(path):
        for _, raw in read_records(file, compression):
            records.append(parse_example(raw))
            if len(records) >= n:
                return records
    return records


def image_grid(
    path: str,
    png_path: str,
    *,
    n: int = 16,
    image_feature: str | None = None,
    label_feature: str | None = None,
) -> dict[str, Any]:
    """Writes a PNG grid of the first `n` images; a small image is enlarged by the largest whole
    factor that fits the tile (nearest neighbour: every pixel stays exact), a larger one is
    shrunk to fit. Returns what it used."""
    from PIL import Image, ImageDraw

    records = _records(path, n)
    if not records:
        raise ValueError(f"{path}: no records")
    first = records[0]
    if image_feature is None:
        candidates = [
            k for k, (kind, v) in sorted(first.items()) if kind == "bytes" and v and _is_image(v[0])
        ]
        if not candidates:
            raise ValueError(f"{path}: no feature holds encoded images")
        image_feature = candidates[0]
    if label_feature is None:
        for key in ("label", "label_name", "class"):
            if key in first:
                label_feature = key
                break
    cols = math.ceil(math.sqrt(len(records)))
    rows = math.ceil(len(records) / cols)
    grid = Image.new("RGB", (cols * TILE, rows * (TILE + _LABEL_H)), "white")
    draw = ImageDraw.Draw(grid)
    for i, rec in enumerate(records):
        x, y = (i % cols) * TILE, (i // cols) * (TILE + _LABEL_H)
        values = rec.get(image_feature, ("", []))[1]
        if values:
            with Image.open(io.BytesIO(values[0])) as im:
                im = im.convert("RGB")
                if im.width > TILE or im.height > TILE:
                    im.thumbnail((TILE, TILE))
                else:
                    k = TILE // max(im.width, im.height)
                    im = im.resize((im.width * k, im.height * k), Image.Resampling.NEAREST)
                grid.paste(im, (x, y))
        if label_feature and label_feature in rec:
            value = rec[label_feature][1]
            text = (
                value[0].decode("utf-8", "replace")
                if value and isinstance(value[0], bytes)
                else str(value[0] if value else "")
            )
            draw.text((x + 2, y + TILE), text[:20], fill="black")
    grid.save(png_path, format="PNG")
    return {
        "png": png_path,
        "images": len(records),
        "image_feature": image_feature,
        "label_feature": label_feature,
        "columns": cols,
        "tile": TILE,
    }
