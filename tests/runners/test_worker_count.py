"""How many local workers: a worker per core, one for an input too small to pay for their start."""

from __future__ import annotations

import pytest

from recordforge.runners import workers


@pytest.mark.parametrize(
    ("cores", "rows", "small"),
    [
        (2, 1_000_000, True),  # measured: 1 worker 1.09 s, 2 workers 1.37 s
        (2, 4_000_000, False),  # measured: 1 worker 4.26 s, 2 workers 3.62 s
        (16, 1_000_000, False),  # 16 workers save 0.87 of the time, paying their start sooner
        (16, 500_000, True),
    ],
)
def test_the_bound_scales_with_what_the_workers_save(
    cores: int, rows: int, small: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _: set(range(cores)))
    assert workers.small_input(images=None, rows=rows, sizes=[]) is small


def test_sizes_count_where_rows_are_unknown_and_an_unlisted_size_is_never_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda _: {0, 1})
    assert workers.small_input(images=None, rows=None, sizes=[10 << 20, 20 << 20])
    assert not workers.small_input(images=None, rows=None, sizes=[60 << 20, 20 << 20])
    assert not workers.small_input(images=None, rows=None, sizes=[1, None])
    assert workers.small_input(images=9_999, rows=10**9, sizes=[])
