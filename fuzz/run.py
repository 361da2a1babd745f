"""Runs one harness: `python -m fuzz.run TARGET [--runs N | --seconds S] [--seed K] [--engine E]`.

Engines: `atheris` (coverage-guided libFuzzer on RecordForge's Python, the C decoder's branches
reached through it) and `random` (seeded mutations of the seed inputs, no coverage), used where
atheris is not installed. A failing input is written to `--artifacts` and the exit status is 1.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

TARGETS = ("crc32c", "find_records", "data_crc_mismatches", "decode_examples", "tools", "bundle_json")
MAX_LEN = 64 << 10
RSS_LIMIT_MB = 4096
_INTERESTING = [
    0,
    1,
    12,
    16,
    0x7F,
    0x80,
    0xFF,
    0xFFFF,
    1 << 31,
    1 << 32,
    1 << 40,
    (1 << 63) - 1,
    (1 << 64) - 1,
]


def _harness(target: str) -> Callable[[bytes], None]:
    if target == "tools":
        from fuzz.tools import tools

        return tools
    if target == "bundle_json":
        from fuzz.bundle_json import bundle_json

        return bundle_json
    from fuzz import native

    return getattr(native, target)


def _mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[min(at, len(out) - 1)] = rng.choice([0, 0xFF, 0x7F, 0x80, rng.randrange(256)])
        elif op == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 3:
            del out[at : at + rng.randint(1, 64)]
        elif op == 4 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start : start + rng.randint(1, 256)]
        elif op == 5:
            other = rng.choice(pool)
            start = rng.randrange(len(other) + 1)
            out[at:] = other[start:]
        else:
            value = rng.choice(_INTERESTING)
            out[at : at + 8] = struct.pack("<Q", value)
    return bytes(out[:MAX_LEN])


def _random(one: Callable[[bytes], None], seeds: list[bytes], args: argparse.Namespace) -> int:
    """Seeded mutations of the seeds (and of inputs mutated before), `--runs` of them or for
    `--seconds`; the first input that fails is written to the artifacts folder."""
    rng = random.Random(args.seed)
    pool = [s for s in seeds if s] or [b"\x00"]
    deadline = time.monotonic() + args.seconds if args.seconds else None
    runs = 0
    while (not args.runs or runs < args.runs) and (deadline is None or time.monotonic() < deadline):
        data = seeds[runs] if runs < len(seeds) else _mutate(rng, rng.choice(pool), pool)
        try:
            one(data)
        except Exception:  # noqa: BLE001 - every failure of a harness is a finding
            return _found(data, args, traceback.format_exc())
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        if rss_mb > RSS_LIMIT_MB:
            return _found(data, args, f"peak RSS {rss_mb} MB over {RSS_LIMIT_MB} MB")
        if runs >= len(seeds) and rng.random() < 0.1 and len(pool) < 1000:
            pool.append(data)
        runs += 1
    print(f"{args.target}: {runs} inputs (random, seed {args.seed}), no finding", flush=True)
    return 0


def _found(data: bytes, args: argparse.Namespace, why: str) -> int:
    os.makedirs(args.artifacts, exist_ok=True)
    path = os.path.join(args.artifacts, f"{args.target}-crash-{abs(hash(data)):x}")
    with open(path, "wb") as f:
        f.write(data)
    print(f"{args.target}: FINDING, input written to {path}\n{why}", file=sys.stderr, flush=True)
    return 1


def _atheris(target: str, seeds: list[bytes], args: argparse.Namespace) -> int:
    import atheris

    with atheris.instrument_imports(include=["recordforge", "fuzz"]):
        one = _harness(target)
    corpus = tempfile.mkdtemp(prefix=f"recordforge-corpus-{target}-")
    for i, s in enumerate(seeds):
        Path(corpus, f"seed-{i:03d}").write_bytes(s)
    os.makedirs(args.artifacts, exist_ok=True)
    flags = [
        f"-seed={args.seed}",
        f"-max_len={MAX_LEN}",
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        "-timeout=60",
        f"-artifact_prefix={os.path.join(args.artifacts, target)}-",
        "-print_final_stats=1",
    ]
    flags += [f"-runs={args.runs}"] if args.runs else []
    flags += [f"-max_total_time={int(args.seconds)}"] if args.seconds else []

    def checked(data: bytes) -> None:
        one(data)

    atheris.Setup([sys.argv[0], *flags, corpus], checked)
    try:
        atheris.Fuzz()  # libFuzzer exits the process: 0 at the end, non-zero on a finding
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=TARGETS)
    parser.add_argument("--runs", type=int, default=0, help="inputs to run (0: no limit)")
    parser.add_argument("--seconds", type=float, default=0, help="time to run for (0: no limit)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--engine", choices=("atheris", "random"), default=None, help="default: atheris if installed"
    )
    parser.add_argument("--artifacts", default="fuzz/findings")
    args = parser.parse_args(argv)
    if not args.runs and not args.seconds:
        parser.error("give --runs or --seconds")
    from fuzz.bundles import seeds

    work = Path(tempfile.mkdtemp(prefix="recordforge-seeds-"))
    try:
        corpus = seeds(args.target, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    engine = args.engine
    if engine is None:
        try:
            import atheris  # noqa: F401
        except ImportError:
            engine = "random"
        else:
            engine = "atheris"
    if engine == "atheris":
        return _atheris(args.target, corpus, args)
    return _random(_harness(args.target), corpus, args)


if __name__ == "__main__":
    sys.exit(main())
