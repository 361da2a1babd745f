"""The progress line of a local conversion: counted where the rows are encoded (in this process
or in forked workers), shown live on a terminal and once a minute elsewhere."""

from __future__ import annotations

import io
import multiprocessing
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from demo.sampledata import taxi_table
from recordforge.progress import counts as progress_counts
from recordforge.progress import live as progress


def test_the_line_says_rows_share_rate_and_eta() -> None:
    assert progress.line(250_000, 1_000_000, 2.0) == (
        "converting: 250,000 rows of 1,000,000 (25%), 125,000 rows/s, 0:02 elapsed, ETA 0:06"
    )
    assert progress.line(5_000, None, 3725.0) == "converting: 5,000 rows, 1 rows/s, 1:02:05 elapsed"


def _forked_worker(folder: str, rows: list[int]) -> None:
    for n in rows:
        progress_counts.count(folder, n)


def test_rows_counted_here_and_in_forked_workers_add_up(tmp_path: Path) -> None:
    out = io.StringIO()
    folder = str(tmp_path)  # the run's progress folder, as runners.session makes it
    with progress.Watch(lambda: 1000, folder, stream=out, tty=False, every_s=0.05) as watch:
        progress_counts.count(folder, 100)
        ctx = multiprocessing.get_context("fork")
        workers = [ctx.Process(target=_forked_worker, args=(folder, [50, 50, 25])) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert watch.rows() == 100 + 2 * 125
        time.sleep(0.2)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].startswith("converting: 350 rows of 1,000 (35%)"), lines


def test_a_terminal_sees_the_line_live_with_two_workers(tmp_path: Path) -> None:
    pq.write_table(taxi_table(300_000, seed=2), tmp_path / "t.parquet", row_group_size=30_000)
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "recordforge", "convert", "--source", str(tmp_path / "t.parquet")]
        + ["--output", str(tmp_path / "out"), "--direct_num_workers", "2"]
        + ["--direct_running_mode", "multi_processing"],
        stderr=child,
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(child)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    stdout, _ = proc.communicate(timeout=300)
    os.close(main)
    assert proc.returncode == 0, seen.decode()[-2000:]
    shown = [int(n.replace(b",", b"")) for n in re.findall(rb"converting: ([\d,]+) rows of 300,000", seen)]
    assert shown, seen.decode()[-2000:]
    assert shown == sorted(shown) and 0 < shown[-1] <= 300_000  # counted in the forked workers
    assert "wrote 300000 records" in stdout
