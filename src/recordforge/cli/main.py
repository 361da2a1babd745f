"""The `recordforge` command line: parses, calls the library, prints."""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from recordforge import interrupts
from recordforge.cli.errors import configure_logging, describe
from recordforge.errors import Interrupted, RecordForgeError, SourceError, UsageError
from recordforge.output.run_report import done_lines
from recordforge.runners import startup
from recordforge.version import __version__

__all__ = ["console", "main"]

_DEBUG_ENV = "RECORDFORGE_DEBUG"
_INTERRUPTED = "interrupted: nothing published; the last published bundle is intact"

_USAGE = """recordforge COMMAND [flags]

commands:
  convert        convert Parquet/CSV files to TFRecords (recordforge convert --help)
  plan           estimate a conversion (rows, bytes, shards, time, cost) before running it
  infer-schema   print the schema YAML inferred from a source file
  inspect        schema, counts per shard and first records of an output (or any TFRecord file)
  verify         check every shard, record CRC, parse and count against the manifest
  stats          per-feature statistics (terminal table, --html page)
  head           first records of any TFRecord file, with an inferred parse spec
  export         a bundle back to Parquet, the source's columns and types (docs/export.md)
  version        print the version (also: recordforge --version)

--debug (anywhere on the command line) or RECORDFORGE_DEBUG=1: show tracebacks and library logs.
"""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless it has none (None, False) or its help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in text.lower():
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A subcommand's parser: a bad command line raises UsageError (one line, exit 2) instead of
    printing the usage block and exiting."""

    def __init__(self, prog: str, description: str) -> None:
        super().__init__(prog=prog, description=description, formatter_class=_HelpFormatter)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _convert(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        from recordforge.pipelines.flags import add_flags

        parser = _Parser(
            "recordforge convert",
            "Convert Parquet/CSV files or an image folder to sharded TFRecords of tf.train.Examples, "
            "with a schema (declared with --schema, or inferred from the first file), "
            "metadata.json and a completion marker.",
        )
        parser.epilog = (
            "Apache Beam's pipeline options (--runner, --project, --region, --temp_location, "
            "--direct_num_workers, ...) are accepted too; any other flag is an error."
        )
        add_flags(parser)
        parser.print_help()
        return 0
    from recordforge.pipelines.command_line import check_command_line

    check_command_line(argv)  # before Beam is imported: a typo fails in a fraction of a second
    with startup.heavy_imports():
        from recordforge.pipelines.options import check_flags

        check_flags(argv)  # Beam's own parse of what the table cannot check (its value types)
        from recordforge.pipelines.convert import convert
        from recordforge.pipelines.resolve import request_from_argv

    run, meta = convert(request_from_argv(argv))
    if run is None:
        from recordforge.runners.dryrun import format_summary

        print("\n".join(format_summary(meta)))
        return 0
    out = run.output  # spans resolved: the folder written, not the pattern given
    print(
        f"wrote {_plural(meta['num_records'], 'record')} in {_plural(len(meta['shards']), 'shard')} to {out}"
    )
    print(
        f"  rows read {meta['rows_read']}, written {meta['rows_written']}, rejected {meta['rows_rejected']}"
    )
    for split, counts in meta.get("split_counts", {}).items():
        print(
            f"  split {split}: {_plural(counts['records'], 'record')} in "
            f"{_plural(counts['shards'], 'shard')}"
            + ("  (empty: not written)" if not counts["records"] else "")
        )
    if meta.get("skipped"):
        why = "no new input file" if run.config.append else "unchanged since the last build"
        print(f"  {why}: nothing was run ({'--append' if run.config.append else '--if_changed'})")
    for line in done_lines(meta):
        print(f"  {line}")
    if run.config.profile:
        from recordforge.tracing.trace import read_summary, summary_lines

        print("\n".join(summary_lines(read_summary(run.config.profile), run.config.profile)))
    print(f"  read it back: recordforge.read({out!r})")
    return 0


def _plan(argv: list[str]) -> int:
    from recordforge.cli.plan import plan_command

    return plan_command(argv)


def _infer_schema(argv: list[str]) -> int:
    parser = _Parser(
        "recordforge infer-schema",
        "Print a complete, commented schema YAML for the source's columns. float64 columns "
        "become float32 features (narrow: true), as convert infers them, unless --lossless_float64.",
    )
    where = "a Parquet, CSV, JSON Lines, ORC or Arrow file (or pattern; the first match is used)"
    parser.add_argument("source", nargs="?", default=None, help=f"{where}; or --source, as convert takes it")
    parser.add_argument("--source", dest="source_flag", default=None, metavar="SOURCE", help=where)
    parser.add_argument(
        "--format",
        choices=("parquet", "csv", "jsonl", "orc", "arrow"),
        default=None,
        help="default: from the file name",
    )
    parser.add_argument(
        "--sample_rows",
        type=int,
        default=100_000,
        help="rows scanned for the comments (nulls, min/max, list lengths)",
    )
    parser.add_argument(
        "--lossless_float64",
        action="store_true",
        help="keep float64 columns bit-exact (encode: bytes) instead of narrowing them to float32",
    )
    parser.add_argument(
        "--sequence_key",
        default=None,
        help="print a `sequence:` block grouping rows by these columns (comma-separated) into "
        "SequenceExamples; needs --sequence_order",
    )
    parser.add_argument("--sequence_order", default=None, help="the column that orders a sequence's steps")
    # The default since float64 is narrowed by default, as convert infers it; still accepted.
    parser.add_argument("--narrow_float64", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if (args.source is None) == (args.source_flag is None):
        parser.error("give the source once: as its one argument or as --source")
    args.source = args.source or args.source_flag
    if (args.sequence_key is None) != (args.sequence_order is None):
        parser.error("--sequence_key and --sequence_order go together")
    from recordforge.files.storage import is_local
    from recordforge.schemas import dump_schema
    from recordforge.schemas.infer import inferred_schema, sample_notes
    from recordforge.sources.probe import format_from_path, read_sample

    # The files, the first of them and the types as `convert` finds them: pinning the printed
    # schema with --schema changes nothing. Local patterns are matched without Beam, by its rules.
    if is_local(args.source):
        from recordforge.files.patterns import local_matches

        matches = local_matches(os.path.abspath(args.source))
        if not matches:
            raise SourceError(f"input pattern {args.source!r} matched no files")
    else:
        from recordforge.transforms.source_types import expand_patterns

        matches = [f.path for f in expand_patterns([args.source])]
    first = matches[0]
    fmt = args.format or format_from_path(first)
    if fmt is None:
        raise RecordForgeError(f"cannot tell the format of {first} from its name; pass --format")
    schema, _ = inferred_schema(first, fmt, matches, lossless=args.lossless_float64)
    if args.sequence_key is not None:
        from recordforge.schemas.sequence import with_sequence

        try:
            schema = with_sequence(schema, args.sequence_key.split(","), args.sequence_order)
        except ValueError as exn:
            parser.error(str(exn))
    sample = read_sample(first, fmt, args.sample_rows)  # for the comments (nulls, ranges)
    notes = "".join(f"# note: {n}\n" for n in schema.notes)
    header = f"# inferred from {first}; edit it and pass it with --schema\n{notes}"
    sys.stdout.write(dump_schema(schema, header=header, comments=sample_notes(schema, sample)))
    return 0


def _inspect(argv: list[str]) -> int:
    parser = _Parser(
        "recordforge inspect",
        "Show an output's schema, record counts per split and shard, and its first records "
        "(or, for a single TFRecord file, what `head` shows).",
    )
    parser.add_argument("path", help="an output folder, or any TFRecord file")
    parser.add_argument("--split", default=None, help="only this split (default: all)")
    parser.add_argument("-n", type=int, default=5, help="records to show (or images in --grid)")
    parser.add_argument(
        "--grid",
        default=None,
        help="write a PNG grid of images sampled over the labels (with --split: of it)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the grid's random sample (default 0)")
    args = parser.parse_args(argv)
    if args.grid:
        from recordforge.tools.grid import image_grid

        info = image_grid(
            args.path, args.grid, n=args.n if "-n" in argv else 16, split=args.split, seed=args.seed
        )
        print(
            f"wrote {info['png']}: {info['images']} images of {info['image_feature']!r}"
            + (f", labelled by {info['label_feature']!r}" if info["label_feature"] else "")
        )
        return 0
    from recordforge.tools.describe import format_inspect, inspect

    print(format_inspect(inspect(args.path, split=args.split, n=args.n)))
    return 0


def _head(argv: list[str]) -> int:
    parser = _Parser(
        "recordforge head",
        "Print the first records of any TFRecord file of tf.train.Examples, with the parse spec "
        "inferred from them.",
    )
    parser.add_argument("path", help="any TFRecord file of tf.train.Examples (compressed or not)")
    parser.add_argument("-n", type=int, default=5, help="records to show")
    args = parser.parse_args(argv)
    from recordforge.tools.describe import format_head, head

    print(format_head(head(args.path, args.n)))
    return 0


def _verify(argv: list[str]) -> int:
    parser = _Parser(
        "recordforge verify",
        "Check every shard of an output: record framing and CRCs, that each record parses "
        "with the schema, and the counts against metadata.json. Exit 1 if anything is wrong.",
    )
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
    parser = _Parser(
        "recordforge stats",
        "Per-feature statistics of an output or a TFRecord file (counts, missing values, "
        "min/max/mean, most frequent values) as a table.",
    )
    parser.add_argument("path", help="an output folder, or any TFRecord file")
    parser.add_argument("--html", default=None, help="also write a self-contained HTML page")
    args = parser.parse_args(argv)
    from recordforge.tools.stats import stats
    from recordforge.tools.stats_format import format_stats, stats_html

    result = stats(args.path)
    print(format_stats(result))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as f:
            f.write(stats_html(result))
        print(f"\nwrote {args.html}")
    return 0


def _export(argv: list[str]) -> int:
    parser = _Parser(
        "recordforge export",
        "Every record of a published bundle (TFRecord, ArrayRecord, WebDataset) back to a table "
        "with the source's column names and types (docs/export.md), as DEST/part-*.parquet.",
    )
    parser.add_argument("output", help="a published output folder")
    parser.add_argument("--to", choices=["parquet"], required=True, help="the table format")
    parser.add_argument("dest", help="the folder to write (local or gs://)")
    parser.add_argument("--split", default=None, help="export this split only (default: every record)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier export at DEST")
    args = parser.parse_args(argv)
    from recordforge.exporting.parquet import export

    manifest = export(args.output, args.dest, to=args.to, split=args.split, overwrite=args.overwrite)
    print(f"{args.dest}: {manifest['rows']} rows in {_plural(len(manifest['files']), 'file')}")
    return 0


def _record_signal(signum: int, frame: Any) -> None:
    """The command's SIGINT and SIGTERM handler: records the signal and returns, raising nothing
    (the command raises `Interrupted` at its next safe point: interrupts.py). A second signal
    while the first is pending, or a signal reaching a child forked from this process (a pool's
    worker inherits the handler), ends the process by the signal's default action at once: the
    publishing protocol leaves the published bundle whole, and a rerun resumes."""
    if interrupts.owner() and not interrupts.received():
        interrupts.record(signum)
        return
    if interrupts.owner():
        try:  # one line, as the first signal's; written directly (no lock is taken in a handler)
            os.write(2, f"recordforge: signal {signum} again: stopped at once\n".encode())
        except OSError:
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _thread_failed(hook: Callable[[Any], object], args: threading.ExceptHookArgs) -> None:
    """A thread's uncaught exception, printed unless the command was interrupted: Beam's threads
    reading the connections of forked workers that the same Ctrl-C ended (interrupts.py)
    fail then, and the interrupt is reported in one line."""
    if not interrupts.received(within=interrupts.MOMENT_S):
        hook(args)


def _interrupted(command: str, signum: int, debug: bool, exn: BaseException) -> int:
    if debug:
        traceback.print_exc()
    what = _INTERRUPTED if command == "convert" else "interrupted"
    # A note the publication added: the run's finished pieces kept for a rerun (publishing.py).
    notes = [str(n) for n in getattr(exn, "__notes__", ())]
    print("; ".join([f"recordforge {command}: {what}", *notes]), file=sys.stderr)
    return 128 + signum


def _run(command: str, handler: Callable[[list[str]], int], argv: list[str], debug: bool) -> int:
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {}
    hook = threading.excepthook
    if in_main_thread:
        interrupts.clear()
        if not debug:
            threading.excepthook = functools.partial(_thread_failed, hook)
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, _record_signal)
    try:
        return handler(argv)
    except (KeyboardInterrupt, Interrupted) as exn:
        signum = exn.signum if isinstance(exn, Interrupted) else signal.SIGINT
        return _interrupted(command, signum, debug, exn)
    except SystemExit as exn:  # argparse after --help
        return exn.code if isinstance(exn.code, int) else 0 if exn.code is None else 1
    except Exception as exn:
        recorded = interrupts.signum() if in_main_thread else None
        if recorded is not None:  # raised where the runner caught the interrupt and wrapped it
            return _interrupted(command, recorded, debug, exn)
        if debug:
            traceback.print_exc()
        message, code = describe(exn)
        print(f"recordforge {command}: error: {message}", file=sys.stderr)
        return code
    finally:
        for sig, handler_before in previous.items():
            signal.signal(sig, handler_before)
        if in_main_thread:  # a later command, or library call, in this process starts afresh
            interrupts.clear()
        threading.excepthook = hook


def main(argv: list[str] | None = None) -> int:
    """Runs one command; returns the exit status (0 ok, 1 error, 2 usage, 128+N on signal N)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get(_DEBUG_ENV, "") not in ("", "0", "false")
    argv = [a for a in argv if a != "--debug"]
    configure_logging(debug)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    commands = {
        "convert": _convert,
        "plan": _plan,
        "infer-schema": _infer_schema,
        "inspect": _inspect,
        "head": _head,
        "verify": _verify,
        "stats": _stats,
        "export": _export,
    }
    if command in ("version", "--version", "-V"):
        print(f"recordforge {__version__}")
        return 0
    if command not in commands:
        import difflib

        guess = difflib.get_close_matches(command, [*commands, "version"], n=1)
        hint = f"; did you mean {guess[0]}?" if guess else " (see recordforge --help)"
        print(f"recordforge: error: unknown command {command!r}{hint}", file=sys.stderr)
        return 2
    return _run(command, commands[command], rest, debug)


def console() -> NoReturn:
    """The `recordforge` process: the console script and `python -m recordforge`."""
    startup.own_process()
    code = main()
    startup.before_exit()
    sys.exit(code)


if __name__ == "__main__":
    console()
