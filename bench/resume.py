"""Resume: the rerun of a conversion killed at about 70% of its pieces, against the whole run.

    python -m bench.resume [--rows 400000] [--files 6] [--after 7] [--workers 2]
                           [--shard_size 8MiB] [--rounds 3] [--workdir DIR]

Each round converts the generated Parquet files once without interruption (timed), then again
into a fresh output killed with SIGKILL at a worker's `--after`th finished part (the crash point
`piece_written` counts per process: with two workers and 8 MiB shards, about 16 parts, the 7th
of one worker is about 75% of the run), then reruns that command (timed). Both times are whole
processes (start to exit, as a scheduler waits for them). Prints the medians, the ratio
rerun/whole per round and its median, and the rows the reruns converted (`resumed`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from recordforge import crashpoints

_ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", *argv],
        env={**os.environ, "PYTHONPATH": str(_ROOT / "src"), **(env or {})},
        capture_output=True,
        text=True,
    )
    return time.perf_counter() - start, proc.returncode


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400_000, help="rows per file")
    parser.add_argument("--files", type=int, default=6)
    parser.add_argument("--after", default="7", help="a worker's finished parts before the kill")
    parser.add_argument("--workers", default="2")
    parser.add_argument("--shard_size", default="8MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", default="out/bench-resume")
    args = parser.parse_args(argv)
    import pyarrow.parquet as pq

    sys.path.insert(0, str(_ROOT))
    from demo.sampledata import taxi_table

    work = Path(args.workdir)
    src = work / "src"
    if len(list(src.glob("*.parquet"))) != args.files:
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        for i in range(args.files):
            table = taxi_table(args.rows, seed=i, first_id=i * args.rows)
            pq.write_table(table, src / f"t{i}.parquet", row_group_size=50_000)
    schema = str(_ROOT / "examples" / "taxi.yaml")

    def command(out: Path) -> list[str]:
        return ["convert", "--source", str(src / "*.parquet"), "--output", str(out), "--schema", schema,
                "--direct_num_workers", args.workers, "--shard_size", args.shard_size]  # fmt: skip

    whole, rerun, ratios, converted = [], [], [], []
    kill = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: args.after}
    for r in range(args.rounds):
        a, b = work / f"whole-{r}", work / f"resumed-{r}"
        for out in (a, b):
            shutil.rmtree(out, ignore_errors=True)
        seconds, code = _run(command(a))
        assert code == 0, "the uninterrupted run failed"
        _, code = _run(command(b), kill)
        assert code == -9, f"the run was not killed ({code})"
        again, code = _run(command(b))
        assert code == 0, "the rerun failed"
        resumed = json.loads((b / "metadata.json").read_text())["resumed"]
        whole.append(seconds)
        rerun.append(again)
        ratios.append(again / seconds)
        converted.append(resumed["rows_converted"] / (args.rows * args.files))
        print(f"round {r}: whole {seconds:.2f} s, rerun {again:.2f} s, ratio {again / seconds:.2f}, "
              f"rows converted by the rerun {converted[-1]:.1%}")  # fmt: skip
    print(
        f"median: whole {statistics.median(whole):.2f} s, rerun {statistics.median(rerun):.2f} s, "
        f"rerun/whole {statistics.median(ratios):.2f} (per round), rows converted "
        f"{statistics.median(converted):.1%}; {args.rows * args.files:,} rows, killed at a worker's "
        f"part {args.after}"
    )


if __name__ == "__main__":
    main()
