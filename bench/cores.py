"""The machine's own ceiling: `python -m bench.cores [--procs 1,8,16]`.

Runs a fixed CPU-bound kernel (Arrow batch to Python-free bytes: numpy arithmetic, ISA-L deflate
and CRC32C over a buffer that fits in cache) in 1 process and in N processes at once, and prints
each count's aggregate throughput over one process's. No conversion scales past this on the same
cores: hyper-threaded siblings, turbo limits and shared caches show here, not in RecordForge.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time


def _kernel(seconds: float) -> int:
    """Rounds of the kernel completed in `seconds`."""
    import google_crc32c
    import numpy as np
    from isal import isal_zlib

    rng = np.random.default_rng(0)
    values = rng.standard_normal(1 << 16)
    done = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        scaled = (values * 1000).astype(np.int64)
        data = scaled.tobytes()
        isal_zlib.compress(data, 1)
        google_crc32c.value(data)
        done += 1
    return done


def _aggregate(procs: int, seconds: float) -> float:
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        return sum(pool.map(_kernel, [seconds] * procs)) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--procs", default=",".join(str(n) for n in sorted({1, max(1, cores // 2), cores})))
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    counts = [int(n) for n in args.procs.split(",")]
    rates: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(args.rounds):
        for n in counts:
            rates[n].append(_aggregate(n, args.seconds))
    one = statistics.median(rates[counts[0]]) if counts[0] == 1 else None
    print(f"{cores} cores; kernel rounds/s, median of {args.rounds}:")
    for n in counts:
        med = statistics.median(rates[n])
        ratio = f"  {med / one:5.2f}x one process ({med / one / n:.0%} per process)" if one else ""
        print(f"  {n:3d} processes: {med:10,.0f}{ratio}", flush=True)


if __name__ == "__main__":
    main()
