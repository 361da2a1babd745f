"""A batch's WebDataset samples made column by column, byte for byte what SampleCodec.encode makes.

The same bytes as `SampleCodec.encode` record by record (the reference, and the path for a batch
this one does not take), made for the whole batch at once: the records decoded to columns in C
(wire.py), each member's data made per column (an .npy's header once per dtype and shape), and
every header from one ustar template per member name: the key (fixed width within a batch),
the size and the checksum patched in. Members start on 512-byte blocks, so a batch's samples
are one zeroed buffer of blocks, written member by member: the padding is already there.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.records import wire
from recordforge.records.webdataset.members import _BLOCK, _IMAGE_EXT, Member, _header, _npy, sample_key
from recordforge.records.wire_keys import KeyTable

_KEY_WIDTH = 25  # sample_key: 12 hex digits, '-', 12 digits (rows under 10**12)
_SIZE_AT, _SUM_AT = 124, 148  # a ustar header's size (11 octal digits) and checksum (6) fields
_OCTAL_11 = 3 * np.arange(10, -1, -1, dtype=np.int64)
_OCTAL_6 = 3 * np.arange(5, -1, -1, dtype=np.int64)
_TENS_12 = 10 ** np.arange(11, -1, -1, dtype=np.int64)
_SHORT = _BLOCK  # values of at most this many bytes are gathered by rows, longer ones one by one


class _Fallback(Exception):
    """A batch the columnwise encoder leaves to `SampleCodec.encode` (which writes it, or fails
    on it, as it always has)."""


@dataclass(frozen=True)
class _Template:
    """A member name's ustar header with the key's bytes, the size and the checksum left to
    patch (`fixed`: the checksum of everything else), or None where tarfile needs pax."""

    header: np.ndarray
    fixed: int


@functools.lru_cache(maxsize=4096)
def _template(name: str, ext: str) -> _Template | None:
    full = f"{'0' * _KEY_WIDTH}.{name}.{ext}"
    head = _header(full, 0)
    if len(head) != _BLOCK:  # a name over 100 bytes or not ASCII: a pax header first
        return None
    header = np.frombuffer(head, np.uint8).copy()
    header[:_KEY_WIDTH] = 0
    header[_SIZE_AT : _SIZE_AT + 11] = 0
    header[_SUM_AT : _SUM_AT + 8] = ord(" ")
    header.flags.writeable = False
    return _Template(header, int(header.sum(dtype=np.int64)))


@functools.lru_cache(maxsize=4096)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """What np.save writes before an array's data (it depends on the dtype and shape alone)."""
    array = np.empty(shape, dtype)
    data = _npy(array)
    return data[: len(data) - array.nbytes]


@dataclass
class _Part:
    """Some records' data of one member: `prefix` then either `fixed` (one row per record) or
    the spans blob[starts[i] : starts[i] + lens[i]]."""

    rows: np.ndarray
    ext: str
    prefix: bytes = b""
    fixed: np.ndarray | None = None
    blob: np.ndarray | None = None
    starts: np.ndarray | None = None
    lens: np.ndarray | None = None

    def sizes(self) -> np.ndarray:
        if self.fixed is not None:
            return np.full(len(self.rows), len(self.prefix) + self.fixed.shape[1], np.int64)
        assert self.lens is not None
        return len(self.prefix) + self.lens


@dataclass
class _Entries:
    """A member's feature in the records holding it (`rows`, ascending): where its values start
    among the column's values of its kind, and how many."""

    rows: np.ndarray
    first: np.ndarray
    count: np.ndarray
    col: wire.Column


def _entries(col: wire.Column | None, code: int) -> _Entries | None:
    if col is None or not len(col.rec):
        return None
    kind = col.kind
    if not ((kind == code) | (kind == wire.NONE)).all():
        raise _Fallback  # another list kind than the member's
    count = np.where(kind == code, col.count, 0)
    first = np.cumsum(count) - count
    order = np.argsort(col.rec, kind="stable")
    rows = col.rec[order]
    if len(rows) > 1 and not (rows[1:] > rows[:-1]).all():
        raise _Fallback  # a record holding the feature twice
    return _Entries(rows, first[order], count[order], col)


def _one_each(e: _Entries) -> None:
    if not (e.count == 1).all():
        raise _Fallback


def _spans_of(e: _Entries) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lens) in the column's blob of each record's first bytes value."""
    starts = e.col.starts[e.first]
    return starts, e.col.ends[e.first] - starts


def _joined(pieces: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(blob, starts, lens) of byte strings made one by one."""
    lens = np.fromiter(map(len, pieces), np.int64, len(pieces))
    starts = np.cumsum(lens) - lens
    return np.frombuffer(b"".join(pieces), np.uint8), starts, lens


def _value_lists(e: _Entries) -> list[list[bytes]]:
    """Each record's bytes values, as Python bytes (each made anew, as protobuf makes them: a
    pickle of the list memoizes by identity)."""
    col = e.col
    total = int(e.count.sum())
    index = np.repeat(e.first - (np.cumsum(e.count) - e.count), e.count) + np.arange(total)
    blob = col.blob
    values = [
        blob[s:t].tobytes() for s, t in zip(col.starts[index].tolist(), col.ends[index].tolist(), strict=True)
    ]
    bounds = np.concatenate([[0], np.cumsum(e.count)]).tolist()
    return [values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _array_values(m: Member, e: _Entries) -> list[_Part]:
    """An .npy member: the records grouped by their number of values (one header each)."""
    if m.dtype == "float64":  # one bytes value: the array's bytes
        _one_each(e)
        starts, lens = _spans_of(e)
        if (lens % 8).any():
            raise _Fallback
        counts = lens // 8
    else:
        counts = e.count
    parts = []
    for c in np.unique(counts).tolist():
        shape = (c,) if m.shape == (-1,) else m.shape
        if c != math.prod(shape):
            raise _Fallback  # a fixed shape the values do not fill
        pick = np.flatnonzero(counts == c)
        prefix = _npy_header(m.dtype, shape)
        rows = e.rows[pick]
        if m.dtype == "float64":
            parts.append(_Part(rows, "npy", prefix, blob=e.col.blob, starts=starts[pick], lens=lens[pick]))
            continue
        index = e.first[pick][:, None] + np.arange(c)
        if m.dtype == "float32":
            bits = e.col.floats.view("<u4")[index]
            # protobuf hands float32 values to Python as doubles: a signalling NaN comes back quiet
            nan = (bits & 0x7F800000 == 0x7F800000) & (bits & 0x7FFFFF != 0)
            body = np.where(nan, bits | 0x400000, bits).astype("<u4").view(np.uint8)
        elif m.dtype == "bool":
            body = (e.col.ints[index] != 0).view(np.uint8)
        else:
            body = e.col.ints[index].astype("<i8").view(np.uint8)
        parts.append(_Part(rows, "npy", prefix, fixed=body.reshape(len(rows), -1)))
    return parts


def _member_parts(m: Member, cols: dict[str, wire.Column], n: int) -> list[_Part]:
    code = wire.INT64
    if m.ext in ("txt", "bin", "image", "json", "pyd") or m.dtype == "float64":
        code = wire.BYTES
    elif m.dtype == "float32":
        code = wire.FLOAT
    e = _entries(cols.get(m.feature), code)
    if e is None:
        return []
    if m.ext == "cls":
        _one_each(e)
        text = pc.cast(pa.array(e.col.ints[e.first], pa.int64()), pa.large_string())
        offsets = np.frombuffer(text.buffers()[1], np.int64)[: len(text) + 1]
        blob = np.frombuffer(text.buffers()[2], np.uint8)
        return [_Part(e.rows, "cls", blob=blob, starts=offsets[:-1], lens=np.diff(offsets))]
    if m.ext in ("txt", "bin"):
        _one_each(e)
        starts, lens = _spans_of(e)
        return [_Part(e.rows, m.ext, blob=e.col.blob, starts=starts, lens=lens)]
    if m.ext == "image":
        return _image_parts(m, e, cols)
    if m.ext in ("json", "pyd"):
        try:
            pieces = [
                json.dumps([v.decode() for v in values], ensure_ascii=False).encode()
                if m.ext == "json"
                else pickle.dumps(values, protocol=4)
                for values in _value_lists(e)
            ]
        except UnicodeDecodeError as exn:
            raise _Fallback from exn
        blob, starts, lens = _joined(pieces)
        return [_Part(e.rows, m.ext, blob=blob, starts=starts, lens=lens)]
    return _array_values(m, e)


def _image_parts(m: Member, e: _Entries, cols: dict[str, wire.Column]) -> list[_Part]:
    """An image's bytes, its extension from its format feature, record by record."""
    _one_each(e)
    formats = _entries(cols.get(m.feature + "/format"), wire.BYTES)
    if formats is None:
        raise _Fallback  # no format beside an image: the record-by-record path says what
    at = np.minimum(np.searchsorted(formats.rows, e.rows), len(formats.rows) - 1)
    if not (formats.rows[at] == e.rows).all() or not (formats.count[at] >= 1).all():
        raise _Fallback
    fstarts, flens = _spans_of(formats)
    fstarts, flens = fstarts[at], flens[at]
    blob = formats.col.blob
    try:
        names = [
            blob[s : s + k].tobytes().decode() for s, k in zip(fstarts.tolist(), flens.tolist(), strict=True)
        ]
    except UnicodeDecodeError as exn:
        raise _Fallback from exn
    exts = np.array([_IMAGE_EXT.get(x, x) for x in names], object)
    starts, lens = _spans_of(e)
    parts = []
    for ext in sorted(set(exts.tolist())):
        pick = np.flatnonzero(exts == ext)
        parts.append(_Part(e.rows[pick], ext, blob=e.col.blob, starts=starts[pick], lens=lens[pick]))
    return parts


def _keys(file: str, first_row: int, n: int) -> np.ndarray:
    """The n records' keys as rows of bytes (n, 25)."""
    if first_row < 0 or first_row + n > 10**12:
        raise _Fallback  # keys of another width
    keys = np.empty((n, _KEY_WIDTH), np.uint8)
    keys[:, :13] = np.frombuffer(sample_key(file, 0)[:13].encode(), np.uint8)
    rows = np.arange(first_row, first_row + n, dtype=np.int64)
    keys[:, 13:] = rows[:, None] // _TENS_12 % 10 + ord("0")
    return keys


def _octal(values: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    return (values[:, None] >> shifts & 7) + ord("0")


def _header_rows(
    template: _Template, keys: np.ndarray, sizes: np.ndarray, key_sums: np.ndarray | None = None
) -> np.ndarray:
    """The headers `_header(f"{key}.{name}.{ext}", size)` of a template's name, one row each
    (sizes under 8**11)."""
    rows = np.empty((len(sizes), _BLOCK), np.uint8)
    rows[:] = template.header
    rows[:, :_KEY_WIDTH] = keys
    size_digits = _octal(sizes, _OCTAL_11)
    rows[:, _SIZE_AT : _SIZE_AT + 11] = size_digits
    if key_sums is None:
        key_sums = keys.sum(axis=1, dtype=np.int64)
    # tarfile's checksum: the sum of the header's bytes, its own field read as 8 spaces
    check = template.fixed + key_sums + size_digits.sum(axis=1)
    rows[:, _SUM_AT : _SUM_AT + 6] = _octal(check, _OCTAL_6)
    rows[:, _SUM_AT + 6] = 0
    return rows


def _encode_columns(members: tuple[Member, ...], file: str, first_row: int, records: pa.Array) -> pa.Array:
    """The batch's samples as `SampleCodec.encode` writes them, or _Fallback."""
    n = len(records)
    if records.null_count or not (pa.types.is_large_binary(records.type) or pa.types.is_binary(records.type)):
        raise _Fallback
    offsets = np.frombuffer(
        records.buffers()[1], np.int64 if pa.types.is_large_binary(records.type) else np.int32
    )
    offsets = offsets[records.offset : records.offset + n + 1].astype(np.int64)
    data = np.frombuffer(records.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    # The records, then zeros: a value of up to _SHORT bytes is read whole from where it starts.
    buf = np.zeros(len(data) + _SHORT + wire.PAD, np.uint8)
    buf[: len(data)] = data
    starts, ends = offsets[:-1] - offsets[0], offsets[1:] - offsets[0]
    batch = wire.decode_batch(
        buf[: len(data)].data, starts, ends, KeyTable(m.feature for m in members), padded=buf
    )
    if batch.not_examples:
        raise _Fallback
    keys = _keys(file, first_row, n)
    # Per member: its parts, and per part its header (one template, or tarfile's pax headers).
    members_parts = [_member_parts(m, batch.columns, n) for m in members]
    blocks = np.zeros((n, len(members)), np.int64)
    heads: list[list[tuple[_Part, np.ndarray, _Template | list[bytes]]]] = []
    for j, (m, parts) in enumerate(zip(members, members_parts, strict=True)):
        placed: list[tuple[_Part, np.ndarray, _Template | list[bytes]]] = []
        for part in parts:
            sizes = part.sizes()
            template = _template(m.name, part.ext)
            if template is None or int(sizes.max(initial=0)) >= 8**11:
                key_text = keys[part.rows].view(f"S{_KEY_WIDTH}").ravel().tolist()
                own = [
                    _header(f"{k.decode()}.{m.name}.{part.ext}", s)
                    for k, s in zip(key_text, sizes.tolist(), strict=True)
                ]
                head_blocks = np.array([len(h) // _BLOCK for h in own], np.int64)
                placed.append((part, sizes, own))
            else:
                head_blocks = np.ones(len(part.rows), np.int64)
                placed.append((part, sizes, template))
            blocks[part.rows, j] = head_blocks + -(-sizes // _BLOCK)
        heads.append(placed)
    flat = blocks.ravel()
    at = (np.cumsum(flat) - flat).reshape(n, len(members))  # each member's first block
    total = int(flat.sum())
    out = np.zeros((total, _BLOCK), np.uint8)
    key_sums = keys.sum(axis=1, dtype=np.int64)
    for j, placed in enumerate(heads):
        for part, sizes, head in placed:
            where = at[part.rows, j]
            if isinstance(head, _Template):
                out[where] = _header_rows(head, keys[part.rows], sizes, key_sums[part.rows])
                where = where + 1
            else:
                for w, h in zip(where.tolist(), head, strict=True):
                    out[w : w + len(h) // _BLOCK] = np.frombuffer(h, np.uint8).reshape(-1, _BLOCK)
                where = where + np.array([len(h) // _BLOCK for h in head], np.int64)
            _write_data(out, where, part, sizes)
    bounds = np.zeros(n + 1, np.int64)
    bounds[:-1] = at[:, 0] * _BLOCK
    bounds[-1] = total * _BLOCK
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(bounds), pa.py_buffer(out)])


def _write_data(out: np.ndarray, where: np.ndarray, part: _Part, sizes: np.ndarray) -> None:
    """A part's data at the blocks `where` of `out` (its padding is the zeros already there)."""
    width = len(part.prefix)
    if part.fixed is not None:
        rows = np.empty((len(where), width + part.fixed.shape[1]), np.uint8)
        rows[:, :width] = np.frombuffer(part.prefix, np.uint8)
        rows[:, width:] = part.fixed
        for b in range(0, rows.shape[1], _BLOCK):
            chunk = rows[:, b : b + _BLOCK]
            out[where + b // _BLOCK, : chunk.shape[1]] = chunk
        return
    assert part.blob is not None and part.starts is not None and part.lens is not None
    blob, starts, lens = part.blob, part.starts, part.lens
    short = (sizes <= _BLOCK) & (sizes > 0)
    if short.any():
        at, first, k = where[short], starts[short], lens[short]
        if width:
            out[at, :width] = np.frombuffer(part.prefix, np.uint8)
        longest = int(k.max())
        if longest:
            if int(first.max()) + longest > len(blob):
                blob = np.concatenate([blob, np.zeros(longest, np.uint8)])
            windows = np.lib.stride_tricks.as_strided(
                blob, (len(blob) - longest + 1, longest), (1, 1), writeable=False
            )
            values = windows[first]
            values[np.arange(longest) >= k[:, None]] = 0
            out[at, width : width + longest] = values
    flat = out.reshape(-1)
    for w, s, k in zip(
        where[sizes > _BLOCK].tolist(),
        starts[sizes > _BLOCK].tolist(),
        lens[sizes > _BLOCK].tolist(),
        strict=True,
    ):
        o = w * _BLOCK
        flat[o : o + width] = np.frombuffer(part.prefix, np.uint8)
        flat[o + width : o + width + k] = blob[s : s + k]
