"""Resume: the rerun of a conversion killed at about 70% of its pieces, against the whole run.

    python -m bench.resume [--rows 400000] [--files 6] [--after 7] [--workers 2]
                           [--shard_size 8MiB] [--rounds 3] [--workdir DIR]

Each round converts the generated Parquet files once without interruption (timed), then again
into a fresh output killed with SIGKILL at a worker's `--after`th finished part (the crash point
`piece_written` counts per process: with two workers and 8 MiB shards, about 16 parts, the 7th
of one worker is about 75% of the run), then reruns that command (timed). Two times of each:
the whole process (start to exit, as a scheduler waits for it), and the conversion (the
`convert` call, from a resolved command line to the published bundle: the process less its
interpreter start-up and imports, measured inside it as `bench.approaches` does). Prints the
medians, the ratios rerun/whole per round and their medians, and the rows the reruns converted
(`resumed`).
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

from recordforge.output import crashpoints

_ROOT = Path(__file__).resolve().parent.parent


def _run(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(whole process seconds, conversion seconds, exit code) of `recordforge convert ARGV`."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "bench.resume", "--convert", *argv],
        cwd=_ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(_ROOT / "src"), str(_ROOT)]), **(env or {})},
        capture_output=True,
        text=True,
    )
    whole = time.perf_counter() - start
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return whole, json.loads(lines[-1])["seconds"] if lines else float("nan"), proc.returncode


def _convert(argv: list[str]) -> None:
    """`recordforge convert ARGV` timed inside the process, as the command runs it (lean Beam
    imports, a frozen heap: runners/startup.py); prints {"seconds": ...}."""
    from recordforge.runners import startup

    startup.own_process()
    with startup.heavy_imports():
        from recordforge.pipelines.convert import run

    start = time.perf_counter()
    run(argv)
    print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)


def main(argv: list[str] | None = None) -> None:
    args_given = sys.argv[1:] if argv is None else argv
    if args_given[:1] == ["--convert"]:
        _convert(args_given[1:])
        return
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
        return ["--source", str(src / "*.parquet"), "--output", str(out), "--schema", schema,
                "--direct_num_workers", args.workers, "--shard_size", args.shard_size]  # fmt: skip

    whole, rerun, ratios, converted, inner, inner_ratios = [], [], [], [], [], []
    kill = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: args.after}
    for r in range(args.rounds):
        a, b = work / f"whole-{r}", work / f"resumed-{r}"
        for out in (a, b):
            shutil.rmtree(out, ignore_errors=True)
        seconds, conversion, code = _run(command(a))
        assert code == 0, "the uninterrupted run failed"
        _, _, code = _run(command(b), kill)
        assert code == -9, f"the run was not killed ({code})"
        again, again_conversion, code = _run(command(b))
        assert code == 0, "the rerun failed"
        resumed = json.loads((b / "metadata.json").read_text())["resumed"]
        whole.append(seconds)
        rerun.append(again)
        ratios.append(again / seconds)
        inner.append((conversion, again_conversion))
        inner_ratios.append(again_conversion / conversion)
        converted.append(resumed["rows_converted"] / (args.rows * args.files))
        print(f"round {r}: whole process {seconds:.2f} s, rerun {again:.2f} s, ratio {ratios[-1]:.2f}; "
              f"conversion {conversion:.2f} s, rerun {again_conversion:.2f} s, ratio {inner_ratios[-1]:.2f}; "
              f"rows converted by the rerun {converted[-1]:.1%}")  # fmt: skip
    first, again = statistics.median(c for c, _ in inner), statistics.median(c for _, c in inner)
    print(
        f"median: whole process {statistics.median(whole):.2f} s, rerun {statistics.median(rerun):.2f} s, "
        f"rerun/whole {statistics.median(ratios):.2f}; conversion "
        f"{first:.2f} s, rerun {again:.2f} s, "
        f"rerun/whole {statistics.median(inner_ratios):.2f} (ratios per round); rows converted "
        f"{statistics.median(converted):.1%}; {args.rows * args.files:,} rows, killed at a worker's "
        f"part {args.after}"
    )


if __name__ == "__main__":
    main()
