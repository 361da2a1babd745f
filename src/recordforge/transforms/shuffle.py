"""Global places for a split's records: their input positions, as they are or permuted by a seed."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam import typehints

from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.files.storage import open_write, read_bytes
from recordforge.output.placed_pieces import PlacedKeep, bounds, layout_digest, layout_of, write_layout
from recordforge.output.shard_files import abandon, temp_path
from recordforge.records.tfrecord import BatchKey
from recordforge.transforms.coders import declare_element_type

__all__ = ["Permutation", "ScatterRecords", "ordered_pieces", "sorted_records"]

_ROUNDS = 6  # Luby-Rackoff: 4 rounds make a strong pseudo-random permutation; 2 more are cheap
_KEY = "key"
_RECORD = "record"
_SPILLED = layout.SPILL_SUFFIX


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 with full avalanche (wraps by design)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def _stable_hash(*parts: object) -> int:
    """A 64-bit hash that is the same in every process (Python's hash() of str is salted)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class Permutation:
    """A seeded permutation of [0, size): a balanced Feistel network over the smallest even
    number of bits that covers `size`, walking cycles until a value falls inside [0, size).
    The domain is below 4*size, so a value takes fewer than 4 walks on average."""

    def __init__(self, size: int, seed: int, salt: str = "") -> None:
        self.size = size
        bits = max(2, (max(size, 2) - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        self._round_keys = [
            np.uint64(_stable_hash("recordforge-shuffle", seed, salt, r)) for r in range(_ROUNDS)
        ]

    def _feistel(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._round_keys:
            left, right = right, left ^ (_splitmix64(right ^ key) & self._mask)
        return (left << self._half) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        out = self._feistel(positions.astype(np.uint64))
        outside = np.flatnonzero(out >= np.uint64(self.size))
        while outside.size:
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= np.uint64(self.size)]
        return out


def _first_records(counts: Iterable[tuple[str, int, int]]) -> tuple[dict[tuple[str, int], int], int]:
    """The rank of each batch's first record among the split's records, from (file, first_row,
    records) of every batch: files in path order, batches in row order within a file."""
    firsts: dict[tuple[str, int], int] = {}
    total = 0
    for file, first_row, n in sorted(counts):
        if (file, first_row) in firsts:
            raise RuntimeError(f"two batches of the same split start at row {first_row} of {file}")
        firsts[(file, first_row)] = total
        total += n
    return firsts, total


# The layouts this process has recorded, (folder, writer, digest): once each is enough.
_RECORDED: set[tuple[str, str, str]] = set()


class _ScatterFn(beam.DoFn):
    """Places each record of a batch: its output place (its position, or with a seed that
    position permuted), then its shard; emits one piece per shard, a struct array of (place,
    record) pairs. With `pieces` (folder, writer), the records per batch (the layout) are
    recorded there for a rerun; with `keep`, the pieces of the shards a killed run finished are
    not emitted, once the layout is checked to be that run's (placed_pieces.py)."""

    def __init__(
        self,
        num_shards: int,
        seed: int | None,
        salt: str,
        spill_dir: str | None,
        pieces: tuple[str, str] | None = None,
        keep: PlacedKeep | None = None,
    ) -> None:
        self._num_shards = num_shards
        self._seed = seed
        self._salt = salt
        self._spill_dir = spill_dir
        self._pieces = pieces
        self._expected = keep.layout if keep is not None else None
        self._kept = keep.kept if keep is not None else frozenset()
        self._seen: tuple[int, dict[tuple[str, int], int], Permutation | None, np.ndarray] | None = None

    def _plan(
        self, counts: list[tuple[str, int, int]]
    ) -> tuple[dict[tuple[str, int], int], Permutation | None, np.ndarray]:
        # The side input is the same object for every batch of a bundle: computed once.
        if self._seen is None or self._seen[0] != id(counts):
            firsts, total = _first_records(counts)
            self._check_and_record(counts)
            permute = None if self._seed is None else Permutation(total, self._seed, self._salt)
            self._seen = (id(counts), firsts, permute, bounds(total, self._num_shards))
        return self._seen[1], self._seen[2], self._seen[3]

    def _check_and_record(self, counts: list[tuple[str, int, int]]) -> None:
        if self._pieces is None and self._expected is None:
            return
        batches = layout_of(counts)
        digest = layout_digest(batches)
        if self._expected is not None and digest != self._expected:
            # The kept shards hold other places than this run would give: never publish them.
            raise RecordForgeError(
                "the records per batch differ from those of the interrupted run this one resumes; "
                "nothing was published: run again with --resume=false"
            )
        if self._pieces is not None and (*self._pieces, digest) not in _RECORDED:
            write_layout(self._pieces[0], self._pieces[1], self._num_shards, batches)
            _RECORDED.add((*self._pieces, digest))

    def process(
        self, keyed: tuple[BatchKey, pa.Array | str], counts: list[tuple[str, int, int]]
    ) -> Iterator[tuple[int, pa.StructArray | str]]:
        (_, file, first_row), records = keyed
        if isinstance(records, str):
            records = _read_array(records)
        if not len(records):
            return
        firsts, permute, edges = self._plan(counts)
        places = np.arange(len(records), dtype=np.uint64) + np.uint64(firsts[(file, first_row)])
        if permute is not None:
            places = permute(places)
        shards = np.searchsorted(edges, places, side="right")
        # In input order the shards ascend already: each piece is a slice of the batch.
        order = np.argsort(shards, kind="stable") if permute is not None else None
        ends = np.cumsum(np.bincount(shards, minlength=self._num_shards))
        start = 0
        for shard, end in enumerate(ends.tolist()):
            if end > start and shard not in self._kept:
                if order is None:
                    keys, taken = places[start:end], records.slice(start, end - start)
                else:
                    keys, taken = places[order[start:end]], records.take(pa.array(order[start:end]))
                piece = pa.StructArray.from_arrays([pa.array(keys), taken], names=[_KEY, _RECORD])
                if self._spill_dir is None:
                    yield shard, piece
                else:
                    path = temp_path(self._spill_dir, f"piece-{shard:05d}", _SPILLED)
                    yield shard, _write_array(path, piece)
            start = end


def _write_array(path: str, array: pa.Array) -> str:
    """Writes an Arrow array as an IPC stream (a fresh name: a retried step writes its own);
    a failure deletes the file before it propagates."""
    batch = pa.RecordBatch.from_arrays([array], names=["a"])
    try:
        with open_write(path) as f:
            with pa.ipc.new_stream(f, batch.schema) as writer:
                writer.write_batch(batch)
    except BaseException:
        abandon(path)
        raise
    return path


def _read_array(path: str) -> pa.Array:
    data = read_bytes(path)
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all().column(0).combine_chunks()


class _SpillFn(beam.DoFn):
    """A batch to a temporary file: what waits for the counts is then its name."""

    def __init__(self, spill_dir: str) -> None:
        self._spill_dir = spill_dir

    def process(self, keyed: tuple[BatchKey, pa.Array]) -> Iterator[tuple[BatchKey, tuple[str, int]]]:
        key, records = keyed
        if len(records):
            path = temp_path(self._spill_dir, "batch", _SPILLED)
            yield key, (_write_array(path, records), len(records))


def _count(keyed: tuple[BatchKey, pa.Array | tuple[str, int]]) -> tuple[str, int, int]:
    (_, file, first_row), records = keyed
    return file, first_row, records[1] if isinstance(records, tuple) else len(records)


def _path(keyed: tuple[BatchKey, tuple[str, int]]) -> tuple[BatchKey, str]:
    return keyed[0], keyed[1][0]


class ScatterRecords(beam.PTransform):
    """In: `((split, file, first_row), records)` batches of one split. Out: `(shard, piece)`,
    a piece per batch and shard it has records for: an Arrow array or, with `spill_dir`, the
    name of a file holding one; `sorted_records` or `ordered_pieces` makes a shard of them.
    Places are the records' positions, or with `seed` those positions permuted."""

    def __init__(
        self,
        num_shards: int,
        seed: int | None,
        salt: str = "",
        spill_dir: str | None = None,
        *,
        pieces: tuple[str, str] | None = None,
        keep: PlacedKeep | None = None,
    ) -> None:
        super().__init__()
        if num_shards < 1:
            raise ValueError(f"shuffled output needs num_shards >= 1, not {num_shards}")
        self._num_shards = num_shards
        self._seed = seed
        self._salt = salt
        self._spill_dir = spill_dir
        self._pieces = pieces  # (folder, writer): where the layout is recorded (placed_pieces.py)
        self._keep = keep

    def expand(
        self, batches: beam.PCollection[tuple[BatchKey, pa.Array]]
    ) -> beam.PCollection[tuple[int, pa.StructArray | str]]:
        spill = self._spill_dir
        if spill is not None:
            batches = batches | "Spill" >> beam.ParDo(_SpillFn(spill))
        counts = batches | "CountRecords" >> beam.Map(_count)
        if self._keep is not None and self._keep.counts:
            # (file, first_row, records) of the batches a killed run finished, not read again
            skipped = batches.pipeline | "SkippedCounts" >> beam.Create(
                list(self._keep.counts), reshuffle=False
            )
            counts = (counts, skipped) | "AllCounts" >> beam.Flatten()
        if spill is not None:
            batches = batches | "Names" >> beam.Map(_path)
        scatter = _ScatterFn(self._num_shards, self._seed, self._salt, spill, self._pieces, self._keep)
        pieces = batches | "Place" >> beam.ParDo(scatter, beam.pvalue.AsList(counts))
        if spill is not None:
            return pieces
        # The pieces are Arrow arrays: the coder sizes them from their buffers (coders.py).
        return declare_element_type(pieces, typehints.Tuple[int, pa.Array])


def ordered_pieces(pieces: Iterable[pa.Array | str]) -> list[pa.Array]:
    """A shard's records in place order, each piece's records apart, from pieces (arrays or
    their files) whose places are runs that do not interleave (placed by position): a piece
    that is a whole batch is written as that batch."""
    arrays = [_read_array(p) if isinstance(p, str) else p for p in pieces]
    arrays.sort(key=lambda piece: piece.flatten()[0][0].as_py())
    return [piece.flatten()[1] for piece in arrays]


def sorted_records(pieces: Iterable[pa.Array | str]) -> pa.Array:
    """A shard's records in place order, from its pieces (arrays or their files) in any order."""
    pieces = [_read_array(p) if isinstance(p, str) else p for p in pieces]
    if not pieces:
        return pa.array([], pa.large_binary())
    whole = pa.concat_arrays(pieces)
    keys, records = whole.flatten()  # flatten, unlike field(), applies the array's offset
    return records.take(pa.array(np.argsort(keys.to_numpy(), kind="stable")))
