"""Start-up: whole-process wall time of `recordforge` commands, this tree against another commit.

    python -m bench.startup --against REF [--rows 20000] [--rounds 7] [--schema FILE]

Each round runs, for both trees in alternating order, `python -m recordforge convert` of a small
table (process start to exit, as a user or a scheduler waits for it); then, for this tree only,
each tool that runs no pipeline. Prints the medians, the ratio REF/this per round and its median,
and whether both trees wrote the same bytes. REF is checked out once, as a git worktree under
--workdir, and runs with this checkout's virtual environment.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.run import ensure_table, shard_digest, worktree

_ROOT = Path(__file__).resolve().parent.parent


def _timed(argv: list[str], src: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", *argv], env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"recordforge {' '.join(argv)} failed ({src}):\n{proc.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--against", required=True, help="the commit to compare with (any git ref)")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--schema", default=None, help="a schema YAML (default: inferred)")
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()

    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    table = ensure_table(str(workdir / f"table-{args.rows}.parquet"), args.rows)
    sha, tree = worktree(args.against, workdir)
    trees = {"this": _ROOT / "src", sha: tree / "src"}
    schema = ["--schema", os.path.abspath(args.schema)] if args.schema else []
    outputs = {name: workdir / f"startup-{name}" for name in trees}

    def convert(name: str) -> float:
        argv = ["convert", "--source", table, "--output", str(outputs[name]), "--overwrite", *schema]
        return _timed(argv, trees[name])

    for name in trees:  # once each before timing: byte-compiled sources, a warm page cache
        convert(name)
    out = str(outputs["this"])

    def shard() -> str:  # each conversion publishes a new version
        return str(next(outputs["this"].glob("v-*/data-*")))

    tools: dict[str, Callable[[], list[str]]] = {
        "--version": lambda: ["--version"],
        "head SHARD -n 1": lambda: ["head", shard(), "-n", "1"],
        "inspect OUT -n 1": lambda: ["inspect", out, "-n", "1"],
        "infer-schema TABLE": lambda: ["infer-schema", table],
        f"verify OUT ({args.rows:,} records)": lambda: ["verify", out],
    }
    times: dict[str, list[float]] = {name: [] for name in [*trees, *tools]}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for name in order:
            times[name].append(convert(name))
        for label, argv in tools.items():
            times[label].append(_timed(argv(), trees["this"]))

    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
        f"{args.rows}-row table, {'schema ' + args.schema if args.schema else 'schema inferred'}; "
        f"{args.rounds} rounds, trees alternating; whole-process wall time, medians"
    )
    for name in trees:
        label = "this tree" if name == "this" else f"at {sha}"
        print(
            f"convert, {label:>17}: {statistics.median(times[name]):6.2f} s   runs: "
            + ", ".join(f"{t:.2f}" for t in times[name])
        )
    ratios = [old / new for old, new in zip(times[sha], times["this"], strict=True)]
    print(
        f"convert: {statistics.median(ratios):.2f}x faster than at {sha} "
        f"(per round: {', '.join(f'{r:.2f}' for r in ratios)})"
    )
    same = shard_digest(str(outputs["this"])) == shard_digest(str(outputs[sha]))
    print(f"same shard bytes from both trees: {'yes' if same else 'NO'}")
    print("\ntools that run no pipeline, this tree:")
    for label in tools:
        median = statistics.median(times[label])
        print(f"  recordforge {label:32} {median:5.2f} s")


if __name__ == "__main__":
    main()
