"""Scaling on one many-core machine: `python -m bench.scaling` (the 16-core device measurement).

In one run, on the bench table (`bench/table.py`), GZIP, with the schema `make bench` infers:
1. Parquet at 1, 2, 4, ... workers, plus the default conversion (no runner flags);
2. one large CSV file at 1 worker and at the most workers;
3. Dask (a scheduler and single-threaded workers on 127.0.0.1) against the local runner; with
   --against REF, REF's Dask runner too, on a cluster of its own, in the same rounds.
Every conversion is a fresh `bench.approaches recordforge` process. Rounds alternate the cases,
so each ratio is between medians measured in this run. For each run it records the conversion's
seconds inside the process, the wall time seen from here, the CPU seconds of its process tree, and
the peak memory of the process and all its descendants (the forked workers) as summed
proportional set size, sampled every 0.5 s.
Every result is also appended as a JSON line to --log as it arrives, so a run cut short still
leaves what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.table import ensure_csv, ensure_table


def _tree_pss(root: int) -> int:
    """Bytes of memory that `root` and every process descended from it hold now, as proportional
    set size: a page shared by forked workers counts once in all, not once per worker."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024
        except (OSError, StopIteration, ValueError):
            continue
    return total


def run_once(
    source: str, output: str, rows: int, flags: list[str], timeout: float = 300, tree: str | None = None
) -> dict:
    """One conversion in a fresh process: in-process and wall seconds, peak PSS of its tree.
    With `tree`, that checkout's bench and RecordForge convert."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.approaches", "recordforge", source, output, str(rows), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=_env(tree),
    )
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], _tree_pss(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        err += f"\nkilled after {timeout} s"
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"conversion failed ({proc.returncode}): {' '.join(flags)}\n{err[-3000:]}")
    result = json.loads(out.strip().splitlines()[-1])
    if result["rows"] != rows:
        raise RuntimeError(f"wrote {result['rows']} records, not {rows}: {' '.join(flags)}")
    with open(os.path.join(output, "metadata.json")) as f:
        shards = len(json.load(f)["shards"])
    return {
        "seconds": result["seconds"],
        "wall": wall,
        "peak_pss_mb": peak[0] / 2**20,
        "shards": shards,
        # CPU seconds of the process and every descendant it reaped (the forked workers): with
        # the wall time, whether more workers cost more CPU per row or left cores idle.
        "cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


def _env(tree: str | None) -> dict[str, str] | None:
    return None if tree is None else {**os.environ, "PYTHONPATH": f"{tree}/src:{tree}"}


def workers(n: int) -> list[str]:
    if n == 1:
        return ["--direct_num_workers", "1"]
    return ["--direct_running_mode", "multi_processing", "--direct_num_workers", str(n)]


class Log:
    """Results as they come: printed, and appended to a JSON-lines file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.results: dict[str, list[dict]] = {}

    def add(self, case: str, rows: int, result: dict) -> None:
        self.results.setdefault(case, []).append(result)
        with open(self.path, "a") as f:
            f.write(json.dumps({"case": case, "rows": rows, **result}) + "\n")
        print(
            f"  {case:24s} {result['seconds']:7.2f} s in process, {result['wall']:7.2f} s wall, "
            f"peak {result['peak_pss_mb']:6.0f} MB, {result['cpu']:7.1f} CPU s, {result['shards']} shards",
            flush=True,
        )

    def median(self, case: str, key: str = "seconds") -> float:
        return statistics.median(r[key] for r in self.results[case])

    def line(self, case: str, rows: int) -> str:
        runs = " ".join(f"{r['seconds']:.2f}" for r in self.results[case])
        med = self.median(case)
        rss = max(r["peak_pss_mb"] for r in self.results[case])
        wall = self.median(case, "wall")
        return (
            f"{case:24s} median {med:7.2f} s ({rows / med:>10,.0f} rows/s), wall {wall:7.2f} s, "
            f"peak PSS {rss:6.0f} MB  [{runs}]"
        )


def _rounds(spec: str) -> dict[int, int]:
    """'1:1,16:3' -> {1: 1, 16: 3}: how many runs each worker count gets."""
    return {int(k): int(v) for k, v in (part.split(":") for part in spec.split(","))}


def _interleaved(plan: dict[str, int]) -> list[str]:
    """Cases in rounds: round r runs every case that still has runs left, in the plan's order."""
    order: list[str] = []
    for r in range(max(plan.values(), default=0)):
        order += [case for case, n in plan.items() if n > r]
    return order


def _measure(
    log: Log,
    cases: dict[str, tuple[int, list[str]]],
    source: str,
    out: str,
    rows: int,
    schema: str,
    trees: dict[str, str] | None = None,
) -> None:
    """Each case (runs, flags) converts `source` its number of times, the cases in rounds, with
    the checkout `trees` names for it (else this one); then one line per case."""
    for case in _interleaved({name: runs for name, (runs, _) in cases.items()}):
        flags = ["--schema", schema, *cases[case][1]]
        log.add(case, rows, run_once(source, out, rows, flags, tree=(trees or {}).get(case)))
    for case in cases:
        print(log.line(case, rows), flush=True)


def _parquet(args: argparse.Namespace, w: str, schema: str, log: Log) -> None:
    rows = args.rows
    source = ensure_table(os.path.join(w, f"table-{rows}.parquet"), rows)
    cases = {f"parquet {n}w": (k, workers(n)) for n, k in _rounds(args.rounds).items()}
    if args.default_rounds:
        cases["parquet default"] = (args.default_rounds, [])
    print(f"1. Parquet, {rows:,} rows", flush=True)
    _measure(log, cases, source, os.path.join(w, "out-parquet"), rows, schema)
    if "parquet 1w" in log.results:
        one = log.median("parquet 1w")
        print("vs 1 worker: " + ", ".join(f"{c} {one / log.median(c):.2f}x" for c in cases), flush=True)
    if args.half_rows and args.max_workers in _rounds(args.rounds):
        # Fixed cost per run: T(N) = fixed + N / rate, so fixed = 2 T(N/2) - T(N) at the same workers.
        half = ensure_table(os.path.join(w, f"table-{args.half_rows}.parquet"), args.half_rows)
        case = f"parquet {args.max_workers}w half"
        _measure(
            log,
            {case: (2, workers(args.max_workers))},
            half,
            os.path.join(w, "out-half"),
            args.half_rows,
            schema,
        )
        full = log.median(f"parquet {args.max_workers}w")
        part = log.median(case)
        scale = rows / args.half_rows
        fixed = (scale * part - full) / (scale - 1)
        print(
            f"{args.max_workers} workers: fixed cost per run ~{fixed:.2f} s, marginal rate "
            f"~{(rows - args.half_rows) / (full - part):,.0f} rows/s",
            flush=True,
        )


def _csv(args: argparse.Namespace, w: str, schema: str, log: Log) -> None:
    rows = args.csv_rows
    parquet = ensure_table(os.path.join(w, f"table-{rows}.parquet"), rows)
    t = time.perf_counter()
    one_file = ensure_csv(parquet, os.path.join(w, f"table-{rows}.csv"))
    print(
        f"2. One CSV file, {rows:,} rows, {os.path.getsize(one_file) / 1e9:.2f} GB "
        f"(written in {time.perf_counter() - t:.1f} s)",
        flush=True,
    )
    cases = {
        "csv 1w": (args.csv_one_rounds, workers(1)),
        f"csv {args.max_workers}w": (args.csv_many_rounds, workers(args.max_workers)),
    }
    _measure(log, cases, one_file, os.path.join(w, "out-csv"), rows, schema)
    print(
        f"one CSV file, {args.max_workers} workers vs 1: "
        f"{log.median('csv 1w') / log.median(f'csv {args.max_workers}w'):.2f}x",
        flush=True,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster(port: int, n: int, logs: Any, tree: str | None) -> list[subprocess.Popen]:
    """A scheduler on 127.0.0.1:`port` and `n` single-threaded workers, importing `tree`'s code."""
    common = {"stdout": logs, "stderr": logs, "env": _env(tree)}
    scheduler = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1"]
    procs = [subprocess.Popen([*scheduler, "--port", str(port), "--dashboard-address", ":0"], **common)]
    time.sleep(2)
    worker = [sys.executable, "-m", "distributed.cli.dask_worker", f"tcp://127.0.0.1:{port}"]
    options = ["--nworkers", str(n), "--nthreads", "1", "--host", "127.0.0.1", "--dashboard-address", ":0"]
    procs.append(subprocess.Popen([*worker, *options], **common))
    return procs


def _against(ref: str, w: str) -> tuple[str, str]:
    """REF's checkout (bench/run.py's worktree) with its C extension built: (short sha, folder)."""
    from bench.run import worktree

    sha, tree = worktree(ref, Path(w))
    if not list((tree / "src" / "recordforge").glob("_native*.so")):
        build = [sys.executable, "setup.py", "build_ext", "--inplace"]
        subprocess.run(build, cwd=tree, check=True, capture_output=True)
    return sha, str(tree)


def _dask(args: argparse.Namespace, w: str, schema: str, log: Log) -> None:
    rows = args.rows
    source = ensure_table(os.path.join(w, f"table-{rows}.parquet"), rows)
    n = args.max_workers
    ref = _against(args.against, w) if args.against else None
    logs = open(os.path.join(w, "dask.log"), "w")
    ports = [_free_port() for _ in range(2 if ref else 1)]
    procs = _cluster(ports[0], n, logs, None)
    if ref is not None:  # REF's runner on a cluster of its own, up beside this one
        procs += _cluster(ports[1], n, logs, ref[1])
    try:
        from distributed import Client

        t = time.perf_counter()
        for port in ports:
            with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
                client.wait_for_workers(n, timeout=120)
        print(f"3. Dask: {n} single-threaded workers up in {time.perf_counter() - t:.1f} s", flush=True)
        local, dask = f"local {n}w (vs dask)", f"dask {n}w"
        cases = {
            local: (args.dask_rounds, workers(n)),
            dask: (
                args.dask_rounds,
                ["--runner", "DaskRunner", "--dask_client_address", f"tcp://127.0.0.1:{ports[0]}"],
            ),
        }
        trees = {}
        if ref is not None:
            theirs = f"dask {n}w {ref[0]}"
            cases[theirs] = (
                args.dask_rounds,
                ["--runner", "DaskRunner", "--dask_client_address", f"tcp://127.0.0.1:{ports[1]}"],
            )
            trees[theirs] = ref[1]
        _measure(log, cases, source, os.path.join(w, "out-dask"), rows, schema, trees)
        for case in cases:
            if case != local:
                print(f"{case} / local, {n} workers: {log.median(case) / log.median(local):.2f}x", flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _commit() -> str:
    """The commit measured: $BENCH_COMMIT where the tree was copied without its history."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    except OSError:
        return os.environ.get("BENCH_COMMIT", "?")
    return head.stdout.strip() or os.environ.get("BENCH_COMMIT", "?")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument(
        "--rounds", default="1:1,2:1,4:1,8:2,16:3", help="runs per worker count, WORKERS:RUNS,..."
    )
    parser.add_argument(
        "--default_rounds", type=int, default=1, help="runs of the default conversion (0 to skip)"
    )
    parser.add_argument(
        "--half_rows", type=int, default=5_000_000, help="rows of the fixed-cost estimate (0 to skip)"
    )
    parser.add_argument(
        "--csv_rows", type=int, default=5_000_000, help="rows of the one-CSV-file case (0 to skip)"
    )
    parser.add_argument("--csv_one_rounds", type=int, default=1)
    parser.add_argument("--csv_many_rounds", type=int, default=2)
    parser.add_argument(
        "--dask_rounds",
        type=int,
        default=2,
        help="runs of Dask and of the local runner beside it (0 to skip)",
    )
    parser.add_argument(
        "--against",
        default=None,
        help="a git ref whose Dask runner also runs, on a cluster of its own, in the same rounds",
    )
    parser.add_argument("--parts", default="parquet,csv,dask")
    parser.add_argument("--workdir", default="bench/out")
    parser.add_argument(
        "--log", default=None, help="JSON-lines file of every result (default: WORKDIR/scaling.jsonl)"
    )
    args = parser.parse_args()
    args.max_workers = max(_rounds(args.rounds))

    w = os.path.abspath(args.workdir)
    os.makedirs(w, exist_ok=True)
    log = Log(args.log or os.path.join(w, "scaling.jsonl"))
    cores = len(os.sched_getaffinity(0))
    print(
        f"{platform.node()}: {cores} cores, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, commit {_commit()}",
        flush=True,
    )
    t = time.perf_counter()
    source = ensure_table(os.path.join(w, f"table-{args.rows}.parquet"), args.rows)
    print(f"table of {args.rows:,} rows in {time.perf_counter() - t:.1f} s", flush=True)
    schema = os.path.join(w, "bench-schema.yaml")
    if not os.path.exists(schema):
        with open(schema, "w") as f:
            subprocess.run(
                [sys.executable, "-m", "recordforge", "infer-schema", "--narrow_float64", source],
                check=True,
                stdout=f,
            )
    parts = args.parts.split(",")
    for name, part in (("parquet", _parquet), ("csv", _csv), ("dask", _dask)):
        if name in parts:
            t = time.perf_counter()
            try:
                part(args, w, schema, log)
            except Exception as e:  # one part failing still leaves the others measured
                print(f"{name}: FAILED: {e}", flush=True)
            print(f"({name}: {time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
