"""stats against numpy on the benchmark's table, and the HTML page's labels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from bench.table import make_table
from recordforge.pipelines.convert import run
from recordforge.tools.stats import stats
from recordforge.tools.stats_format import format_stats, stats_html


@pytest.fixture(scope="module")
def bench_bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("benchstats")
    table = make_table(2000, seed=1)
    pq.write_table(table, root / "t.parquet")
    run(["--source", str(root / "t.parquet"), "--output", str(root / "out"), "--num_shards", "2"])
    return root / "out", table


def test_stats_match_numpy_on_the_bench_table(bench_bundle: tuple[Path, object]) -> None:
    out, table = bench_bundle
    result = stats(str(out), workers=2)
    assert result["records"] == 2000
    i4 = table["i4"].drop_null().to_numpy()
    s = result["features"]["i4"]
    assert s.present == len(i4) and (s.min, s.max) == (int(i4.min()), int(i4.max()))
    assert isinstance(s.min, int) and s.mean == pytest.approx(i4.mean(), rel=1e-12)
    f2 = table["f2"].drop_null().to_numpy().astype(np.float32).astype(np.float64)
    t = result["features"]["f2"]
    assert t.min == f2.min() and t.max == f2.max() and t.std == pytest.approx(f2.std(), rel=1e-9)
    lengths = np.array([len(x) for x in table["ilist"].drop_null().to_pylist()])
    assert dict(result["features"]["ilist"].lengths) == dict(
        zip(*np.unique(lengths, return_counts=True), strict=True)
    )
    flist = np.stack(table["flist"].drop_null().to_numpy(zero_copy_only=False)).astype(np.float64)
    fl = result["features"]["flist"]
    assert fl.width == 8 and fl.values == flist.size
    for p in range(8):  # the sample holds every value here (fewer than SAMPLE), by position
        assert np.sort(fl.sample[fl.sample_pos == p]).tolist() == np.sort(flist[:, p]).tolist()
    s0 = table["s0"].drop_null().to_numpy(zero_copy_only=False)
    values, counts = np.unique(s0, return_counts=True)
    top = result["features"]["s0"].top
    assert {k.decode(): v for k, v in top.items()} == dict(zip(values.tolist(), counts.tolist(), strict=True))
    assert result["features"]["s0"].distinct == (len(values), True)
    text = format_stats(result)
    assert f"{int(i4.max()):,}" in text and "list lengths" in text


def test_html_page_shows_labels(bench_bundle: tuple[Path, object]) -> None:
    out, _ = bench_bundle
    page = stats_html(stats(str(out), workers=1))
    for label in ("position [0]", "position [7]", "list lengths", "distinct", "2,000 records", "token_"):
        assert label in page, label
    assert page.count('class="x0"') >= 15  # every histogram writes its axis range


def test_png_rendering_of_the_page(bench_bundle: tuple[Path, object], tmp_path: Path) -> None:
    """The README's picture: one row per feature drawn, bars in the bar colour, a small file."""
    from PIL import Image

    from demo.stats_image import _BAR, stats_png

    result = stats(str(bench_bundle[0]))
    heights = {}
    for features in (["i0", "s0"], None):
        path = tmp_path / f"{len(features or [])}.png"
        stats_png(result, str(path), features)
        with Image.open(path) as im:
            rgb = np.asarray(im.convert("RGB"))
        heights[len(features or result["features"])] = rgb.shape[0]
        assert (rgb == np.array(_BAR, np.uint8)).all(axis=2).sum() > 500  # histogram bars
        assert path.stat().st_size < 200_000
    assert heights[len(result["features"])] > heights[2] * 3
