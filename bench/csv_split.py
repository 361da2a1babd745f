"""One large CSV file over many workers: `python -m bench.csv_split [--workers N]`.

Converts `make bench`'s table written as one CSV file with one worker and with N workers (the file
read as byte ranges), and the same rows as N CSV files with N workers, in alternating rounds in
one run; prints each median and the ratios between them, measured in that run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics

from bench.run import TWO_WORKERS, _run_child, ensure_csv, ensure_table


def _workers(n: int) -> list[str]:
    if n == 1:
        return ["--direct_num_workers", "1"]
    return [*TWO_WORKERS[:2], "--direct_num_workers", str(n)]


def _split_files(csv_path: str, folder: str, parts: int) -> str:
    """The rows of `csv_path` as `parts` CSV files of whole records (each with the header)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    pattern = os.path.join(folder, "part-*.csv")
    if os.path.isdir(folder) and len(os.listdir(folder)) == parts:
        return pattern
    os.makedirs(folder, exist_ok=True)
    # Every column as text: the parts hold the very cells of the one file.
    with pacsv.open_csv(csv_path) as reader:
        names = reader.schema.names
    table = pacsv.read_csv(
        csv_path, convert_options=pacsv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()))
    )
    step = -(-table.num_rows // parts)
    for i in range(parts):
        pacsv.write_csv(table.slice(i * step, step), os.path.join(folder, f"part-{i:03d}.csv"))
    return pattern


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()

    w = args.workdir
    source = ensure_table(os.path.join(w, f"table-{args.rows}.parquet"), args.rows)
    one_file = ensure_csv(source, os.path.join(w, f"table-{args.rows}.csv"))
    many = _split_files(one_file, os.path.join(w, f"table-{args.rows}-csv-{args.workers}"), args.workers)
    schema = os.path.join(w, "bench-schema.yaml")
    if not os.path.exists(schema):
        raise SystemExit(f"{schema} is missing: run `make bench` once first (it infers the schema)")
    n = str(args.rows)
    cases = {
        "one_1w": ("one file, 1 worker", one_file, 1),
        "one_nw": (f"one file, {args.workers} workers", one_file, args.workers),
        "many_nw": (f"{args.workers} files, {args.workers} workers", many, args.workers),
    }
    seconds: dict[str, list[float]] = {k: [] for k in cases}
    size = os.path.getsize(one_file)
    print(
        f"{platform.node()}: {os.cpu_count()} cores; {args.rows:,} rows, one CSV file of {size / 1e9:.2f} GB"
    )
    for r in range(args.rounds):
        for key, (_, path, workers) in cases.items():
            out = os.path.join(w, f"csv_split_{key}")
            result = _run_child(["recordforge", path, out, n, "--schema", schema, *_workers(workers)])
            if result["rows"] != args.rows:
                raise SystemExit(f"{key}: wrote {result['rows']} records, not {args.rows}")
            seconds[key].append(result["seconds"])
            print(f"  round {r + 1}: {key:8s} {result['seconds']:.2f} s", flush=True)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    for key, (label, _, _) in cases.items():
        print(f"{label:28s} median {med[key]:7.2f} s  ({args.rows / med[key]:,.0f} rows/s)")
    print(f"one file, {args.workers} workers vs 1 worker: {med['one_1w'] / med['one_nw']:.2f}x")
    print(f"{args.workers} files vs one file, {args.workers} workers: {med['one_nw'] / med['many_nw']:.2f}x")


if __name__ == "__main__":
    main()
