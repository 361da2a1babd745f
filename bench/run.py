"""`make bench`: RecordForge against the tutorial approach on the same table, in the same run.

Every approach runs in a fresh subprocess (so peak RSS is that process's, read by the parent
from wait4) at least three times; medians are printed, with the ratio to the tutorial approach.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

from bench.table import ensure_table


def _run_child(args: list[str]) -> dict:
    proc = subprocess.Popen([sys.executable, "-m", "bench.approaches", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out_chunks = proc.stdout.read()
    err_chunks = proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark {args[0]} failed:\n{err_chunks[-3000:]}")
    result = json.loads(out_chunks.strip().splitlines()[-1])
    result["peak_rss_mb"] = rusage.ru_maxrss / 1024  # Linux reports KiB
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tutorial_rows", type=int, default=100_000,
                        help="rows the per-row tutorial converts per run (its rate is per row; "
                        "a full 1M-row run takes minutes)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()

    source = ensure_table(os.path.join(args.workdir, f"table-{args.rows}.parquet"), args.rows)
    runs = {
        "tutorial (per-row tf.train.Example + TFRecordWriter, GZIP)":
            ["tutorial", source, f"{args.workdir}/tutorial", str(args.tutorial_rows)],
        "recordforge convert (GZIP, default runner, 1 worker)":
            ["recordforge", source, f"{args.workdir}/rf", str(args.rows)],
    }
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; table: {args.rows} rows; {args.repeats} runs each")
    results = {}
    for label, cmd in runs.items():
        samples = [_run_child(cmd) for _ in range(args.repeats)]
        rates = [s["rows"] / s["seconds"] for s in samples]
        results[label] = {
            "rows_per_s": statistics.median(rates),
            "rows": samples[0]["rows"],
            "bytes_per_row": statistics.median(s["bytes"] / s["rows"] for s in samples),
            "peak_rss_mb": statistics.median(s["peak_rss_mb"] for s in samples),
            "all": [round(r) for r in rates],
        }
    base = next(iter(results.values()))["rows_per_s"]
    print(f"\n{'approach':58} {'rows':>9} {'rows/s':>9} {'ratio':>6} {'B/row':>6} {'RSS MB':>7}")
    for label, r in results.items():
        print(f"{label:58} {r['rows']:>9} {r['rows_per_s']:>9.0f} {r['rows_per_s'] / base:>5.1f}x "
              f"{r['bytes_per_row']:>6.1f} {r['peak_rss_mb']:>7.0f}   runs: {r['all']}")


if __name__ == "__main__":
    main()
