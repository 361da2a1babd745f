"""A `recordforge convert` command line checked before Beam is imported: every flag one that
RecordForge or Beam knows (Beam's from runners/beam_flag_table.py), values of the types they take."""

from __future__ import annotations

import argparse
import difflib

from recordforge.errors import UsageError
from recordforge.pipelines.flags import add_flags
from recordforge.runners.beam_flags import CheckingParser, add_beam_flags

__all__ = ["check_command_line", "refuse_unknown"]


def check_command_line(argv: list[str]) -> None:
    """Raises UsageError, as `options.check_flags` would, for what can be told wrong without
    Beam: an unknown flag (with the nearest known name), a stray argument, a value an int,
    float or choice flag does not take. Beam checks the rest once imported."""
    parser = CheckingParser(prog="recordforge convert", add_help=False, allow_abbrev=False)
    add_flags(parser)
    add_beam_flags(parser)
    refuse_unknown(parser, argv)


def refuse_unknown(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """Parses `argv` with `parser` (which raises UsageError on a bad value) and raises UsageError
    for the first flag it does not know, or for stray arguments.

    Beam only warns about unknown flags and drops them, so a typo such as `--num-shards 2` would
    otherwise convert with the default and exit 0."""
    _, unknown = parser.parse_known_args(list(argv))
    if not unknown:
        return
    known = sorted(getattr(parser, "flag_names", ()))
    first = unknown[0]
    if first.startswith("-") and first != "-":
        name = first.split("=", 1)[0]
        # Beam's flags use underscores; a dashed spelling is the most common slip.
        guesses = difflib.get_close_matches(name.replace("-", "_").replace("__", "--", 1), known, n=1)
        hint = f"; did you mean {guesses[0]}?" if guesses else ""
        raise UsageError(f"unknown flag {name}{hint}")
    stray = " ".join(a for a in unknown if not a.startswith("-"))
    raise UsageError(
        f"unexpected argument(s) {stray}: each flag takes one value. If the shell expanded an "
        "unquoted pattern such as --source data/*.parquet, quote it: --source 'data/*.parquet'"
    )
