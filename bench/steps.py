"""Per-step rates of the conversion's data path on one core: `python -m bench.steps [--rows N]`.

Run it with another tree's src on PYTHONPATH to compare (this file runs on older trees too).
Reads the bench table's first N rows (`bench/table.py`, the schema `make bench` infers) once,
then times each step alone over the same batches, in rounds (median of --rounds): decoding the
Parquet file, conforming, encoding Examples, framing TFRecords, deflating (isal, level 1) and
sha256 of the compressed bytes. Prints rows/s per step and the rate of all of them in sequence.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import pyarrow.parquet as pq

from bench.table import ensure_table


def _timed(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()

    import hashlib

    from isal import isal_zlib

    from recordforge.conforming.conform import conform_batch
    from recordforge.records import tfrecord
    from recordforge.records.encoding import ExampleEncoder
    from recordforge.schemas import compile_schema, load_schema

    w = os.path.abspath(args.workdir)
    source = ensure_table(os.path.join(w, "table-1000000.parquet"), 1_000_000)
    schema = os.path.join(w, "bench-schema.yaml")
    if not os.path.exists(schema):
        with open(schema, "w") as f:
            subprocess.run(
                [sys.executable, "-m", "recordforge", "infer-schema", "--narrow_float64", source],
                check=True,
                stdout=f,
            )
    plan = compile_schema(load_schema(schema))
    pf = pq.ParquetFile(source)

    def read() -> list:
        out, rows = [], 0
        for batch in pf.iter_batches(batch_size=16384, use_threads=False):
            out.append(batch.slice(0, min(len(batch), args.rows - rows)))
            rows += len(out[-1])
            if rows >= args.rows:
                break
        return out

    batches = read()
    conformed = [conform_batch(b, plan, file="t", first_row=0).batch for b in batches]
    encoder = ExampleEncoder(plan)
    encoded = [encoder.encode(c) for c in conformed]
    if hasattr(tfrecord, "framed"):
        frame = tfrecord.framed
    else:  # an older tree (`--against`-style comparisons): the same bytes as an Arrow array
        from recordforge.arrays import binary_parts

        def frame(records: object) -> tuple:
            return binary_parts(tfrecord.frame_records(records))

    frames = [frame(e)[1] for e in encoded]
    deflated: list[bytes] = []

    def deflate() -> None:
        deflated.clear()
        comp = isal_zlib.compressobj(1, isal_zlib.DEFLATED, -15)
        deflated.extend(comp.compress(f) for f in frames)
        deflated.append(comp.flush())

    def sha() -> None:
        h = hashlib.sha256()
        for d in deflated:
            h.update(d)

    deflate()
    steps = {
        "Parquet decode (one thread)": read,
        "conform": lambda: [conform_batch(b, plan, file="t", first_row=0) for b in batches],
        "encode Examples": lambda: [encoder.encode(c) for c in conformed],
        "frame (length, CRC32Cs)": lambda: [frame(e) for e in encoded],
        "deflate (isal level 1)": deflate,
        "sha256 of the compressed": sha,
    }
    rows = sum(len(b) for b in batches)
    raw = sum(len(f) for f in frames)
    print(f"{rows} rows, {raw / rows:.1f} framed bytes per row, median of {args.rounds} rounds")
    total = 0.0
    for name, fn in steps.items():
        seconds = _timed(fn, args.rounds)
        total += seconds
        print(f"  {name:30s} {rows / seconds:>12,.0f} rows/s  ({1e6 * seconds / rows:.2f} us/row)")
    print(f"  {'all in sequence':30s} {rows / total:>12,.0f} rows/s  ({1e6 * total / rows:.2f} us/row)")


if __name__ == "__main__":
    main()
