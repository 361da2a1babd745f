"""The convert pipeline's flags as Beam options (declared in flags.py), and the check that every
flag given is one RecordForge or Beam knows."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.pipelines.command_line import refuse_unknown
from recordforge.pipelines.flags import add_flags
from recordforge.runners.adapter import declare_runner_flags
from recordforge.runners.beam_flags import option_parser

__all__ = ["ConvertOptions", "beam_flag_names", "check_flags"]


class ConvertOptions(PipelineOptions):
    """Flags of `recordforge convert` as Beam pipeline options (flags.py declares them), so that
    Beam neither warns about them nor drops them, and `view_as(ConvertOptions)` reads them."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_flags(parser)


def check_flags(argv: list[str]) -> None:
    """Raises UsageError for a flag that neither RecordForge nor Beam knows (with the nearest
    known name), a value a flag does not accept, or a stray argument (a shell-expanded glob),
    asking every options class imported now, user-defined ones included (command_line.py checks
    the same against a table before Beam is imported). Pure: calling it twice is harmless."""
    declare_runner_flags(argv)
    refuse_unknown(option_parser(), argv)


def beam_flag_names(given: Iterable[str] = ()) -> set[str]:
    """Every flag Beam would parse (`--name`), RecordForge's among them, and those of the runner
    the `given` flag names point to (the Dask runner declares its own once imported)."""
    declare_runner_flags(given)
    return set(option_parser().flag_names)
