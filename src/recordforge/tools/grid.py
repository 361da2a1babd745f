"""A labelled grid of images of a bundle or file: a seeded sample spread over the labels."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

from recordforge.errors import RecordForgeError
from recordforge.files.storage import exists
from recordforge.images.headers import image_format
from recordforge.records.array_records import reading
from recordforge.records.bundle_json import load_metadata
from recordforge.records.chunks import read_record_chunks
from recordforge.records.wire import BYTES, INT64, Column, decode_batch
from recordforge.records.wire_keys import KeyTable
from recordforge.tools.records import record_files

__all__ = ["image_grid"]

TILE = 128
GAP = 8
_LABEL_H = 22


def _files(path: str, split: str | None) -> tuple[list[tuple[str, str]], bool]:
    """The shards to read, and whether records must still be picked by their `split` feature
    (an image folder's train/ and test/ are a feature, not split folders)."""
    out = path.rstrip("/")
    if split is None or not exists(f"{out}/metadata.json"):
        return record_files(path), split is not None
    meta = load_metadata(f"{out}/metadata.json")
    if not any("split" in s for s in meta["shards"]):
        return record_files(path), True
    shards = [s for s in meta["shards"] if s.get("split") == split]
    if not shards:
        names = sorted({s["split"] for s in meta["shards"]})
        raise RecordForgeError(f"{out}: no split {split!r} (splits: {names})")
    return [(f"{out}/{s['file']}", reading(meta)) for s in shards], False


def _first_value(col: Column, kind: int) -> dict[int, Any]:
    """{record: its first value} for the entries of `kind` with at least one value."""
    sel = np.flatnonzero((col.kind == kind) & (col.count > 0))
    counts = col.count[col.kind == kind]
    firsts = np.cumsum(counts) - counts
    at = firsts[np.searchsorted(np.flatnonzero(col.kind == kind), sel)]
    if kind == INT64:
        return dict(zip(col.rec[sel].tolist(), col.ints[at].tolist(), strict=True))
    return {
        r: col.blob[s:e].tobytes()
        for r, s, e in zip(col.rec[sel].tolist(), col.starts[at].tolist(), col.ends[at].tolist(), strict=True)
    }


def _pick_features(
    columns: dict[str, Column], image: str | None, label: str | None
) -> tuple[str, str | None]:
    if image is None:
        for name in sorted(columns):
            values = _first_value(columns[name], BYTES)
            if values and image_format(next(iter(values.values()))):
                image = name
                break
        if image is None:
            raise ValueError("no feature holds encoded images")
    if label is None:
        label = next((k for k in ("label", "label_name", "class", "label_id") if k in columns), None)
    return image, label


def _sample(
    path: str, n: int, split: str | None, image: str | None, label: str | None, seed: int
) -> tuple[list[tuple[Any, bytes]], str, str | None]:
    """Up to n (label, image bytes): every record draws a seeded random priority; each label keeps
    its n lowest; the grid takes them round robin over the labels."""
    rng = np.random.default_rng(seed)
    keys = KeyTable()
    kept: dict[Any, list[tuple[float, bytes]]] = {}
    files, by_feature = _files(path, split)
    wanted = split.encode() if split else b""
    for file, compression in files:
        for chunk in read_record_chunks(file, compression):
            batch = decode_batch(chunk.data, chunk.starts, chunk.ends, keys)
            if not batch.columns:
                continue
            image, label = _pick_features(batch.columns, image, label)
            if image not in batch.columns:
                continue
            images = _first_value(batch.columns[image], BYTES)
            labels: dict[int, Any] = {}
            if label in batch.columns:
                col = batch.columns[label]
                labels = _first_value(col, BYTES) or _first_value(col, INT64)
            priority = rng.random(batch.size)
            if by_feature:
                splits = _first_value(batch.columns["split"], BYTES) if "split" in batch.columns else {}
                images = {r: raw for r, raw in images.items() if splits.get(r) == wanted}
            for r, raw in images.items():
                bucket = kept.setdefault(labels.get(r), [])
                bucket.append((float(priority[r]), raw))
                if len(bucket) > 2 * n:
                    bucket.sort(key=lambda t: t[0])
                    del bucket[n:]
    if image is None:
        raise ValueError(f"{path}: no records")
    for bucket in kept.values():
        bucket.sort(key=lambda t: t[0])
    chosen: list[tuple[Any, bytes]] = []
    order = sorted(kept, key=lambda v: (v is None, str(v)))
    while len(chosen) < n and any(kept[k] for k in order):
        for k in order:
            if kept[k] and len(chosen) < n:
                chosen.append((k, kept[k].pop(0)[1]))
    return chosen, image, label


def image_grid(
    path: str,
    png_path: str,
    *,
    n: int = 16,
    image_feature: str | None = None,
    label_feature: str | None = None,
    split: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Writes a PNG grid of `n` images sampled over the labels; a small image is enlarged by the
    largest whole factor that fits the tile (nearest neighbour: every pixel stays exact), a larger
    one is shrunk to fit. Returns what it used."""
    from PIL import Image, ImageDraw, ImageFont

    chosen, image_feature, label_feature = _sample(path, n, split, image_feature, label_feature, seed)
    if not chosen:
        raise ValueError(f"{path}: no images in {image_feature!r}")
    cols = math.ceil(math.sqrt(len(chosen)))
    rows = math.ceil(len(chosen) / cols)
    grid = Image.new("RGB", (GAP + cols * (TILE + GAP), GAP + rows * (TILE + _LABEL_H + GAP)), "white")
    draw = ImageDraw.Draw(grid)
    font = ImageFont.load_default(size=16)
    for i, (label, raw) in enumerate(chosen):
        x = GAP + (i % cols) * (TILE + GAP)
        y = GAP + (i // cols) * (TILE + _LABEL_H + GAP)
        with Image.open(io.BytesIO(raw)) as src:
            im = src.convert("RGB")
            if im.width > TILE or im.height > TILE:
                im.thumbnail((TILE, TILE))
            else:
                k = TILE // max(im.width, im.height)
                im = im.resize((im.width * k, im.height * k), Image.Resampling.NEAREST)
            grid.paste(im, (x, y))
        if label is not None:
            text = label.decode("utf-8", "replace") if isinstance(label, bytes) else str(label)
            draw.text((x + 2, y + TILE + 2), text[:16], fill="black", font=font)
    grid.save(png_path, format="PNG")
    return {
        "png": png_path,
        "images": len(chosen),
        "image_feature": image_feature,
        "label_feature": label_feature,
        "labels": len({lbl for lbl, _ in chosen}),
        "columns": cols,
        "tile": TILE,
    }
