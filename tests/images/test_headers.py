"""Header values read by the one parser that the converter and `stats` share, against Pillow's
decoding and against each other."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from recordforge.images.columns import ImageOptions, _with_pillow, load_image_column, process_image
from recordforge.images.headers import BMP, GIF, JPEG, PNG, WEBP, header_values, image_format, sniff
from recordforge.records.example_pb import Example
from recordforge.records.wire import decode_batch
from recordforge.records.wire_keys import KeyTable
from recordforge.tools.stats import FeatureStats


def _encode(fmt: str, mode: str, size: tuple[int, int], **save: object) -> bytes:
    im = Image.new(mode, size, 1 if mode in ("L", "P", "I;16") else (1,) * len(mode))
    buf = io.BytesIO()
    im.save(buf, format=fmt, **save)
    return buf.getvalue()


def _batch(images: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(x) for x in images], np.int64)
    ends = np.cumsum(lengths)
    return np.frombuffer(b"".join(images), np.uint8), ends - lengths, ends


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (b"\x89PNG\r\n\x1a\n" + b"\0" * 8, PNG),
        (b"\x89PNG", 0),  # a signature cut short
        (b"\xff\xd8\xff\xe0", JPEG),
        (b"\xff\xd8", 0),
        (b"GIF89a", GIF),
        (b"BM" + b"\0" * 30, BMP),
        (b"RIFF\0\0\0\0WEBPVP8 ", WEBP),
        (b"RIFF\0\0\0\0WAVEfmt ", 0),
        (b"", 0),
        (b"PAR1", 0),
    ],
)
def test_sniff_tells_the_format_from_the_signature(head: bytes, code: int) -> None:
    buf, starts, ends = _batch([b"pad", head, b"\x89PNG\r\n"])
    assert sniff(buf, starts, ends).tolist() == [0, code, 0]  # the last one is cut short too
    assert image_format(head) == ("", "png", "jpeg", "gif", "bmp", "webp")[code]


def test_palette_png_with_transparency_has_four_channels_for_converter_and_stats() -> None:
    """A palette PNG with a tRNS chunk decodes to RGBA: the converter (one by one and batch-wise)
    and `stats` read 4 channels from its header; a palette PNG without one, 3."""
    with_alpha = _encode("PNG", "P", (5, 3), transparency=0)
    without = _encode("PNG", "P", (5, 3))
    assert b"tRNS" in with_alpha and b"tRNS" not in without
    assert Image.open(io.BytesIO(with_alpha)).convert("RGBA").mode == "RGBA"
    images = [with_alpha, without]

    one = [process_image(x, ImageOptions()) for x in images]
    assert [(r.height, r.width, r.channels, r.format) for r in one] == [(3, 5, 4, "png"), (3, 5, 3, "png")]
    column = load_image_column(pa.array(images, pa.binary()), "", ImageOptions())
    assert column.channels.tolist() == [4, 3] and column.present.tolist() == [True, True]

    records = []
    for x in images:
        ex = Example()
        ex.features.feature["image"].bytes_list.value.append(x)
        records.append(ex.SerializeToString())
    buf, starts, ends = _batch(records)
    s = FeatureStats()
    s.add(decode_batch(buf.tobytes(), starts, ends, KeyTable()).columns["image"], np.random.default_rng(0))
    assert sorted(s.dims["channels"].sample.tolist()) == [3, 4]


@pytest.mark.parametrize(
    ("fmt", "mode", "save"),
    [
        ("PNG", "L", {}),
        ("PNG", "LA", {}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "P", {}),
        ("PNG", "P", {"transparency": 2}),
        ("PNG", "I;16", {}),
        ("JPEG", "L", {}),
        ("JPEG", "RGB", {}),
        ("JPEG", "RGB", {"progressive": True}),
        ("JPEG", "CMYK", {}),
        ("GIF", "P", {}),
        ("BMP", "RGB", {}),
    ],
)
def test_header_values_are_what_the_converter_writes(fmt: str, mode: str, save: dict) -> None:
    """Height, width and channels from the header equal the converter's result for the image and
    Pillow's reading of it, also inside a batch at an odd offset."""
    image = _encode(fmt, mode, (7, 4), **save)
    want = process_image(image, ImageOptions())
    assert want[1:] == _with_pillow(image, ImageOptions())[1:]
    buf, starts, ends = _batch([b"x", image, b"yz"])
    codes = sniff(buf, starts, ends)
    height, width, channels, read = header_values(buf, starts, ends, codes)
    assert read.tolist() == [False, True, False]
    assert (int(height[1]), int(width[1]), int(channels[1])) == (want.height, want.width, want.channels)
    assert (want.height, want.width) == (4, 7)


def test_a_header_cut_short_gives_no_values() -> None:
    png = _encode("PNG", "RGB", (7, 4))
    jpeg = _encode("JPEG", "RGB", (7, 4))
    cut = [png[:30], jpeg[:20], b"GIF89a\x01", b"BM" + b"\0" * 20]
    buf, starts, ends = _batch(cut)
    codes = sniff(buf, starts, ends)
    assert codes.tolist() == [PNG, JPEG, GIF, BMP]
    height, width, channels, read = header_values(buf, starts, ends, codes)
    assert not read.any() and not channels.any() and not height.any() and not width.any()
