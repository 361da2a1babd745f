"""A tar stream's plain members, read block by block; anything else handed on to tarfile.

A WebDataset shard is thousands of small members, each a 512-byte ustar header and its data.
tarfile makes a TarInfo per header, decoding every field, which made reading a shard (verify,
stats, head, export) run at a few thousand samples a second. This reader takes from a header only
what a member of a shard needs (name, size, type, checksum), and only for the plain case: a POSIX
ustar header of a regular file with an ASCII name and an octal size. At the first header that is
anything else (pax or GNU headers, as the writer makes for a long or non-ASCII name; a base-256
size; a bad checksum) the rest of the stream goes to tarfile, so that what is not plain is read,
or refused, exactly as tarfile does. A zero block ends the archive, as it does for tarfile.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from recordforge.errors import CorruptFile

__all__ = ["Fallback", "Readable", "is_tar", "members"]

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_MAGIC = b"ustar\x0000"  # POSIX ustar: tarfile writes it for USTAR, PAX and the pax members' headers
_REGULAR = (b"0", b"\x00")
_READ = 1 << 20


class Readable(Protocol):
    """A stream of bytes: a file, or one that hashes what it hands out."""

    def read(self, size: int = -1) -> bytes: ...


# (path, the bytes already taken from the stream at `base`, the stream, base) -> members
Fallback = Callable[[str, bytes, Readable, int], Iterator[tuple[int, str, bytes]]]


class _Blocks:
    """`source` read ahead in large pieces; `take` hands out bytes in order."""

    def __init__(self, source: Readable) -> None:
        self._source = source
        self._buffer = b""
        self._at = 0  # in _buffer
        self.offset = 0  # of the next byte handed out, in the stream

    def take(self, n: int) -> bytes:
        """The next `n` bytes, fewer only at the stream's end."""
        if len(self._buffer) - self._at < n:
            pieces = [self._buffer[self._at :]]
            have = len(pieces[0])
            while have < n:
                piece = self._source.read(max(_READ, n - have))
                if not piece:
                    break
                pieces.append(piece)
                have += len(piece)
            self._buffer, self._at = b"".join(pieces), 0
        data = self._buffer[self._at : self._at + n]
        self._at += len(data)
        self.offset += len(data)
        return data

    def rest(self) -> bytes:
        """What was read ahead and not handed out (it was already shown to any hashing)."""
        data = self._buffer[self._at :]
        self._buffer, self._at = b"", 0
        return data


def _plain(header: bytes) -> tuple[str, int] | None:
    """(name, size) of a plain regular member's header, or None for any other header."""
    if header[257:265] != _MAGIC or header[156:157] not in _REGULAR:
        return None
    try:
        size = int(header[124:136].split(b"\x00", 1)[0].strip() or b"0", 8)
        checksum = int(header[148:156].split(b"\x00", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    # The checksum counts its own field as eight spaces (tarfile also takes the signed sum; a
    # header only that sum matches goes to tarfile).
    if checksum != sum(header) - sum(header[148:156]) + 8 * 32:
        return None
    name = header[0:100].split(b"\x00", 1)[0]
    prefix = header[345:500].split(b"\x00", 1)[0]
    if prefix:
        name = prefix + b"/" + name
    if not name.isascii() or name.endswith(b"/"):
        return None
    return name.decode("ascii"), size


def is_tar(first_block: bytes) -> bool:
    """Whether a file starting with these bytes (512 of them, fewer if the file is shorter) is a
    tar archive: a ustar header (POSIX or GNU magic) whose checksum holds."""
    if len(first_block) < _BLOCK or first_block[257:262] != b"ustar":
        return False
    try:
        checksum = int(first_block[148:156].split(b"\x00", 1)[0].strip() or b"0", 8)
    except ValueError:
        return False
    return checksum == sum(first_block[:_BLOCK]) - sum(first_block[148:156]) + 8 * 32


def members(path: str, source: Readable, fallback: Fallback) -> Iterator[tuple[int, str, bytes]]:
    """(offset of its header, name, data) of each member of the tar stream `source`, in order,
    up to the first zero block (or the stream's end); `fallback` reads from the first header
    that is not plain on."""
    blocks = _Blocks(source)
    while True:
        offset = blocks.offset
        header = blocks.take(_BLOCK)
        if not header or header == _ZERO_BLOCK:
            return
        found = _plain(header) if len(header) == _BLOCK else None
        if found is None:
            yield from fallback(path, header + blocks.rest(), source, offset)
            return
        name, size = found
        data = blocks.take(size)
        if len(data) < size:
            raise CorruptFile(
                path, f"not a readable tar file (unexpected end of data in member {name!r} at byte {offset})"
            )
        blocks.take(-size % _BLOCK)  # the padding to the next block; short only at the stream's end
        yield offset, name, data
