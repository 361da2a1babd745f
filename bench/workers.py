"""`python -m bench.workers`: what each worker costs. CPU time (user + system, the whole process
tree) of 2 workers against 1 on a large table, the CPU each worker beyond the first adds to a
small conversion, the default worker count against explicit ones, and the cost of --profile.

Every conversion runs in a fresh process (bench.run's `_run_child`); the compared runs alternate
within each round, so a slow spell of this shared machine weighs on all of them; medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.run import ONE_WORKER, TWO_WORKERS, _run_child, ensure_table, worktree

_WORKERS = ["--direct_running_mode", "multi_processing", "--direct_num_workers"]


def _rounds(
    runs: dict[str, list[str]], repeats: int, trees: dict[str, Path] | None = None
) -> dict[str, list[dict]]:
    """Each run once a round, the order reversed every other round; `trees` names the runs made
    with another checkout's code (--against)."""
    samples: dict[str, list[dict]] = {key: [] for key in runs}
    keys = list(runs)
    for r in range(repeats):
        for key in keys if r % 2 == 0 else reversed(keys):
            samples[key].append(_run_child(runs[key], (trees or {}).get(key)))
    return samples


def _checkout(ref: str, workdir: str) -> tuple[str, Path]:
    """REF's worktree (bench.run's), its C extension built in place if it has none."""
    sha, tree = worktree(ref, Path(workdir))
    if not list((tree / "src" / "recordforge" / "records").glob("_native*.so")):
        subprocess.run(
            [sys.executable, "setup.py", "build_ext", "--inplace", "-q"],
            cwd=tree,
            check=True,
            capture_output=True,
        )
    return sha, tree


def _against(args: argparse.Namespace, w: str) -> None:
    """The two CPU rows, this tree's runs and REF's alternating in the same rounds."""
    sha, tree = _checkout(args.against, w)
    big = ensure_table(os.path.join(w, f"table-{args.rows}.parquet"), args.rows)
    small = ensure_table(os.path.join(w, f"table-{args.small_rows}.parquet"), args.small_rows)
    for table, rows in ((small, args.small_rows), (big, args.rows)):
        runs: dict[str, list[str]] = {}
        trees: dict[str, Path] = {}
        for who in ("this", sha):
            for k in (1, 2):
                key = f"{who} {k}"
                runs[key] = ["recordforge", table, f"{w}/wk_ab_{who}_{k}", str(rows), *_WORKERS, str(k)]
                if who == sha:
                    trees[key] = tree
        cpu = _rounds(runs, args.repeats, trees)
        for who in ("this", sha):
            one, two = _median(cpu[f"{who} 1"], "cpu_s"), _median(cpu[f"{who} 2"], "cpu_s")
            print(
                f"CPU time, {rows} rows, {who}: 1 worker {one:.3f} s, 2 workers {two:.3f} s: "
                f"{two / one:.3f}x, +{two - one:.3f} s"
            )


def _median(samples: list[dict], field: str) -> float:
    return statistics.median(s[field] for s in samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=5_000_000, help="rows of the CPU comparison")
    parser.add_argument("--small_rows", type=int, default=20_000, help="rows of the per-worker cost")
    parser.add_argument("--default_rows", type=int, default=4_000_000, help="rows of the default's check")
    parser.add_argument("--profile_rows", type=int, default=1_000_000, help="rows of --profile's cost")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench/out")
    parser.add_argument(
        "--against", default=None, help="only the CPU rows, this tree against commit REF in the same rounds"
    )
    args = parser.parse_args()
    w = os.path.abspath(args.workdir)
    cores = len(os.sched_getaffinity(0))
    print(f"bench.workers on {cores} cores; {args.repeats} alternating rounds, medians")
    if args.against:
        _against(args, w)
        return

    big = ensure_table(os.path.join(w, f"table-{args.rows}.parquet"), args.rows)
    cpu = _rounds(
        {
            "1": ["recordforge", big, f"{w}/wk_1", str(args.rows), *ONE_WORKER],
            "2": ["recordforge", big, f"{w}/wk_2", str(args.rows), *TWO_WORKERS],
        },
        args.repeats,
    )
    one, two = _median(cpu["1"], "cpu_s"), _median(cpu["2"], "cpu_s")
    print(
        f"CPU time, {args.rows} rows: 1 worker {one:.2f} s, 2 workers {two:.2f} s: {two / one:.3f}x "
        f"(wall {_median(cpu['1'], 'seconds'):.2f} s / {_median(cpu['2'], 'seconds'):.2f} s)"
    )

    small = ensure_table(os.path.join(w, f"table-{args.small_rows}.parquet"), args.small_rows)
    counts = (1, 2, 4)
    per = _rounds(
        {
            str(k): ["recordforge", small, f"{w}/wk_small_{k}", str(args.small_rows), *_WORKERS, str(k)]
            for k in counts
        },
        args.repeats,
    )
    base = _median(per["1"], "cpu_s")
    for k in counts[1:]:
        extra = (_median(per[str(k)], "cpu_s") - base) / (k - 1)
        print(f"CPU per worker beyond the first, {args.small_rows} rows, {k} workers: {extra:.3f} s")

    table = ensure_table(os.path.join(w, f"table-{args.default_rows}.parquet"), args.default_rows)
    n = str(args.default_rows)
    runs = {"default": ["recordforge", table, f"{w}/wk_default", n]}
    runs["1 worker"] = ["recordforge", table, f"{w}/wk_d1", n, *ONE_WORKER]
    for k in sorted({2, cores // 2, cores} - {0, 1}):
        runs[f"{k} workers"] = ["recordforge", table, f"{w}/wk_d{k}", n, *_WORKERS, str(k)]
    times = {key: _median(samples, "seconds") for key, samples in _rounds(runs, args.repeats).items()}
    fastest = min((t, key) for key, t in times.items() if key != "default")
    print(
        f"The default, {args.default_rows} rows: {times['default']:.2f} s; fastest explicit "
        f"({fastest[1]}): {fastest[0]:.2f} s: {times['default'] / fastest[0]:.3f}x; "
        + ", ".join(f"{k} {t:.2f} s" for k, t in times.items() if k != "default")
    )

    prof = ensure_table(os.path.join(w, f"table-{args.profile_rows}.parquet"), args.profile_rows)
    m = str(args.profile_rows)
    p = _rounds(
        {
            "plain": ["recordforge", prof, f"{w}/wk_plain", m, *ONE_WORKER],
            "profiled": ["recordforge", prof, f"{w}/wk_prof", m, *ONE_WORKER, "--profile", f"{w}/trace.json"],
        },
        args.repeats,
    )
    plain, profiled = _median(p["plain"], "seconds"), _median(p["profiled"], "seconds")
    print(
        f"--profile, {args.profile_rows} rows, 1 worker: {plain:.2f} s -> {profiled:.2f} s "
        f"({profiled / plain:.3f}x)"
    )


if __name__ == "__main__":
    main()
