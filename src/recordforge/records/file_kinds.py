"""What a file seems to be from its first bytes, for the message that it is not a TFRecord file."""

from __future__ import annotations

import zlib

from recordforge.files.storage import open_read
from recordforge.images.headers import image_format

__all__ = ["looks_like"]

# Files that are not images; images are told by their signatures (image_headers.py).
_MAGIC = (
    (b"PAR1", "a Parquet file"),
    (b"PK\x03\x04", "a zip archive"),
    (b"ARROW1", "an Arrow file"),
)


def looks_like(path: str) -> str:
    """What a file that is not a TFRecord file seems to be, from its first bytes, as a prefix
    for the error ("" when nothing is recognised)."""
    try:
        with open_read(path) as f:
            head = f.read(4096)
        found = _looks_like_bytes(head[:64])
        if head[:2] == b"\x1f\x8b":  # say what the gzip stream holds
            inner = _looks_like_bytes(zlib.decompressobj(31).decompress(head, 64))
            found = f"gzip of {inner}" if inner else ""
    except Exception:  # noqa: BLE001 - a description only; the error stands without it
        return ""
    return f"{found}; " if found else ""


def _looks_like_bytes(head: bytes) -> str:
    image = image_format(head)
    if image:
        return f"a {image.upper()} image"
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    for cut in range(4):  # the bytes may end inside a character
        try:
            text = head[: len(head) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text.strip() and all(c.isprintable() or c in "\n\r\t" for c in text):
            return f"text, starting {text.strip().splitlines()[0][:40]!r}"
        break
    return ""
