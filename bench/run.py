"""`make bench`: RecordForge against the tutorial approach on the same table, in the same run.

Every approach runs in a fresh subprocess (so peak RSS is that process's, read by the parent
from wait4) at least three times; medians are printed, with the ratio to the tutorial approach.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

TWO_WORKERS = ["--direct_running_mode", "multi_processing", "--direct_num_workers", "2"]
# Rows that an older commit given to --against may not be able to run.
_NEWER = frozenset({"rf_webdataset"})
# The one-worker rows say so, whatever the default.
ONE_WORKER = ["--direct_num_workers", "1"]


def ensure_table(path: str, rows: int) -> str:
    subprocess.run([sys.executable, "-m", "bench.table", "parquet", path, str(rows)], check=True)
    return path


def ensure_csv(parquet: str, csv: str) -> str:
    subprocess.run([sys.executable, "-m", "bench.table", "csv", parquet, csv], check=True)
    return csv


def worktree(ref: str, workdir: Path) -> tuple[str, Path]:
    """REF checked out once as a git worktree under `workdir`: (short sha, its folder)."""
    root = Path(__file__).resolve().parent.parent
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{ref}^{{commit}}"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    tree = workdir / f"tree-{sha[:12]}"
    if not (tree / "src" / "recordforge").is_dir():
        subprocess.run(
            ["git", "worktree", "add", "--force", "--detach", str(tree), sha],
            cwd=root,
            check=True,
            capture_output=True,
        )
    return sha[:12], tree


def shard_digest(output: str) -> str:
    """sha256 over the published shards of a conversion's output, in its manifest's order."""
    with open(os.path.join(output, "metadata.json")) as f:
        shards = json.load(f)["shards"]
    digest = hashlib.sha256()
    for shard in shards:
        with open(os.path.join(output, shard["file"]), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def _cpu_times() -> list[int] | None:
    """The machine's CPU time by state (user, nice, system, idle, iowait, irq, softirq, steal...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def _run_child(args: list[str], tree: Path | None = None) -> dict:
    """One approach in a fresh process; with `tree`, that checkout's bench and RecordForge."""
    before = _cpu_times()
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.approaches", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tree,
        env=env,
    )
    out_chunks = proc.stdout.read()
    err_chunks = proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark {args[0]} failed:\n{err_chunks[-3000:]}")
    result = json.loads(out_chunks.strip().splitlines()[-1])
    result["peak_rss_mb"] = rusage.ru_maxrss / 1024  # Linux reports KiB
    # User + system CPU of the process tree: the workers are waited for by their fork server,
    # the fork server by the driver, so wait4 sums them all.
    result["cpu_s"] = rusage.ru_utime + rusage.ru_stime
    # Steal: time the hypervisor gave this VM's CPUs to someone else while the run wanted them.
    # Shared VMs vary run to run; a slow run with high steal was slowed from outside.
    after = _cpu_times()
    if before and after and len(after) > 7:
        spent = [b - a for a, b in zip(before, after, strict=True)]
        result["steal_pct"] = 100 * spent[7] / max(1, sum(spent))
    return result


def _warm_page_cache(folder: str) -> None:
    """Reads every file once before each image run, so that no run pays for a cold disk (the
    200k-file folder was seen evicted by the runs before it): every image run, baseline or not,
    reads from memory."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                f.read()


def _rate(sample: dict) -> float:
    return sample["rows"] / sample["seconds"]


def _summary(samples: list[dict]) -> dict:
    rates = [_rate(s) for s in samples]
    return {
        "rows_per_s": statistics.median(rates),
        "rows": samples[0]["rows"],
        "bytes_per_row": statistics.median(s["bytes"] / s["rows"] for s in samples),
        "peak_rss_mb": statistics.median(s["peak_rss_mb"] for s in samples),
        "steal_pct": max((s.get("steal_pct", 0.0) for s in samples), default=0.0),
        "all": [round(r) for r in rates],
    }


def _with_transforms(schema: str, out: str) -> None:
    """The benchmark schema plus a vocabulary over s0 and a z-score of f0 (as `tft_census`)."""
    import yaml

    with open(schema) as f:
        doc = yaml.safe_load(f)
    for feature in doc["features"]:
        if feature["name"] == "s0":
            feature["transform"] = {"vocabulary": {}, "output": "s0_id"}
        if feature["name"] == "f0":
            feature["transform"] = {"scale_to_z_score": {}}
    with open(out, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--baseline_rows",
        type=int,
        default=100_000,
        help="rows the per-row baselines convert per run (their cost is per row; "
        "a full 1M-row run takes minutes)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--scaling_repeats",
        type=int,
        default=5,
        help="runs of each of the 1- and 2-worker Parquet approaches (at least --repeats): they "
        "run back to back in every round, and their ratio is the most sensitive to this shared "
        "VM's swings (a two-worker run needs both cores)",
    )
    parser.add_argument(
        "--memory_rows", type=int, default=5_000_000, help="rows of the flat-memory check (0 to skip)"
    )
    parser.add_argument(
        "--images",
        type=int,
        default=200_000,
        help="small PNGs in the image-folder comparison (0 to skip); ImageNet-sized folders are "
        "what this path is for, and a run's fixed cost (~1 s) weighs less there",
    )
    parser.add_argument(
        "--baseline_images",
        type=int,
        default=20_000,
        help="images the per-image tutorial reads per run (its cost is per image)",
    )
    parser.add_argument("--only", default=None, help="comma-separated approach keys to run")
    parser.add_argument(
        "--against",
        default=None,
        metavar="REF",
        help="also run each recordforge conversion row with the code of commit REF (a git "
        "worktree), right after this tree's in every round, and print REF's time / this tree's",
    )
    parser.add_argument("--workdir", default="bench/out")
    args = parser.parse_args()

    w = os.path.abspath(args.workdir)
    source = ensure_table(os.path.join(w, f"table-{args.rows}.parquet"), args.rows)
    csv = ensure_csv(source, os.path.join(w, f"table-{args.rows}.csv"))
    # Both formats convert with the same schema, so that their outputs are the same records.
    schema = os.path.join(w, "bench-schema.yaml")
    if not os.path.exists(schema):
        subprocess.run(
            [sys.executable, "-m", "recordforge", "infer-schema", "--narrow_float64", source],
            check=True,
            stdout=open(schema, "w"),
        )
    tft_schema = os.path.join(w, "bench-schema-tft.yaml")
    if not os.path.exists(tft_schema):
        _with_transforms(schema, tft_schema)
    n, b = str(args.rows), str(args.baseline_rows)
    runs = {
        "tutorial": (
            "tutorial: per-row tf.train.Example + TFRecordWriter, GZIP",
            ["tutorial", source, f"{w}/tutorial", b],
        ),
        "tfx": (
            "TFX-style: ReadFromParquet dicts, dict_to_example, WriteToTFRecord",
            ["tfx", source, f"{w}/tfx", b],
        ),
        "rf": (
            "recordforge, Parquet, GZIP, 1 worker",
            ["recordforge", source, f"{w}/rf", n, "--schema", schema, *ONE_WORKER],
        ),
        # Right after the conversion, in every round: reading the bundle it wrote.
        "rf_verify": (
            "recordforge verify of the bundle rf wrote (same round)",
            ["verify", f"{w}/rf", "-", n],
        ),
        "rf_stats": (
            "recordforge stats of the bundle rf wrote (same round)",
            ["stats", f"{w}/rf", "-", n],
        ),
        "rf_export": (
            "recordforge export --to parquet of the bundle rf wrote (same round)",
            ["export", f"{w}/rf", "-", n],
        ),
        "rf_2w": (
            "recordforge, Parquet, GZIP, 2 workers (multi_processing)",
            [
                "recordforge",
                source,
                f"{w}/rf_2w",
                n,
                "--schema",
                schema,
                *TWO_WORKERS,
            ],
        ),
        # No runner flag: what a plain `recordforge convert` does (every core this process may use).
        "rf_default": (
            f"recordforge, Parquet, GZIP, no runner flags (every core: {len(os.sched_getaffinity(0))} here)",
            ["recordforge", source, f"{w}/rf_default", n, "--schema", schema],
        ),
        "rf_beam_sink": (
            "recordforge's reader + Beam's WriteToTFRecord, Parquet, GZIP",
            ["beam_sink", source, f"{w}/rf_beam", n, schema],
        ),
        "rf_shuffle": (
            "recordforge --shuffle (seeded global order), Parquet, GZIP, 1 worker",
            ["recordforge", source, f"{w}/rf_shuffle", n, "--schema", schema, "--shuffle", *ONE_WORKER],
        ),
        "rf_count": (
            "recordforge --num_shards 4 --splits train=8,eval=2, Parquet, GZIP, 1 worker",
            [
                "recordforge",
                source,
                f"{w}/rf_count",
                n,
                "--schema",
                schema,
                "--num_shards",
                "4",
                "--splits",
                "train=8,eval=2",
                *ONE_WORKER,
            ],
        ),
        "rf_det": (
            "recordforge --deterministic --splits train=8,eval=2, Parquet, GZIP, 1 worker",
            [
                "recordforge",
                source,
                f"{w}/rf_det",
                n,
                "--schema",
                schema,
                "--deterministic",
                "--splits",
                "train=8,eval=2",
                *ONE_WORKER,
            ],
        ),
        # Random access: the uncompressed conversion the other formats are measured against, the
        # same with a record index, ArrayRecord; then random reads from the bundles they wrote.
        "rf_none": (
            "recordforge, Parquet, uncompressed TFRecord, 1 worker",
            [
                "recordforge",
                source,
                f"{w}/rf_none",
                n,
                "--schema",
                schema,
                "--compression",
                "none",
                *ONE_WORKER,
            ],
        ),
        "rf_webdataset": (
            "recordforge --output_format webdataset (tar samples), 1 worker",
            [
                "recordforge",
                source,
                f"{w}/rf_wds",
                n,
                "--schema",
                schema,
                "--output_format",
                "webdataset",
                *ONE_WORKER,
            ],
        ),
        "rf_indexed": (
            "recordforge --record_index (uncompressed TFRecord), 1 worker",
            ["recordforge", source, f"{w}/rf_indexed", n, "--schema", schema, "--record_index", *ONE_WORKER],
        ),
        "rf_array_record": (
            "recordforge --output_format array_record, 1 worker",
            [
                "recordforge",
                source,
                f"{w}/rf_ar",
                n,
                "--schema",
                schema,
                "--output_format",
                "array_record",
                *ONE_WORKER,
            ],
        ),
        "reads_indexed": (
            "random reads, data_source over rf_indexed's bundle, 1 core",
            ["random_reads", f"{w}/rf_indexed", "-", "100000"],
        ),
        "reads_array_record": (
            "random reads, data_source over rf_array_record's bundle, 1 core",
            ["random_reads", f"{w}/rf_ar", "-", "100000"],
        ),
        "rf_csv": (
            "recordforge, CSV, GZIP, 1 worker",
            ["recordforge", csv, f"{w}/rf_csv", n, "--schema", schema, *ONE_WORKER],
        ),
        "tft_census": (
            "TFT census-style: instance dicts, vocab + z-score, per-row coder",
            ["tft_census", source, f"{w}/tft_census", b],
        ),
        "rf_tft": (
            "recordforge, same vocab + z-score schema (TFT, record batches)",
            ["recordforge", source, f"{w}/rf_tft", n, "--schema", tft_schema, *ONE_WORKER],
        ),
    }
    if args.images:
        folder = os.path.join(w, f"mnist-{args.images}")
        if not os.path.exists(folder):
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from demo.sampledata import "
                    "mnist_folder; mnist_folder(sys.argv[1], per_class=int(sys.argv[2]))",
                    folder + ".tmp",
                    str(max(1, args.images * 5 // 60)),
                ],
                check=True,
            )
            os.replace(folder + ".tmp", folder)
        runs["tutorial_images"] = (
            "tutorial images: per file read + tf.io.decode_png + Example",
            ["tutorial_images", folder, f"{w}/tutorial_images", str(args.baseline_images)],
        )
        runs["rf_images"] = (
            "recordforge --format images (folder of small PNGs), 1 worker",
            ["recordforge", folder, f"{w}/rf_images", "0", "--format", "images", *ONE_WORKER],
        )
        runs["rf_images_2w"] = (
            "recordforge --format images, 2 workers (multi_processing)",
            ["recordforge", folder, f"{w}/rf_images_2w", "0", "--format", "images", *TWO_WORKERS],
        )
    if args.only:
        wanted = args.only.split(",")
        runs = {
            k: v
            for k, v in runs.items()
            if k in wanted
            or k == "tutorial"
            or (k in ("rf_verify", "rf_stats", "rf_export") and "rf" in wanted)
            or (k == "reads_indexed" and "rf_indexed" in wanted)
            or (k == "reads_array_record" and "rf_array_record" in wanted)
        }
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; table: {args.rows} rows (baselines: {args.baseline_rows} "
        f"per run); {args.repeats} runs each ({max(args.repeats, args.scaling_repeats)} of the 1- and "
        "2-worker Parquet runs, back to back), medians"
    )
    # Rounds: every approach once per round, so that a slow spell of this shared machine weighs on
    # all approaches alike instead of on whichever ran during it; ratios are also given per round.
    samples: dict[str, list[dict]] = {key: [] for key in runs}
    paired = [key for key in ("rf", "rf_2w") if key in runs]
    # With --against: REF's run of the same conversion (own output folder), in the same round.
    ref = worktree(args.against, Path(w)) if args.against else None
    # Rows whose flags an older REF may not know (a new output format) are not run with it.
    compared = (
        [key for key, (_, cmd) in runs.items() if cmd[0] == "recordforge" and key not in _NEWER]
        if ref
        else []
    )
    against: dict[str, list[dict]] = {key: [] for key in compared}
    # Per round, (this tree's, the other's) shard digest: a difference names its tree and round.
    digests: dict[str, list[tuple[str, str]]] = {key: [] for key in compared}
    for round_ in range(max(args.repeats, args.scaling_repeats)):
        for key, (_, cmd) in runs.items():
            if round_ >= args.repeats and key not in paired:
                continue  # the extra rounds run only the 1- and 2-worker pair, back to back
            if "images" in key:
                _warm_page_cache(cmd[1])
            if key not in against:
                samples[key].append(_run_child(cmd))
                continue
            theirs = [cmd[0], cmd[1], f"{cmd[2]}@{ref[0]}", *cmd[3:]]
            if round_ % 2:  # which tree goes first alternates
                against[key].append(_run_child(theirs, ref[1]))
                samples[key].append(_run_child(cmd))
            else:
                samples[key].append(_run_child(cmd))
                against[key].append(_run_child(theirs, ref[1]))
            digests[key].append((shard_digest(cmd[2]), shard_digest(theirs[2])))
    results = {key: (label, _summary(samples[key])) for key, (label, _) in runs.items()}
    base = results["tutorial"][1]["rows_per_s"]
    print(
        f"\n{'approach':64} {'rows':>9} {'rows/s':>9} {'vs tut.':>7} {'B/row':>6} {'RSS MB':>7} {'steal':>6}"
    )
    for label, r in results.values():
        print(
            f"{label:64} {r['rows']:>9} {r['rows_per_s']:>9.0f} {r['rows_per_s'] / base:>6.1f}x "
            f"{r['bytes_per_row']:>6.1f} {r['peak_rss_mb']:>7.0f} {r['steal_pct']:>5.1f}%   runs: {r['all']}"
        )
    print("(steal: the most CPU time the hypervisor took from this VM during any one run of the approach)")
    rf = results.get("rf", (None, None))[1]

    def ratio(key: str, base: str, text: str, digits: int = 2) -> None:
        if key in results and base in results:
            # Rounds both ran in (the 1- and 2-worker pair has extra rounds of its own).
            rounds = [_rate(a) / _rate(b) for a, b in zip(samples[key], samples[base], strict=False)]
            median = results[key][1]["rows_per_s"] / results[base][1]["rows_per_s"]
            print(f"{text}: {median:.{digits}f}x (per round: {', '.join(f'{r:.{digits}f}' for r in rounds)})")

    print()
    if ref:
        print(f"Against {ref[0]} (its time / this tree's; same rows, same round):")
        for key, theirs in against.items():
            rounds = [_rate(a) / _rate(b) for a, b in zip(samples[key], theirs, strict=True)]
            same = "same" if len({d for pair in digests[key] for d in pair}) == 1 else "DIFFERENT"
            print(
                f"  {key:14} {statistics.median(rounds):.2f}x ({_summary(theirs)['rows_per_s']:.0f} -> "
                f"{results[key][1]['rows_per_s']:.0f} rows/s; per round: "
                f"{', '.join(f'{r:.2f}' for r in rounds)}; peak RSS {_summary(theirs)['peak_rss_mb']:.0f} -> "
                f"{results[key][1]['peak_rss_mb']:.0f} MB; {same} output bytes)"
            )
            if same != "same":
                for i, (ours, other) in enumerate(digests[key]):
                    print(f"    round {i + 1}: this tree {ours[:16]}, {ref[0]} {other[:16]}")
        print()
    ratio("rf_2w", "rf", "2 workers vs 1")
    ratio("rf_default", "rf", "the default (every core) vs 1 worker")
    for key, workers in (("rf_images", "1 worker"), ("rf_images_2w", "2 workers")):
        if key in results:  # the folder's real count (the generator rounds per class)
            count = results[key][1]["rows"]
            ratio(
                key,
                "tutorial_images",
                f"Images ({count} PNGs), {workers} vs the tutorial per-image approach",
                1,
            )
    ratio("rf_tft", "tft_census", "Vocabulary + z-score: recordforge vs TFT census-style", 1)
    ratio("rf", "rf_csv", "Parquet vs CSV throughput")
    ratio("rf_indexed", "rf_none", "--record_index vs uncompressed TFRecord throughput")
    ratio("rf_array_record", "rf_none", "--output_format array_record vs uncompressed TFRecord throughput")
    ratio("rf_webdataset", "rf_none", "--output_format webdataset vs uncompressed TFRecord throughput")
    for key in ("reads_indexed", "reads_array_record"):
        if key in results:
            print(f"{results[key][0]}: {results[key][1]['rows_per_s']:.0f} reads/s")
    ratio("rf", "rf_shuffle", "Unshuffled vs --shuffle throughput (the cost of the global order)")
    for key, what in (("rf_verify", "verify"), ("rf_stats", "stats"), ("rf_export", "export")):
        if key in results and "rf" in results:
            # Seconds, same rounds: the conversion that wrote the bundle, then reading it back.
            conv = statistics.median(x["seconds"] for x in samples["rf"][: len(samples[key])])
            took = statistics.median(x["seconds"] for x in samples[key])
            per = ", ".join(
                f"{b['seconds']:.2f}/{a['seconds']:.2f}"
                for a, b in zip(samples["rf"], samples[key], strict=False)
            )
            print(
                f"{what} of the {args.rows}-record GZIP bundle: {took:.2f} s, its conversion {conv:.2f} s "
                f"({took / conv:.2f}x the conversion's time; per round {what}/conversion s: {per})"
            )
    if rf and args.memory_rows:
        # At 5M rows the fixed costs (pipeline start-up, worker processes importing Beam) weigh
        # less: the same comparisons of memory and of one against two workers.
        big = ensure_table(os.path.join(w, f"table-{args.memory_rows}.parquet"), args.memory_rows)
        cmd = ["recordforge", big, f"{w}/rf_big", str(args.memory_rows), "--schema", schema, *ONE_WORKER]
        big_samples: tuple[list[dict], list[dict]] = ([], [])
        for _ in range(args.repeats):
            big_samples[0].append(_run_child(cmd))
            big_samples[1].append(_run_child([*cmd, *TWO_WORKERS]))
        one, two = _summary(big_samples[0]), _summary(big_samples[1])
        print(
            f"Peak RSS, {args.memory_rows} rows vs {args.rows}: {one['peak_rss_mb']:.0f} MB vs "
            f"{rf['peak_rss_mb']:.0f} MB ({one['peak_rss_mb'] / rf['peak_rss_mb']:.2f}x)"
        )
        print(
            f"{args.memory_rows} rows, 1 worker: {one['rows_per_s']:.0f} rows/s (runs {one['all']}); "
            f"2 workers: {two['rows_per_s']:.0f} rows/s (runs {two['all']}): "
            f"{two['rows_per_s'] / one['rows_per_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
