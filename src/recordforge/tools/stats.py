"""stats: per-feature counts, ranges, moments, histograms, lengths, top values and image sizes."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recordforge.errors import CorruptFile
from recordforge.files.storage import exists
from recordforge.images.headers import FORMATS, header_values, sniff
from recordforge.records.bundle_json import load_feature_spec, load_metadata
from recordforge.records.chunks import RecordChunk, data_crc_mismatches
from recordforge.records.tfrecord import CorruptRecord
from recordforge.records.wire import FLOAT, INT64, Column, decode_batch, kind_name
from recordforge.records.wire_keys import HashIndex, KeyTable, key_hash, words_at
from recordforge.tools.records import record_files
from recordforge.tools.scan import scan_shards
from recordforge.tools.stats_sample import UniformSample

__all__ = ["FeatureStats", "stats"]

DISTINCT_EXACT = 10_000  # distinct strings counted exactly; beyond, estimated
SHORT = 64  # strings up to this many bytes are counted as values; longer ones are blobs
_SKETCH = 2048  # smallest hashes kept to estimate distinct counts
_POSITIONS = 16  # fixed-shape features up to this many values get statistics per position
_THUMBS = 8


@dataclass
class FeatureStats:
    """One feature's summary; `merge` combines two summaries of disjoint records."""

    kinds: Counter = field(default_factory=Counter)
    present: int = 0
    lengths: Counter = field(default_factory=Counter)
    values: int = 0  # numeric values, finite ones in the moments below
    nan: int = 0
    inf: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float | int | None = None
    max: float | int | None = None
    _sample: UniformSample = field(default_factory=UniformSample)  # of the numeric values
    _index: HashIndex | None = None  # where each counted value's hash is, once they stop changing
    width: int | None = None  # values per record when every record has the same number
    _top_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # sorted
    _top_count: np.ndarray = field(default_factory=lambda: np.zeros(0))
    _values: dict[int, bytes] = field(default_factory=dict)  # the bytes of each hash counted
    top_exact: bool = True
    sketch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    long_values: int = 0  # bytes values longer than SHORT (not counted as strings)
    formats: Counter = field(default_factory=Counter)
    thumbs: list[bytes] = field(default_factory=list)
    # Images: height, width and channels read from their headers.
    dims: dict[str, FeatureStats] = field(default_factory=dict)
    logical: str | None = None

    @property
    def kind(self) -> str:
        real = [k for k, _ in self.kinds.most_common() if k != "none"]
        return real[0] if real else "none"

    @property
    def std(self) -> float:
        finite = self.values - self.nan - self.inf
        return math.sqrt(self.m2 / finite) if finite else float("nan")

    @property
    def distinct(self) -> tuple[int, bool]:
        """(distinct short values, exact?)."""
        if self.top_exact:
            return len(self._top_hash), True
        k = len(self.sketch)
        if k < _SKETCH:
            return k, True
        return int((k - 1) / (float(self.sketch[-1]) / 2.0**64)), False

    # --- adding a column -------------------------------------------------------------------

    def add(self, col: Column, rng: np.random.Generator) -> None:
        kinds = np.bincount(col.kind, minlength=4)
        for k in np.flatnonzero(kinds).tolist():
            self.kinds[kind_name(k)] += int(kinds[k])
        self.present += len(col.rec)
        if len(col.count) and int(col.count.max()) < 1 << 16:
            per_length = np.bincount(col.count)
            lengths = np.flatnonzero(per_length)
            counts = per_length[lengths]
        else:
            lengths, counts = np.unique(col.count, return_counts=True)
        self.lengths.update(dict(zip(lengths.tolist(), counts.tolist(), strict=True)))
        width = int(lengths[0]) if len(lengths) == 1 else -1
        self.width = width if self.width in (None, width) else -1
        one_kind = int(kinds.max()) == len(col.kind)
        for kind, values in ((INT64, col.ints), (FLOAT, col.floats)):
            if len(values):
                per = col.count if one_kind else col.count[col.kind == kind]
                self._numbers(values, None if width == 1 else per, rng)
        if len(col.starts):
            self._strings(col, rng)

    def _numbers(self, values: np.ndarray, counts: np.ndarray | None, rng: np.random.Generator) -> None:
        """Counts, moments and extremes of a column's values (`counts`: values per entry, None
        when every entry has one), and its share of the sample."""
        as_float = values.astype(np.float64)
        before = self.values - self.nan - self.inf  # finite values so far
        self.values += len(values)
        good, exact = as_float, values
        if values.dtype.kind == "f":
            finite = np.isfinite(as_float)
            if not finite.all():
                nan = int(np.isnan(as_float).sum())
                self.nan += nan
                self.inf += int((~finite).sum()) - nan
                good = exact = as_float[finite]
            else:
                exact = as_float
        if len(good):
            n, m = len(good), float(good.mean())
            d = good - m
            m2 = float(np.einsum("i,i->", d, d))  # np.dot would call BLAS, which spins up threads
            total = before + n
            delta = m - self.mean
            self.mean += delta * n / total
            self.m2 += m2 + delta * delta * before * n / total
            lo, hi = exact.min().item(), exact.max().item()
            self.min = lo if self.min is None else min(self.min, lo)
            self.max = hi if self.max is None else max(self.max, hi)
        self._sample.add(as_float, counts, rng)

    @property
    def sample(self) -> np.ndarray:
        """Values drawn uniformly at random: SAMPLE of them (all, if fewer) after finish()."""
        return self._sample.values

    @property
    def sample_pos(self) -> np.ndarray:
        """The position of each sample value in its record's list."""
        return self._sample.positions

    def _strings(self, col: Column, rng: np.random.Generator) -> None:
        starts, ends = col.starts, col.ends
        lengths = ends - starts
        blob = col.blob
        if int(starts.max()) + SHORT + 32 > len(blob):
            blob = np.concatenate([blob, np.zeros(SHORT + 32, np.uint8)])
        words = words_at(blob)
        codes = sniff(blob, starts, ends)
        for code in np.unique(codes[codes > 0]).tolist():
            found = np.flatnonzero(codes == code)
            self.formats[FORMATS[code]] += len(found)
            self._image_sizes(blob, starts[found], ends[found], codes[found], rng)
            if len(self.thumbs) < _THUMBS:
                first = found[: _THUMBS - len(self.thumbs)]
                self.thumbs += [blob[starts[i] : ends[i]].tobytes() for i in first.tolist()]
        short = lengths <= SHORT
        self.long_values += int((~short).sum())
        if not short.any():
            return
        s, n = starts[short], lengths[short]
        h = key_hash(words, s, n)
        if self._index is not None:  # the values met so far stopped changing: look them up
            ids = self._index.find(h)
            if int(ids.min()) >= 0:
                self._top_count = self._top_count + np.bincount(ids, minlength=len(self._top_hash))
                return
        uniq, first, counts = np.unique(h, return_index=True, return_counts=True)
        self._sketch(uniq)
        self._count(uniq, counts, lambda i: blob[s[first[i]] : s[first[i]] + n[first[i]]].tobytes())

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_index": None}  # rebuilt where needed, not sent back

    def finish(self) -> None:
        """The sample cut to its SAMPLE values (between merges it may hold up to twice that)."""
        self._sample.finish()
        for dim in self.dims.values():
            dim.finish()

    def _image_sizes(
        self,
        blob: np.ndarray,
        starts: np.ndarray,
        ends: np.ndarray,
        codes: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        height, width, channels, read = header_values(blob, starts, ends, codes)
        for part, values in (
            ("height", height[read]),
            ("width", width[read]),
            ("channels", channels[channels > 0]),
        ):
            if len(values):
                dim = self.dims.setdefault(part, FeatureStats())
                dim.kinds["int64"] += len(values)
                dim.present += len(values)
                dim.lengths[1] += len(values)
                dim.width = 1
                dim._numbers(values, None, rng)

    def _count(self, hashes: np.ndarray, counts: np.ndarray, value: Any) -> None:
        """Adds counts per value hash (sorted, distinct); `value(i)` gives the bytes of hash i,
        asked only for values kept and not met before. Past DISTINCT_EXACT values the most
        common stay (ties keep values already held) and the count is no longer exact."""
        held = len(self._top_hash)
        if held:
            all_h = np.concatenate([self._top_hash, hashes])
            merged, inverse = np.unique(all_h, return_inverse=True)
            merged_c = np.bincount(inverse, np.concatenate([self._top_count, counts]), len(merged))
            old = np.zeros(len(merged), bool)
            old[inverse[:held]] = True
        else:
            merged, merged_c, old = hashes, counts.astype(np.float64), np.zeros(len(hashes), bool)
        if len(merged) > DISTINCT_EXACT:
            self.top_exact = False
            keep = np.sort(np.argsort(-(2 * merged_c + old), kind="stable")[:DISTINCT_EXACT])
            merged, merged_c, old = merged[keep], merged_c[keep], old[keep]
        new = np.flatnonzero(~old)
        same = len(new) == 0 and len(merged) == held
        self._index = (self._index or HashIndex(merged)) if same and self.top_exact else None
        if len(new):
            where = np.searchsorted(hashes, merged[new])
            for h, i in zip(merged[new].tolist(), where.tolist(), strict=True):
                self._values[h] = value(i)
        if len(merged) < len(self._values):
            self._values = {h: self._values[h] for h in merged.tolist()}
        self._top_hash, self._top_count = merged, merged_c

    @property
    def top(self) -> Counter:
        """{value: count} of the short bytes values (the most common DISTINCT_EXACT of them)."""
        return Counter(
            {
                self._values[h]: int(c)
                for h, c in zip(self._top_hash.tolist(), self._top_count.tolist(), strict=True)
            }
        )

    def _sketch(self, hashes: np.ndarray) -> None:
        merged = np.union1d(self.sketch, hashes)
        self.sketch = merged[:_SKETCH]

    def merge(self, other: FeatureStats) -> None:
        self.kinds.update(other.kinds)
        self.lengths.update(other.lengths)
        before, n = self.values - self.nan - self.inf, other.values - other.nan - other.inf
        if n:
            total = before + n
            delta = other.mean - self.mean
            self.mean += delta * n / total
            self.m2 += other.m2 + delta * delta * before * n / total
        for name in ("min", "max"):
            a, b = getattr(self, name), getattr(other, name)
            pick = min if name == "min" else max
            setattr(self, name, b if a is None else a if b is None else pick(a, b))
        self.present += other.present
        self.values += other.values
        self.nan += other.nan
        self.inf += other.inf
        self.width = (
            other.width if self.width in (None, other.width) else (self.width if other.width is None else -1)
        )
        self._sample.merge(other._sample)
        self.top_exact = self.top_exact and other.top_exact
        values = other._values
        self._count(other._top_hash, other._top_count, lambda i: values[int(other._top_hash[i])])
        self._sketch(other.sketch)
        self.long_values += other.long_values
        self.formats.update(other.formats)
        self.thumbs = (self.thumbs + other.thumbs)[:_THUMBS]
        for part, dim in other.dims.items():
            if part in self.dims:
                self.dims[part].merge(dim)
            else:
                self.dims[part] = dim


class _Summary:
    """The accumulator scan_shards runs per chunk: FeatureStats per feature."""

    def __init__(self) -> None:
        self.records = 0
        self.corrupt = 0
        self.not_examples = 0
        self.features: dict[str, FeatureStats] = {}
        self._keys = KeyTable()

    def add(self, chunk: RecordChunk, shard: str) -> None:
        rng = np.random.default_rng([chunk.first_record, len(chunk), hash(shard) & 0xFFFF])
        self.corrupt += len(data_crc_mismatches(chunk))
        batch = decode_batch(chunk.data, chunk.starts, chunk.ends, self._keys, padded=chunk.padded)
        self.records += batch.size
        self.not_examples += len(batch.not_examples)
        for name, col in batch.columns.items():
            self.features.setdefault(name, FeatureStats()).add(col, rng)

    def merge(self, other: _Summary) -> None:
        self.records += other.records
        self.corrupt += other.corrupt
        self.not_examples += other.not_examples
        for name, s in other.features.items():
            if name in self.features:
                self.features[name].merge(s)
            else:
                self.features[name] = s

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_keys"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._keys = KeyTable()


def _spec(path: str) -> dict[str, Any]:
    out = path.rstrip("/")
    if exists(f"{out}/metadata.json") and exists(f"{out}/feature_spec.json"):
        meta = load_metadata(f"{out}/metadata.json")
        return load_feature_spec(f"{out}/feature_spec.json", sequence="sequence" in meta)
    return {}


def stats(path: str, *, workers: int | None = None) -> dict[str, Any]:
    """Statistics of every record of a bundle (all shards) or of one TFRecord file."""
    files = record_files(path)
    results = scan_shards(files, _Summary, what="stats", workers=workers, hashed=False)  # no sha256 shown
    total = _Summary()
    for r in results:
        if r.missing:
            raise FileNotFoundError(f"{r.path}: No such file or directory")
        if r.error is not None:
            if r.error_offset is not None:
                raise CorruptRecord(r.path, r.error_offset, r.error)
            raise CorruptFile(r.path, r.error)
        total.merge(r.acc)
    spec = _spec(path)
    # SequenceExamples: the context is summarised (laid out as an Example's features); the
    # feature lists are not yet.
    sequences = "sequence" in spec and "context" in spec
    if sequences:
        spec = spec["context"]
    for name, s in total.features.items():
        s.finish()
        entry = spec.get(name, {})
        s.logical = entry.get("logical") or ("image" if "image" in entry else None)
        if s.logical is None and s.formats and sum(s.formats.values()) == s.kinds.get("bytes", 0):
            s.logical = "image"
    return {
        "path": path.rstrip("/"),
        "records": total.records,
        "corrupt_records": total.corrupt,
        "not_examples": total.not_examples,
        "feature_spec": spec,
        "features": dict(sorted(total.features.items())),
        **(
            {"note": "SequenceExamples: context features only; feature lists are not summarised"}
            if sequences
            else {}
        ),
    }
