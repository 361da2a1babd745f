"""`python -m bench.sequences`: the sequence path (rows grouped by session into SequenceExamples)
against the plain Example path on the same clickstream, and peak memory as sessions grow 10x.

Each conversion runs on one worker in a fresh process (bench.run's `_run_child`, peak RSS from
wait4) `--repeats` times; medians are printed.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from bench.run import ONE_WORKER, _run_child

FEATURES = [
    {"name": "session", "type": "string", "nulls": "required"},
    {"name": "country", "type": "string"},
    {"name": "ts", "type": "int64", "nulls": "required"},
    {"name": "page", "type": "string"},
    {"name": "dwell", "type": "float32"},
    {"name": "items", "type": "int64", "shape": [-1]},
]
SEQUENCE = {"key": "session", "order": "ts", "context": ["country"], "max_length": 200, "longer": "split"}


def ensure_clickstream(folder: str, events: int, sessions: int, files: int = 8, seed: int = 0) -> str:
    """`events` events of `sessions` sessions in random order over `files` Parquet files; a
    session's country is one value or null; pages, dwell times and item lists null at random."""
    pattern = os.path.join(folder, "*.parquet")
    if os.path.isdir(folder):
        return pattern
    rng = np.random.default_rng(seed)
    session = rng.integers(0, sessions, events)
    country = pa.array(
        np.array(["fr", "de", "jp", None], dtype=object)[rng.integers(0, 4, sessions)][session]
    )
    items_len = np.where(rng.random(events) < 0.2, 0, rng.integers(0, 4, events))
    offsets = np.concatenate([[0], np.cumsum(items_len)]).astype(np.int32)
    items = pa.ListArray.from_arrays(
        pa.array(offsets),
        pa.array(rng.integers(0, 10**6, int(offsets[-1]))),
        mask=pa.array(rng.random(events) < 0.2),
    )
    table = pa.table(
        {
            "session": pa.array(np.char.add("s", session.astype("U9"))),
            "country": country,
            "ts": pa.array(rng.permutation(events).astype(np.int64) * 1000 + 1_700_000_000_000),
            "page": pa.array(
                np.char.add("/p/", rng.integers(0, 500, events).astype("U3")), mask=rng.random(events) < 0.1
            ),
            "dwell": pa.array(rng.integers(0, 4000, events) / 8, pa.float32(), mask=rng.random(events) < 0.2),
            "items": items,
        }
    )
    tmp = folder + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    for k, part in enumerate(np.array_split(np.arange(events), files)):
        pq.write_table(table.take(pa.array(part)), os.path.join(tmp, f"events-{k}.parquet"))
    os.replace(tmp, folder)
    return pattern


def write_schemas(workdir: str) -> tuple[str, str]:
    """(plain schema, sequence schema) of the clickstream."""
    plain, sequence = (
        os.path.join(workdir, "clicks-plain.yaml"),
        os.path.join(workdir, "clicks-sequence.yaml"),
    )
    with open(plain, "w") as f:
        yaml.safe_dump({"features": FEATURES}, f, sort_keys=False)
    with open(sequence, "w") as f:
        yaml.safe_dump({"features": FEATURES, "sequence": SEQUENCE}, f, sort_keys=False)
    return plain, sequence


def _median(samples: list[dict]) -> dict:
    return {
        "rows_per_s": statistics.median(s["rows"] / s["seconds"] for s in samples),
        "peak_rss_mb": statistics.median(s["peak_rss_mb"] for s in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--sessions", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()
    w = os.path.abspath(args.workdir)
    os.makedirs(w, exist_ok=True)
    plain, sequence = write_schemas(w)
    few = ensure_clickstream(
        os.path.join(w, f"clicks-{args.events}-{args.sessions}"), args.events, args.sessions
    )
    many = ensure_clickstream(
        os.path.join(w, f"clicks-{args.events}-{args.sessions * 10}"), args.events, args.sessions * 10
    )
    runs = {
        "examples": ["recordforge", few, f"{w}/clicks-examples", "0", "--schema", plain, *ONE_WORKER],
        "sequences": ["recordforge", few, f"{w}/clicks-sequences", "0", "--schema", sequence, *ONE_WORKER],
        "sequences_10x": [
            "recordforge",
            many,
            f"{w}/clicks-sequences-10x",
            "0",
            "--schema",
            sequence,
            *ONE_WORKER,
        ],
    }
    samples: dict[str, list[dict]] = {key: [] for key in runs}
    for _ in range(args.repeats):
        for key, cmd in runs.items():
            samples[key].append(_run_child(cmd))
    results = {key: _median(s) for key, s in samples.items()}
    print(f"clickstream: {args.events} events, {args.sessions} sessions (10x: {args.sessions * 10}), medians")
    for key, r in results.items():
        print(f"  {key:16} {r['rows_per_s']:>10,.0f} rows/s {r['peak_rss_mb']:>7.0f} MB peak RSS")
    ratio = results["sequences"]["rows_per_s"] / results["examples"]["rows_per_s"]
    growth = results["sequences_10x"]["peak_rss_mb"] / results["sequences"]["peak_rss_mb"]
    print(f"  sequences / examples rows/s: {ratio:.2f}; peak RSS with 10x sessions: {growth:.2f}x")


if __name__ == "__main__":
    main()
