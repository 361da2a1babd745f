"""The `recordforge` command line: parses, calls the library, prints."""

from __future__ import annotations

import argparse
import logging
import sys

from recordforge import __version__
from recordforge.errors import RecordForgeError

__all__ = ["main"]

_USAGE = """recordforge COMMAND [flags]

commands:
  convert        convert Parquet/CSV files to TFRecords (recordforge convert --help)
  infer-schema   print the schema YAML inferred from a source file
  inspect        schema, counts per shard and first records of an output (or any TFRecord file)
  verify         check every shard, record CRC, parse and count against the manifest
  stats          per-feature statistics (terminal table, --html page)
  head           first records of any TFRecord file, with an inferred parse spec
  version        print the version
"""


def _convert(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        from recordforge.pipelines.options import ConvertOptions

        parser = argparse.ArgumentParser(
            prog="recordforge convert", epilog="Any other flag is passed to Apache Beam."
        )
        ConvertOptions._add_argparse_args(parser)
        parser.print_help()
        return 0
    from recordforge.pipelines.convert import run

    meta = run(argv)
    out = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--output"), None)
    out = out or next(a.split("=", 1)[1] for a in argv if a.startswith("--output="))
    print(f"wrote {meta['num_records']} records in {len(meta['shards'])} shards to {out}")
    print(
        f"  rows read {meta['rows_read']}, written {meta['rows_written']}, rejected {meta['rows_rejected']}"
    )
    for split, counts in meta.get("split_counts", {}).items():
        print(
            f"  split {split}: {counts['records']} records in {counts['shards']} shards"
            + ("  (empty: not written)" if not counts["records"] else "")
        )
    if meta.get("skipped"):
        print("  unchanged since the last build: nothing was run (--if_changed)")
    print(f"  read it back: recordforge.read({out!r})")
    return 0


def _infer_schema(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="recordforge infer-schema",
        description="Print a complete, commented schema YAML for the source's columns. float64 is "
        "kept bit-exact (encode: bytes) unless --narrow_float64.",
    )
    parser.add_argument("source", help="a Parquet or CSV file (or pattern; the first match is used)")
    parser.add_argument("--format", choices=("parquet", "csv"), default=None)
    parser.add_argument(
        "--sample_rows",
        type=int,
        default=100_000,
        help="rows scanned for the comments (nulls, min/max, list lengths)",
    )
    parser.add_argument(
        "--narrow_float64",
        action="store_true",
        help="write float64 columns as float32 features (narrow: true)",
    )
    args = parser.parse_args(argv)
    from recordforge.pipelines.config import format_from_path
    from recordforge.pipelines.inputs import read_sample
    from recordforge.schemas import dump_schema, infer_schema
    from recordforge.schemas.infer import sample_notes
    from recordforge.transforms.sources import expand_patterns

    first = expand_patterns([args.source])[0].path
    fmt = args.format or format_from_path(first)
    if fmt is None:
        raise RecordForgeError(f"cannot tell the format of {first} from its name; pass --format")
    sample = read_sample(first, fmt, args.sample_rows)
    schema = infer_schema(sample.schema, origin=first, lossless=not args.narrow_float64)
    notes = "".join(f"# note: {n}\n" for n in schema.notes)
    header = f"# inferred from {first}; edit it and pass it with --schema\n{notes}"
    sys.stdout.write(dump_schema(schema, header=header, comments=sample_notes(schema, sample)))
    return 0


def _inspect(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recordforge inspect")
    parser.add_argument("path", help="an output folder, or any TFRecord file")
    parser.add_argument("--split", default=None)
    parser.add_argument("-n", type=int, default=5, help="records to show (or images in --grid)")
    parser.add_argument("--grid", default=None, help="write a labelled PNG grid of the images")
    args = parser.parse_args(argv)
    if args.grid:
        from recordforge.tools.grid import image_grid

        info = image_grid(args.path, args.grid, n=args.n if "-n" in argv else 16)
        print(
            f"wrote {info['png']}: {info['images']} images of {info['image_feature']!r}"
            + (f", labelled by {info['label_feature']!r}" if info["label_feature"] else "")
        )
        return 0
    from recordforge.tools.inspect import format_inspect, inspect

    print(format_inspect(inspect(args.path, split=args.split, n=args.n)))
    return 0


def _head(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recordforge head")
    parser.add_argument("path", help="any TFRecord file of tf.train.Examples (compressed or not)")
    parser.add_argument("-n", type=int, default=5)
    args = parser.parse_args(argv)
    from recordforge.tools.inspect import format_head, head

    print(format_head(head(args.path, args.n)))
    return 0


def _verify(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recordforge verify")
    parser.add_argument("path", help="an output folder")
    args = parser.parse_args(argv)
    from recordforge.tools.verify import verify

    problems = verify(args.path)
    for line in problems:
        print(line)
    if problems:
        print(f"{args.path}: {len(problems)} problem(s)", file=sys.stderr)
        return 1
    print(f"{args.path}: OK")
    return 0


def _stats(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="recordforge stats")
    parser.add_argument("path", help="an output folder, or any TFRecord file")
    parser.add_argument("--html", default=None, help="also write a self-contained HTML page")
    args = parser.parse_args(argv)
    from recordforge.tools.stats import format_stats, stats, stats_html

    result = stats(args.path)
    print(format_stats(result))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(stats_html(result))
        print(f"\nwrote {args.html}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("recordforge").setLevel(logging.INFO)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    commands = {
        "convert": _convert,
        "infer-schema": _infer_schema,
        "inspect": _inspect,
        "head": _head,
        "verify": _verify,
        "stats": _stats,
    }
    if command == "version":
        print(__version__)
        return 0
    if command not in commands:
        print(f"unknown command {command!r}\n\n{_USAGE}", file=sys.stderr)
        return 2
    try:
        return commands[command](rest)
    except (RecordForgeError, FileNotFoundError) as exn:
        print(f"recordforge {command}: error: {exn}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
