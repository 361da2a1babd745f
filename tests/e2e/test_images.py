"""Images through the pipeline, decoded back by tf.data and compared pixel by pixel."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from conftest import published_root
from PIL import Image

import recordforge
from demo.sampledata import mnist_folder
from recordforge.pipelines.convert import run


def _save(path: Path, pixels: np.ndarray, fmt: str, **kw: object) -> bytes:
    mode = (
        {2: "L", 3: "RGB"}.get(pixels.ndim, "L")
        if pixels.ndim == 2
        else ("RGBA" if pixels.shape[2] == 4 else "RGB")
    )
    if pixels.dtype == np.uint16:
        im = Image.fromarray(pixels, mode="I;16")
    else:
        im = Image.fromarray(pixels, mode=mode)
    buf = io.BytesIO()
    im.save(buf, format=fmt, **kw)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def _records(out: Path) -> list[dict]:
    """Every record, split by split where the output has splits (a folder's train/, test/...)."""
    splits = list(recordforge.load_bundle(str(out))["metadata"].get("split_counts") or {}) or [None]
    return [
        {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in r.items()}
        for split in splits
        for r in recordforge.read(str(out), decode_images=True, split=split)
    ]


def test_mnist_folder_round_trips_pixel_exact(tmp_path: Path) -> None:
    written = mnist_folder(str(tmp_path / "mnist"), per_class=4)
    meta = run(["--format", "images", "--source", str(tmp_path / "mnist"), "--output", str(tmp_path / "out")])
    assert meta["compression"] == "none"  # image bytes: GZIP would cost CPU for ~nothing
    assert meta["labels"] == [str(d) for d in range(10)]
    assert meta["splits"] == ["test", "train"]
    assert meta["num_records"] == len(written)
    # The split folders are the output's splits: shards apart, read one split at a time.
    counts = {s: sum(f"/{s}/" in p for p, _ in written) for s in ("test", "train")}
    assert {k: v["records"] for k, v in meta["split_counts"].items()} == counts
    assert all(s["file"].split("/")[1] == s["split"] for s in meta["shards"])
    for split in ("test", "train"):
        got = [r["split"].numpy() for r in recordforge.read(str(tmp_path / "out"), split=split)]
        assert got == [split.encode()] * counts[split]
    by_path = {p: px for p, px in written}
    seen = 0
    for rec in _records(tmp_path / "out"):
        label = rec["label"].decode()
        split = rec["split"].decode()
        assert rec["label_id"] == int(label)
        matches = [
            p
            for p in by_path
            if f"/{split}/{label}/" in p and np.array_equal(by_path[p], rec["image"][:, :, 0])
        ]
        assert matches, (split, label)
        assert rec["image"].shape == (28, 28, 1)
        assert (rec["image/height"], rec["image/width"], rec["image/channels"]) == (28, 28, 1)
        assert rec["image/format"] == b"png"
        seen += 1
    assert seen == len(written)


def test_manifest_with_two_image_columns_and_bad_images(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    img = tmp_path / "img"
    img.mkdir()
    pixels = {
        "gray.png": rng.integers(0, 256, (9, 7), dtype=np.uint8),
        "rgb.png": rng.integers(0, 256, (5, 6, 3), dtype=np.uint8),
        "rgba.png": rng.integers(0, 256, (4, 3, 4), dtype=np.uint8),
        "deep.png": rng.integers(0, 65536, (6, 5), dtype=np.uint16),
        "photo.jpg": (np.linspace(0, 255, 16 * 16 * 3).reshape(16, 16, 3)).astype(np.uint8),
        "pic.bmp": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        "anim.gif": rng.integers(0, 256, (6, 6), dtype=np.uint8),
    }
    raw = {}
    for name, px in pixels.items():
        fmt = {"png": "PNG", "jpg": "JPEG", "bmp": "BMP", "gif": "GIF"}[name.rsplit(".", 1)[1]]
        raw[name] = _save(img / name, px, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    good = raw["rgb.png"]
    (img / "truncated.png").write_bytes(good[: len(good) // 2])
    (img / "empty.png").write_bytes(b"")
    (img / "text.png").write_bytes(b"not an image at all")
    names = list(pixels)
    bad = ["truncated.png", "empty.png", "text.png", "missing.png"]
    rows = [(f"img/{n}", f"img/{names[(i + 1) % len(names)]}", i) for i, n in enumerate(names)]
    rows += [(f"img/{b}", "img/gray.png", 100 + i) for i, b in enumerate(bad)]
    (tmp_path / "manifest.csv").write_text("front,back,id\n" + "".join(f"{a},{b},{i}\n" for a, b, i in rows))
    (tmp_path / "schema.yaml").write_text(
        yaml.safe_dump(
            {
                "features": [
                    {"name": "front", "type": "image", "nulls": "required"},
                    {"name": "back", "type": "image", "nulls": "required"},
                    {"name": "id", "type": "int64", "nulls": "required"},
                ]
            }
        )
    )
    meta = run(
        [
            "--format",
            "images",
            "--source",
            str(tmp_path / "manifest.csv"),
            "--schema",
            str(tmp_path / "schema.yaml"),
            "--output",
            str(tmp_path / "out"),
            "--max_rejected",
            "10",
        ]
    )
    assert meta["rows_written"] == len(names) and meta["rows_rejected"] == len(bad)
    assert meta["rejected_by_rule"] == {"image": len(bad)}
    rejected = [
        json.loads(x)
        for f in (published_root(tmp_path / "out") / "_rejected").glob("*.jsonl")
        for x in f.read_text().splitlines()
    ]
    reasons = {r["value"]: r["reason"] for r in rejected}
    assert "truncated PNG" in reasons["img/truncated.png"]
    assert "empty file" in reasons["img/empty.png"]
    assert "not a readable image" in reasons["img/text.png"]
    assert "cannot read" in reasons["img/missing.png"]

    spec = json.loads((tmp_path / "out" / "feature_spec.json").read_text())
    parsed = tf.io.parse_example(
        list(tf.data.TFRecordDataset([str(tmp_path / "out" / s["file"]) for s in meta["shards"]]).batch(100))[
            0
        ],
        recordforge.schemas.export.to_tf_feature_spec(spec),
    )
    for i in range(len(names)):
        front = names[int(parsed["id"][i])]
        # The original bytes, untouched.
        assert parsed["front"][i].numpy() == raw[front]
        px = pixels[front]
        data = parsed["front"][i]
        if front == "deep.png":
            decoded = tf.io.decode_png(data, dtype=tf.uint16).numpy()[:, :, 0]
            np.testing.assert_array_equal(decoded, px)
        elif front.endswith(".jpg"):
            decoded = tf.io.decode_image(data).numpy()
            assert np.abs(decoded.astype(int) - px.astype(int)).max() <= 8
        elif front.endswith(".gif"):
            decoded = tf.io.decode_image(data, expand_animations=False).numpy()
            np.testing.assert_array_equal(decoded, np.asarray(Image.open(img / front).convert("RGB")))
        else:
            decoded = tf.io.decode_image(data).numpy()
            np.testing.assert_array_equal(decoded.reshape(px.shape) if px.ndim == 2 else decoded, px)
        assert tuple(int(parsed[f"front/{k}"][i]) for k in ("height", "width", "channels")) == decoded.shape[
            :2
        ] + ((decoded.shape[2] if decoded.ndim == 3 else 1),)


@pytest.mark.parametrize("encode", ["raw", "png", "jpeg"])
def test_resize_and_reencode(tmp_path: Path, encode: str) -> None:
    src = tmp_path / "a.png"
    # A smooth picture: JPEG's declared tolerance is about photographs, not noise.
    yy, xx = np.mgrid[0:40, 0:30]
    px = np.stack([yy * 6, xx * 8, (yy + xx) * 3], axis=-1).astype(np.uint8)
    _save(src, px, "PNG")
    (tmp_path / "m.csv").write_text("image\na.png\n")
    feature = {
        "name": "image",
        "type": "image",
        "nulls": "required",
        "resize": [20, 10],
        "method": "bilinear",
        "encode": encode,
        "channels": 3,
    }
    if encode == "jpeg":
        feature["quality"] = 90
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"features": [feature]}))
    meta = run(
        [
            "--format",
            "images",
            "--source",
            str(tmp_path / "m.csv"),
            "--schema",
            str(tmp_path / "s.yaml"),
            "--output",
            str(tmp_path / "out"),
            "--compression",
            "gzip",
        ]
    )
    assert meta["compression"] == "gzip"  # an explicit --compression always wins
    expected = np.asarray(Image.open(src).convert("RGB").resize((10, 20), Image.Resampling.BILINEAR))
    if encode == "raw":
        (batch,) = list(recordforge.read(str(tmp_path / "out"), batch_size=8))
        got = batch["image"].numpy()[0]  # FixedLen raw of a declared size: decoded by read()
        assert got.shape == (20, 10, 3)
        np.testing.assert_array_equal(got, expected)
    else:
        (rec,) = _records(tmp_path / "out")
        got = rec["image"]
        assert got.shape == (20, 10, 3)
        if encode == "png":
            np.testing.assert_array_equal(got, expected)
        else:
            assert np.abs(got.astype(int) - expected.astype(int)).mean() < 3


def test_relative_folder_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mnist_folder(str(tmp_path / "digits"), per_class=1)
    monkeypatch.chdir(tmp_path)
    meta = run(["--format", "images", "--source", "digits/", "--output", "out"])
    assert meta["rows_written"] == meta["images"] == 20


def test_workers_convert_the_listing_the_pipeline_was_built_on(tmp_path: Path) -> None:
    """The folder is listed once at construction; workers sharing the driver's memory take that
    listing (no second walk), so an image added after launch is not half-included."""
    import apache_beam as beam

    from recordforge.pipelines.config import ConvertConfig
    from recordforge.pipelines.convert import DEFAULT_RUNNER, build
    from recordforge.pipelines.resolve import resolve
    from recordforge.transforms import image_folder

    written = mnist_folder(str(tmp_path / "digits"), per_class=2)
    walks = []
    real = image_folder.list_image_folder

    def counting(root: str) -> image_folder.ImageFolder:
        walks.append(root)
        return real(root)

    out = tmp_path / "out"
    p = beam.Pipeline(runner=DEFAULT_RUNNER)
    build(
        p,
        resolve(
            p.options,
            ConvertConfig(sources=(str(tmp_path / "digits"),), output=str(out), source_format="images"),
            look_at_output=False,
        ),
    )
    late = tmp_path / "digits" / "train" / "0" / "late.png"
    Image.fromarray(np.zeros((28, 28), np.uint8), mode="L").save(late)
    image_folder.list_image_folder = counting
    try:
        p.run().wait_until_finish()
    finally:
        image_folder.list_image_folder = real
    assert walks == []  # the worker did not list the folder again
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == meta["images"] == len(written)


def test_local_workers_get_the_listing_as_data_pickled_with_the_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader of a local run holds the listing the pipeline was built on: a worker unpickles it
    and lists nothing, even after the folder changed. One that holds none needs carried chunks."""
    import pickle

    from recordforge.transforms import image_folder

    mnist_folder(str(tmp_path / "digits"), per_class=1)
    folder = image_folder.list_image_folder(str(tmp_path / "digits"))
    ids = {label: i for i, label in enumerate(folder.labels)}
    expected = [(path, label, ids[label], split) for path, label, split in folder.entries]
    fn = pickle.loads(pickle.dumps(image_folder._LocalChunkFn(folder, 1 << 20)))
    walks: list[str] = []
    monkeypatch.setattr(image_folder, "_walk_local", lambda root: walks.append(root))
    late = tmp_path / "digits" / "train" / "0" / "late.png"
    Image.fromarray(np.zeros((28, 28), np.uint8), mode="L").save(late)
    fn.setup()
    fn.start_bundle()
    batches = [b for chunk in image_folder.chunk_ranges(folder.count, 8) for b in fn.process(chunk)]
    assert [tuple(r.values()) for b in batches for r in b.batch.to_pylist()] == expected
    assert [b.first_row for b in batches] == [0, 8, 16]
    assert walks == []
    spread = image_folder._LocalChunkFn(folder, 1 << 20, held=False)
    spread.setup()
    spread.start_bundle()
    with pytest.raises(ValueError, match="carries no listing"):
        list(spread.process((0, 8)))


def test_folder_batches_are_bounded_in_file_bytes_on_the_worker(tmp_path: Path) -> None:
    from recordforge.transforms import image_folder

    written = mnist_folder(str(tmp_path / "digits"), per_class=3)
    folder = image_folder.list_image_folder(str(tmp_path / "digits"))
    assert folder.sizes is None  # a local listing takes names only
    sizes = [os.path.getsize(path) for path, _, _ in folder.entries]
    cap = max(sizes) * 3  # about three images a batch
    fn = image_folder._LocalChunkFn(folder, cap)
    fn.setup()
    fn.start_bundle()
    batches = [b for chunk in image_folder.chunk_ranges(folder.count, 7) for b in fn.process(chunk)]
    paths = [p for b in batches for p in b.batch.column("path").to_pylist()]
    assert paths == [path for path, _, _ in folder.entries] and len(paths) == len(written)
    for b in batches:
        rows = range(b.first_row, b.first_row + b.batch.num_rows)
        assert b.batch.column("path").to_pylist() == [folder.entries[i][0] for i in rows]
        assert b.batch.num_rows == 1 or sum(sizes[i] for i in rows) <= cap
        # The worker read them as it cut the batches: the bytes travel with the paths.
        assert b.read["path"].to_pylist() == [Path(folder.entries[i][0]).read_bytes() for i in rows]
    assert len(batches) > len(folder.entries) // 7  # the cap split chunks


def test_a_local_folder_listing_is_by_folder_then_name_with_its_digest(tmp_path: Path) -> None:
    """What the walk lists (links to files yes, links to folders not followed, a folder named like
    an image is a folder, a dangling link named like an image is listed so that its row is
    rejected rather than lost), in what order, labelled how; the digest is
    the sha256 of the NUL-joined paths (kept stable: --if_changed compares it across versions)."""
    import hashlib

    from recordforge.transforms import image_folder

    root = tmp_path / "pics"
    png = np.zeros((2, 2), np.uint8)
    for rel in [
        "top.png",
        "train/cat/b.png",
        "train/cat/A.PNG",
        "train/dog/x.jpeg",
        "train/odd.png/c.png",
        "test/cat/z.gif",
        "train/solo.png",
        "elsewhere/e.png",
    ]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(png, mode="L").save(root / rel, format="PNG")
    (root / "train/cat/notes.txt").write_text("not an image")
    (root / "train/cat/link.png").symlink_to(root / "top.png")
    (root / "train/cat/gone.png").symlink_to(root / "missing.png")
    (root / "train/linked").symlink_to(root / "elsewhere", target_is_directory=True)

    folder = image_folder.list_image_folder(str(root) + "/")
    r = str(root)
    expected = [
        (f"{r}/top.png", "", ""),
        (f"{r}/elsewhere/e.png", "elsewhere", ""),
        (f"{r}/test/cat/z.gif", "cat", "test"),
        (f"{r}/train/solo.png", "train", ""),  # a split folder only with label folders under it
        (f"{r}/train/cat/A.PNG", "cat", "train"),
        (f"{r}/train/cat/b.png", "cat", "train"),
        (f"{r}/train/cat/gone.png", "cat", "train"),
        (f"{r}/train/cat/link.png", "cat", "train"),
        (f"{r}/train/dog/x.jpeg", "dog", "train"),
        (f"{r}/train/odd.png/c.png", "odd.png", "train"),
    ]
    assert folder.entries == expected and folder.count == len(expected)
    assert folder.labels == ["", "cat", "dog", "elsewhere", "odd.png", "train"]
    assert folder.splits == ["test", "train"]
    assert folder.digest == hashlib.sha256("\0".join(p for p, _, _ in expected).encode()).hexdigest()
    ids = {label: i for i, label in enumerate(folder.labels)}
    rows = [
        tuple(row.values())
        for _, batch, _ in image_folder.chunk_entries(folder, 4, folder.labels)
        for row in batch.to_pylist()
    ]
    assert rows == [(p, label, ids[label], split) for p, label, split in expected]


def test_a_remote_folder_listing_keeps_each_file_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from apache_beam.io.filesystem import FileMetadata, MatchResult
    from apache_beam.io.filesystems import FileSystems

    from recordforge.transforms import image_folder

    listed = {  # an object store lists in path order: "A/0.png" < "A/B/..." < "A/z.png"
        "gs://bucket/digits/A/0.png": 10,
        "gs://bucket/digits/A/B/y.png": 20,
        "gs://bucket/digits/A/z.png": 30,
        "gs://bucket/digits/A/notes.txt": 40,
        "gs://bucket/digits/train/C/x.jpg": 50,
    }

    def match(patterns: list[str]) -> list[MatchResult]:
        assert patterns == ["gs://bucket/digits/**"]
        return [MatchResult(patterns[0], [FileMetadata(p, s) for p, s in listed.items()])]

    monkeypatch.setattr(FileSystems, "match", match)
    folder = image_folder.list_image_folder("gs://bucket/digits/")
    assert folder.entries == [
        ("gs://bucket/digits/A/0.png", "A", ""),
        ("gs://bucket/digits/A/z.png", "A", ""),
        ("gs://bucket/digits/A/B/y.png", "B", ""),
        ("gs://bucket/digits/train/C/x.jpg", "C", "train"),
    ]
    assert folder.sizes == [listed[path] for path, _, _ in folder.entries]
    assert folder.labels == ["A", "B", "C"] and folder.splits == ["train"]


def test_a_column_of_images_loads_as_process_image_loads_each(tmp_path: Path) -> None:
    """The batch path (numpy over PNG headers, one read loop) against `process_image` one image at a
    time: the same bytes, header values, format and reason, for every kind of row."""
    import pyarrow as pa

    from recordforge.images.columns import ImageOptions, load_image_column, process_image

    rng = np.random.default_rng(1)
    variants: dict[str, bytes] = {}
    for name, px, fmt in [
        ("gray", rng.integers(0, 256, (9, 7), dtype=np.uint8), "PNG"),
        ("rgb", rng.integers(0, 256, (300, 2, 3), dtype=np.uint8), "PNG"),
        ("rgba", rng.integers(0, 256, (4, 70000 // 16, 4), dtype=np.uint8), "PNG"),  # > one read
        ("deep", rng.integers(0, 65536, (6, 5), dtype=np.uint16), "PNG"),
        ("jpeg", rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), "JPEG"),
        ("gif", rng.integers(0, 256, (6, 6), dtype=np.uint8), "GIF"),
    ]:
        variants[name] = _save(tmp_path / f"{name}.img", px, fmt)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 4, (5, 5), dtype=np.uint8), mode="P").save(buf, format="PNG")
    variants["palette"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 4, (5, 5), dtype=np.uint8), mode="P").save(
        buf, format="PNG", transparency=0
    )
    variants["palette_alpha"] = buf.getvalue()
    rgb = variants["rgb"]
    variants |= {
        "padded": rgb + b"\0\0\0",
        "truncated": rgb[:-1],
        "header_only": rgb[:40],
        "short": rgb[:20],
        "empty": b"",
        "text": b"not an image at all, but long enough to have a header" * 2,
        "bad_colour_type": rgb[:25] + b"\x05" + rgb[26:],
    }
    for name, data in variants.items():
        (tmp_path / f"{name}.img").write_bytes(data)
    (tmp_path / "folder.img").mkdir()
    names = [*variants, "missing", "folder", None] * 3
    paths = [None if n is None else str(tmp_path / f"{n}.img") for n in names]
    as_bytes = [None if n is None or n not in variants else variants[n] for n in names]

    for column in (pa.array(paths, pa.string()), pa.array(as_bytes, pa.binary())):
        for opts in (ImageOptions(), ImageOptions(encode="png", channels=3)):
            got = load_image_column(column, "", opts)
            for i, item in enumerate(column.to_pylist()):
                if item is None:
                    assert not got.present[i] and i not in got.errors
                    continue
                try:
                    data = item if isinstance(item, bytes) else Path(item).read_bytes()
                    want = process_image(data, opts)
                except (OSError, ValueError) as exn:
                    assert not got.present[i] and got.data[i].as_py() is None
                    reason = re.sub("0x[0-9a-f]+", "", got.errors[i])  # Pillow names a BytesIO by address
                    if isinstance(exn, ValueError):
                        assert reason == re.sub("0x[0-9a-f]+", "", str(exn))
                    else:
                        assert reason.startswith(f"cannot read {item!r}: ")
                    continue
                assert got.present[i] and i not in got.errors
                assert got.data[i].as_py() == want.data
                assert (got.height[i], got.width[i], got.channels[i]) == (
                    want.height,
                    want.width,
                    want.channels,
                )
                assert got.format[i].as_py() == want.format.encode()
            assert got.format.null_count == got.data.null_count == (~got.present).sum()


def test_a_folder_image_that_cannot_be_read_or_decoded_is_rejected_by_its_path(tmp_path: Path) -> None:
    """The worker reads a local folder's files itself; one gone since the listing, or not a whole
    PNG, is a rejected row that names the file (its bytes are not copied into the dead letters)."""
    import apache_beam as beam

    from recordforge.pipelines.config import ConvertConfig
    from recordforge.pipelines.convert import DEFAULT_RUNNER, build
    from recordforge.pipelines.resolve import resolve

    written = mnist_folder(str(tmp_path / "digits"), per_class=2)
    truncated = tmp_path / "digits" / "train" / "3" / "00000.png"
    truncated.write_bytes(truncated.read_bytes()[:-20])
    out = tmp_path / "out"
    p = beam.Pipeline(runner=DEFAULT_RUNNER)
    config = ConvertConfig(
        sources=(str(tmp_path / "digits"),), output=str(out), source_format="images", max_rejected=2
    )
    build(p, resolve(p.options, config, look_at_output=False))
    gone = tmp_path / "digits" / "test" / "7" / "00000.png"
    gone.unlink()  # after the listing: the worker finds it missing
    p.run().wait_until_finish()
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (
        len(written),
        len(written) - 2,
        2,
    )
    rejected = sorted(
        (
            json.loads(x)
            for f in (published_root(out) / "_rejected").glob("*.jsonl")
            for x in f.read_text().splitlines()
        ),
        key=lambda r: r["value"],
    )
    assert [(r["value"], r["rule"], r["column"]) for r in rejected] == [
        (str(gone), "image", "path"),
        (str(truncated), "image", "path"),
    ]
    assert rejected[0]["reason"].startswith(f"cannot read {str(gone)!r}: [Errno 2]")
    assert rejected[1]["reason"] == "truncated PNG file"
    assert rejected[1]["record"] == {"path": str(truncated), "label": "3", "label_id": 3, "split": "train"}
    kept = {p for p, _ in written} - {str(gone), str(truncated)}
    assert len(_records(out)) == len(kept)


def _chunk(kind: bytes, body: bytes, crc: int | None = None) -> bytes:
    import struct
    import zlib

    crc = zlib.crc32(kind + body) if crc is None else crc
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def _png(width: int, height: int, colour: int, scanlines: bytes, *, interlace: int = 0, **kw: bytes) -> bytes:
    """A PNG of 8-bit samples built chunk by chunk; `kw` replaces the IDAT body or adds chunks."""
    import struct
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, interlace)
    idat = kw.get("idat", zlib.compress(scanlines))
    extra = _chunk(b"PLTE", bytes(range(12))) if colour == 3 else b""
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", ihdr)
        + extra
        + kw.get("before", b"")
        + _chunk(b"IDAT", idat)
        + _chunk(b"IEND", b"")
    )


def _adam7(pixels: np.ndarray) -> bytes:
    """The scanlines of an interlaced image, pass by pass (filter type 0)."""
    out = b""
    for x0, y0, dx, dy in (
        (0, 0, 8, 8),
        (4, 0, 8, 8),
        (0, 4, 4, 8),
        (2, 0, 4, 4),
        (0, 2, 2, 4),
        (1, 0, 2, 2),
        (0, 1, 1, 2),
    ):
        part = pixels[y0::dy, x0::dx]
        if part.size:
            out += b"".join(b"\0" + row.tobytes() for row in part)
    return out


def _pngs_good_and_corrupt() -> dict[str, bytes]:
    """Grey, interlaced RGB and palette PNGs, whole and damaged in every way libpng notices or
    tolerates (a pixel-data byte flipped with its CRC stale or recomputed, data short by a row,
    an unknown filter type, a wrong or missing Adler-32, a wrong IHDR CRC; too much data, bytes
    after the zlib stream, an ancillary chunk's wrong CRC)."""
    import zlib

    rng = np.random.default_rng(5)
    grey = rng.integers(0, 256, (28, 28), dtype=np.uint8)
    rgb = rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)
    index = rng.integers(0, 4, (6, 3), dtype=np.uint8)
    bases = {
        "grey": (28, 28, 0, b"".join(b"\x01" + row.tobytes() for row in grey), 0),  # filter: Sub
        "interlaced": (5, 7, 2, _adam7(rgb), 1),
        "palette": (3, 6, 3, b"".join(b"\0" + row.tobytes() for row in index), 0),
    }
    out = {}
    for name, (w, h, colour, lines, interlace) in bases.items():
        good = _png(w, h, colour, lines, interlace=interlace)
        stream = zlib.compress(lines)
        flipped = bytearray(stream)
        flipped[len(stream) // 2] ^= 0x55
        at = good.index(b"IDAT") + 4 + len(stream) // 2
        bad_filter = bytearray(lines)
        bad_filter[0] = 5
        variants = {
            "good": good,
            "flipped_stale_crc": good[:at] + bytes([good[at] ^ 0x55]) + good[at + 1 :],
            "flipped": _png(w, h, colour, lines, interlace=interlace, idat=bytes(flipped)),
            "short": _png(w, h, colour, lines[: -(len(lines) // h)], interlace=interlace),
            "bad_filter": _png(w, h, colour, bytes(bad_filter), interlace=interlace),
            "wrong_adler": _png(w, h, colour, lines, interlace=interlace, idat=stream[:-4] + b"\0\0\0\0"),
            "no_adler": _png(w, h, colour, lines, interlace=interlace, idat=stream[:-4]),
            "ihdr_crc": good[:29] + b"\0\0\0\0" + good[33:],
            "long": _png(w, h, colour, lines + bytes(40), interlace=interlace),
            "after_stream": _png(w, h, colour, lines, interlace=interlace, idat=stream + b"junk"),
            "ancillary_crc": _png(
                w, h, colour, lines, interlace=interlace, before=_chunk(b"tEXt", b"k\0v", 7)
            ),
        }
        out |= {f"{name}_{k}": v for k, v in variants.items()}
    return out


def test_a_png_is_kept_exactly_when_tensorflow_decodes_it() -> None:
    """tf.io.decode_png is the oracle: every PNG it decodes is kept with its header values, every
    one it refuses is a bad image with the reason; on the batch path (non-palette PNGs) and one
    by one (`process_image`) alike."""
    import pyarrow as pa

    from recordforge.images.columns import ImageOptions, load_image_column, process_image

    pngs = _pngs_good_and_corrupt()
    got = load_image_column(pa.array(list(pngs.values()), pa.binary()), "", ImageOptions())
    verdicts = {}
    for i, (name, data) in enumerate(pngs.items()):
        try:
            decoded = tf.io.decode_png(data).numpy()
        except tf.errors.InvalidArgumentError:
            decoded = None
        try:
            one = process_image(data, ImageOptions())
            assert decoded is not None, name
            assert (one.height, one.width, one.channels) == decoded.shape, name
        except ValueError as exn:
            assert decoded is None, f"{name}: {exn}"
            assert got.errors[i] == str(exn), name
        assert got.present[i] == (decoded is not None), name
        if decoded is not None:
            assert got.data[i].as_py() == data
            assert (got.height[i], got.width[i], got.channels[i]) == decoded.shape, name
        verdicts[name] = got.errors.get(i, "kept")
    # Each damage is found for what it is.
    assert verdicts["grey_flipped_stale_crc"] == "corrupt PNG: CRC mismatch in chunk IDAT"
    assert verdicts["interlaced_short"].startswith("corrupt PNG: the image data ends early")
    assert verdicts["palette_bad_filter"] == "corrupt PNG: unknown scanline filter type"
    assert (
        verdicts["grey_wrong_adler"]
        == "corrupt PNG image data: Error -3 while decompressing data: incorrect data check"
    )
    assert sum(v == "kept" for v in verdicts.values()) == 3 * 4


def test_a_large_png_has_its_chunk_crcs_checked() -> None:
    """Above the inflate limit (4 KiB of scanlines) a PNG is not inflated, as that costs about as
    much as decoding it: damage to its stored data is still found by the CRCs; a stream its
    encoder wrote wrong (with right CRCs) only by inflating it."""
    import zlib

    from recordforge.images.checks import png_problem
    from recordforge.images.columns import ImageOptions, process_image

    rgb = np.random.default_rng(2).integers(0, 256, (60, 50, 3), dtype=np.uint8)
    lines = b"".join(b"\0" + row.tobytes() for row in rgb)
    good = _png(50, 60, 2, lines)
    at = good.index(b"IDAT") + 4 + 3000
    damaged = good[:at] + bytes([good[at] ^ 1]) + good[at + 1 :]
    stream = bytearray(zlib.compress(lines))
    stream[3000] ^= 1
    miswritten = _png(50, 60, 2, lines, idat=bytes(stream))
    assert process_image(good, ImageOptions()).height == 60
    with pytest.raises(ValueError, match="^corrupt PNG: CRC mismatch in chunk IDAT$"):
        process_image(damaged, ImageOptions())
    assert png_problem(miswritten) is None
    assert png_problem(miswritten, 0, 1 << 20).startswith("corrupt PNG image data: ")


def test_a_dangling_link_or_a_corrupt_png_in_a_folder_is_a_rejected_row(tmp_path: Path) -> None:
    """Neither vanishes nor is written: a strict run fails naming the file, a tolerant one
    rejects the row (rule `image`) with the path and the reason."""
    pngs = _pngs_good_and_corrupt()
    written = mnist_folder(str(tmp_path / "digits"), per_class=1)
    corrupt = tmp_path / "digits" / "train" / "4" / "corrupt.png"
    corrupt.write_bytes(pngs["grey_flipped"])
    dangling = tmp_path / "digits" / "train" / "5" / "gone.png"
    dangling.symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(Exception, match="column 'path': corrupt PNG image data: .* \\[rule: image\\]"):
        run([f"--source={tmp_path / 'digits'}", "--format=images", f"--output={tmp_path / 'strict'}"])
    out = tmp_path / "out"
    run([f"--source={tmp_path / 'digits'}", "--format=images", f"--output={out}", "--max_rejected=2"])
    meta = json.loads((out / "metadata.json").read_text())
    assert (meta["rows_read"], meta["rows_written"], meta["rows_rejected"]) == (
        len(written) + 2,
        len(written),
        2,
    )
    rejected = sorted(
        (
            json.loads(x)
            for f in (published_root(out) / "_rejected").glob("*.jsonl")
            for x in f.read_text().splitlines()
        ),
        key=lambda r: r["value"],
    )
    assert [(r["value"], r["rule"]) for r in rejected] == [(str(corrupt), "image"), (str(dangling), "image")]
    assert rejected[0]["reason"].startswith("corrupt PNG image data: Error -3 while decompressing data")
    target = str(tmp_path / "nowhere.png")
    assert rejected[1]["reason"] == f"cannot read {str(dangling)!r}: a dangling symbolic link to {target!r}"
    assert sorted(r["image/height"] for r in _records(out)) == [28] * len(written)


def test_a_blank_path_in_a_manifest_is_a_null_image(tmp_path: Path) -> None:
    """An empty cell names no file: the image is absent (nulls: absent) or the row is bad with
    rule `null` (nulls: required), never a read of the manifest's own folder."""
    _save(tmp_path / "a.png", np.full((3, 4), 7, np.uint8), "PNG")
    (tmp_path / "m.csv").write_text("path,id\na.png,1\n,2\n  ,3\n")

    def convert(nulls: str, out: str) -> dict:
        features = [
            {"name": "path", "type": "image", "nulls": nulls},
            {"name": "id", "type": "int64", "nulls": "required"},
        ]
        (tmp_path / f"{nulls}.yaml").write_text(yaml.safe_dump({"features": features}))
        args = [
            "--format",
            "images",
            "--source",
            str(tmp_path / "m.csv"),
            "--schema",
            str(tmp_path / f"{nulls}.yaml"),
        ]
        return run([*args, "--output", str(tmp_path / out), "--max_rejected", "5"])

    convert("absent", "a")
    images = {int(r["id"]): r["path"].values.numpy().tolist() for r in recordforge.read(str(tmp_path / "a"))}
    assert images == {1: [(tmp_path / "a.png").read_bytes()], 2: [], 3: []}
    meta = convert("required", "r")
    assert meta["rows_written"] == 1 and meta["rejected_by_rule"] == {"null": 2}


def test_split_folders_are_sized_by_their_images_with_fixed_shard_counts(tmp_path: Path) -> None:
    """--deterministic without --num_shards: a shard per 1,024 images of each split folder (its
    share of the images), so a small test/ gets one shard and a large train/ several."""
    written = mnist_folder(str(tmp_path / "mnist"), per_class=220)  # 2,200 train, 440 test
    args = ["--format", "images", "--source", str(tmp_path / "mnist"), "--deterministic"]
    meta = run([*args, "--output", str(tmp_path / "out")])
    assert {k: v["shards"] for k, v in meta["split_counts"].items()} == {"test": 1, "train": 3}
    assert meta["num_records"] == len(written)
