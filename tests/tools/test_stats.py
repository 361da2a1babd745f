"""stats' summaries of one feature: string counts (exact, bounded, merged) and image sizes read
from the images' headers."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from recordforge.errors import CorruptFile
from recordforge.records.example_pb import Example
from recordforge.records.wire import Column, decode_batch
from recordforge.records.wire_keys import KeyTable
from recordforge.tools.stats import DISTINCT_EXACT, FeatureStats


def _column(values: list[bytes], name: str = "x") -> Column:
    records = []
    for v in values:
        ex = Example()
        ex.features.feature[name].bytes_list.value.append(v)
        records.append(ex.SerializeToString())
    lengths = np.array([len(r) for r in records], np.int64)
    starts = np.cumsum(lengths) - lengths
    batch = decode_batch(b"".join(records), starts, starts + lengths, KeyTable())
    return batch.columns[name]


def _summary(parts: list[list[bytes]]) -> FeatureStats:
    rng = np.random.default_rng(0)
    total = FeatureStats()
    for part in parts:
        s = FeatureStats()
        s.add(_column(part), rng)
        total.merge(s)
    return total


def test_string_counts_exact_and_merged() -> None:
    rng = np.random.default_rng(3)
    words = [b"", b"a", b"token_0001", b"x" * 20, b"y" * 64, "\u00e9t\u00e9".encode()]
    values = [words[i] for i in rng.integers(0, len(words), 3000)] + [b"z" * 65]  # one long value
    want = {w: values.count(w) for w in words if values.count(w)}
    one = FeatureStats()
    one.add(_column(values), rng)
    merged = _summary([values[:1000], values[1000:1700], values[1700:]])
    for s in (one, merged):
        assert dict(s.top) == want
        assert s.distinct == (len(want), True)
        assert s.long_values == 1


def test_string_counts_past_the_bound() -> None:
    """More distinct values than DISTINCT_EXACT: the count is an estimate (said so), the values
    seen in every part keep their exact counts."""
    n = 3 * DISTINCT_EXACT
    unique = [b"id-%d" % i for i in range(n)]
    common = [b"common"] * 700 + [b"usual"] * 300
    parts = [unique[i::3] + common for i in range(3)]
    s = _summary(parts)
    count, exact = s.distinct
    assert not exact and abs(count - (n + 2)) < 0.1 * n
    top = s.top.most_common(2)
    assert top == [(b"common", 2100), (b"usual", 900)]
    assert len(s.top) == DISTINCT_EXACT


def _encode(fmt: str, mode: str, size: tuple[int, int]) -> bytes:
    im = Image.new(mode, size, 1 if mode in ("L", "P") else (1,) * len(mode))
    buf = io.BytesIO()
    im.save(buf, format=fmt)
    return buf.getvalue()


def test_image_sizes_from_headers() -> None:
    cases = [
        ("PNG", "L", (7, 5), 1),
        ("PNG", "RGB", (3, 9), 3),
        ("PNG", "RGBA", (40, 2), 4),
        ("PNG", "P", (6, 6), 3),
        ("GIF", "P", (11, 4), 3),
        ("BMP", "RGB", (5, 13), 3),
        ("JPEG", "RGB", (17, 8), 3),
        ("JPEG", "L", (300, 200), 1),
    ]
    images = [_encode(fmt, mode, size) for fmt, mode, size, _ in cases]
    col = _column(images, "image")
    s = FeatureStats()
    s.add(col, np.random.default_rng(0))
    assert dict(s.formats) == {"png": 4, "gif": 1, "bmp": 1, "jpeg": 2}
    assert sorted(s.dims["height"].sample.tolist()) == sorted(h for _, _, (_, h), _ in cases)
    assert sorted(s.dims["width"].sample.tolist()) == sorted(w for _, _, (w, _), _ in cases)
    assert sorted(s.dims["channels"].sample.tolist()) == sorted(c for *_, c in cases)
    assert s.dims["height"].min == 2 and s.dims["height"].max == 200
    assert s.dims["channels"].values == len(cases)
    # A PNG cut inside its header is counted as a PNG, but has no size.
    cut = _column([images[0][:20]], "image")
    t = FeatureStats()
    t.add(cut, np.random.default_rng(0))
    assert t.formats["png"] == 1 and "height" not in t.dims


def test_image_sizes_in_the_text_and_the_page() -> None:
    from recordforge.tools.stats_format import format_stats, stats_html

    images = [_encode("PNG", "RGB", (w, 10 + w)) for w in (4, 9, 30)]
    s = FeatureStats()
    s.add(_column(images, "image"), np.random.default_rng(0))
    s.logical = "image"
    result = {"path": "p", "records": 3, "features": {"image": s}}
    assert "from the headers: height 14..40, width 4..30, channels 3..3" in format_stats(result)
    page = stats_html(result)
    assert ">height<" in page and ">width<" in page and ">channels<" in page


def _int_column(rows: np.ndarray, counts: np.ndarray) -> Column:
    """A column of int64 lists: entry i holds counts[i] values of `rows`, in order."""
    records, at = [], 0
    for c in counts.tolist():
        ex = Example()
        ex.features.feature["v"].int64_list.value.extend(rows[at : at + c].tolist())
        records.append(ex.SerializeToString())
        at += c
    lengths = np.array([len(r) for r in records], np.int64)
    starts = np.cumsum(lengths) - lengths
    return decode_batch(b"".join(records), starts, starts + lengths, KeyTable()).columns["v"]


def test_sample_is_uniform_and_knows_positions() -> None:
    """Past SAMPLE values only a drawn few are looked at, yet the kept values are a uniform
    sample of all (mean and spread of 0..N-1 as for uniform draws), merged over parts; fixed
    width lists keep each value's position in its list."""
    from recordforge.tools.stats_sample import SAMPLE

    n = 150_000
    rng = np.random.default_rng(5)
    total = FeatureStats()
    for part in np.array_split(np.arange(n), 5):
        s = FeatureStats()
        for piece in np.array_split(part, 3):
            s.add(_int_column(piece, np.ones(len(piece), np.int64)), rng)
        total.merge(s)
    sample = total.sample
    assert len(sample) == SAMPLE and len(np.unique(sample)) == SAMPLE
    sd = n / np.sqrt(12) / np.sqrt(SAMPLE)
    assert abs(sample.mean() - (n - 1) / 2) < 4 * sd
    deciles = np.histogram(sample, bins=10, range=(0, n))[0]
    assert (abs(deciles - SAMPLE / 10) < 5 * np.sqrt(SAMPLE / 10)).all()
    assert total.min == 0 and total.max == n - 1 and total.values == n
    # Three values per record, value = position * 1000 + record: positions come back.
    rec = np.arange(30_000)
    rows = (np.arange(3)[None, :] * 1000_000 + rec[:, None]).ravel()
    s = FeatureStats()
    s.add(_int_column(rows, np.full(len(rec), 3)), rng)
    assert s.width == 3 and len(s.sample) == SAMPLE
    assert (s.sample // 1000_000 == s.sample_pos).all()


def test_string_counts_once_the_values_stop_changing() -> None:
    """After a batch with no new value, values are looked up in an index; one met later still
    counts, and so do values of other lengths and an empty string."""
    rng = np.random.default_rng(2)
    s = FeatureStats()
    words = [b"a", b"bb", b"", b"x" * 17]
    batches = [[words[i] for i in rng.integers(0, 4, 500)] for _ in range(4)]
    batches.append([b"late"] * 3 + batches[0][:10])
    batches.append(batches[1])
    for batch in batches:
        s.add(_column(batch), rng)
    flat = [v for b in batches for v in b]
    assert dict(s.top) == {w: flat.count(w) for w in set(flat)}
    assert s.distinct == (5, True)


def test_a_shard_read_in_chunks_over_workers_gives_what_one_worker_gives(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunks of one shard handed to worker processes in shared slots (scan.py) and the
    whole shard read by one worker give the same statistics: values, strings, samples, images."""
    import gzip

    import pyarrow as pa

    from recordforge.records.example_pb import Example
    from recordforge.records.tfrecord import frame_records
    from recordforge.tools import scan
    from recordforge.tools.stats import stats
    from recordforge.tools.stats_format import format_stats

    monkeypatch.setattr(scan, "start_method", lambda: "fork")  # workers that see the setting below
    monkeypatch.setattr(scan, "CHUNK_BYTES", 8 << 10)
    rng = np.random.default_rng(5)
    png = _encode("PNG", "RGB", (7, 3))
    records = []
    for i in range(3000):
        ex = Example()
        f = ex.features.feature
        f["n"].int64_list.value.extend(rng.integers(-50, 50, i % 4).tolist())
        f["x"].float_list.value.append(float(rng.normal()))
        f["s"].bytes_list.value.append(b"v%d" % rng.integers(0, 40))
        if i % 9 == 0:
            f["img"].bytes_list.value.append(png)
        records.append(ex.SerializeToString())
    path = tmp_path / "data.tfrecord.gz"
    path.write_bytes(gzip.compress(b"".join(frame_records(pa.array(records, pa.binary())).to_pylist())))
    one, spread = stats(str(path), workers=1), stats(str(path), workers=3)
    assert one["records"] == spread["records"] == 3000
    assert format_stats(one) == format_stats(spread)
    assert one["features"].keys() == spread["features"].keys() == {"n", "x", "s", "img"}
    for name, a in one["features"].items():
        b = spread["features"][name]
        assert (a.kinds, a.lengths, a.formats, a.thumbs, a.long_values) == (
            b.kinds,
            b.lengths,
            b.formats,
            b.thumbs,
            b.long_values,
        )
        # The same values sampled (all of them here), merged in whichever order workers finished.
        assert sorted(zip(a.sample.tolist(), a.sample_pos.tolist(), strict=True)) == sorted(
            zip(b.sample.tolist(), b.sample_pos.tolist(), strict=True)
        )


def _stats_seconds(path: str) -> float:
    import time

    from recordforge.tools.stats import stats

    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        with pytest.raises(CorruptFile, match="claims 1099511627776 bytes"):
            stats(path, workers=2)
        best = min(best, time.perf_counter() - start)
    return best


def test_stats_of_a_huge_claimed_length_takes_linear_time(tmp_path: Path) -> None:
    """A header claiming 2**40 bytes (its CRC right) then zeros: a 64 MB file takes no more
    than about 8 times as long as an 8 MB one (before: 3/10/35 s for 32/64/128 MB, the pending
    bytes joined again at every read), with margins for a busy machine."""
    from crafted import huge_claim

    small = huge_claim(tmp_path / "small.tfrecord", 8 << 20)
    large = huge_claim(tmp_path / "large.tfrecord", 64 << 20)
    assert _stats_seconds(str(large)) <= 8 * _stats_seconds(str(small)) + 1.0
