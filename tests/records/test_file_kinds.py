"""What a file that is not a TFRecord file is said to be, from its first bytes."""

from __future__ import annotations

import gzip
import io
from pathlib import Path

import pytest
from PIL import Image

from recordforge.records.file_kinds import looks_like


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("L", (2, 2)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"PAR1" + b"\0" * 20, "a Parquet file; "),
        (_png(), "a PNG image; "),
        (b"\xff\xd8\xff\xe0" + b"\0" * 20, "a JPEG image; "),
        (b"GIF89a" + b"\0" * 20, "a GIF image; "),
        (b"PK\x03\x04" + b"\0" * 20, "a zip archive; "),
        (b"ARROW1\0\0", "an Arrow file; "),
        (b"id,name\n1,a\n", "text, starting 'id,name'; "),
        (gzip.compress(b"id,name\n1,a\n", mtime=0), "gzip of text, starting 'id,name'; "),
        (gzip.compress(_png(), mtime=0), "gzip of a PNG image; "),
        (gzip.compress(b"\x00\x01\x02\x03", mtime=0), ""),
        (b"\x00\x01\x02\x03\x04", ""),
        (b"", ""),
    ],
)
def test_looks_like(tmp_path: Path, data: bytes, said: str) -> None:
    path = tmp_path / "file"
    path.write_bytes(data)
    assert looks_like(str(path)) == said


def test_a_file_that_cannot_be_read_is_described_as_nothing(tmp_path: Path) -> None:
    assert looks_like(str(tmp_path / "missing")) == ""
