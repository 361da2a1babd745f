"""The convert pipeline's flags as Beam options (declared in flags.py), and the check that every
flag given is one RecordForge or Beam knows."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable, Iterator
from typing import Any

from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.errors import UsageError
from recordforge.pipelines.flags import add_flags
from recordforge.runners.adapter import declare_runner_flags

__all__ = ["ConvertOptions", "beam_flag_names", "check_flags"]


class ConvertOptions(PipelineOptions):
    """Flags of `recordforge convert` as Beam pipeline options (flags.py declares them), so that
    Beam neither warns about them nor drops them, and `view_as(ConvertOptions)` reads them."""

    @classmethod
    def _add_argparse_args(cls, parser: argparse.ArgumentParser) -> None:
        add_flags(parser)


class _CheckingParser(argparse.ArgumentParser):
    """A parser for every flag Beam's options classes declare, raising instead of exiting, and
    keeping the names of the flags declared on it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.flag_names: set[str] = set()

    def add_argument(self, *args: Any, **kwargs: Any) -> Any:
        self.flag_names.update(a for a in args if isinstance(a, str) and a.startswith("--"))
        return super().add_argument(*args, **kwargs)

    def add_value_provider_argument(self, *args: Any, **kwargs: Any) -> Any:
        """What options classes call for a flag a template may fill at run time (Beam's
        documented `PipelineOptions` protocol). Only its name and value are checked here, so it
        is declared as a plain flag, optional as Beam makes it."""
        if args and not args[0].startswith("-") and kwargs.get("nargs") is None:
            kwargs["nargs"] = "?"
        return self.add_argument(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _option_classes(cls: type[PipelineOptions] = PipelineOptions) -> Iterator[type[PipelineOptions]]:
    """Every PipelineOptions subclass imported so far, at any depth: what Beam itself would parse."""
    for sub in cls.__subclasses__():
        yield sub
        yield from _option_classes(sub)


def _parser() -> _CheckingParser:
    """Every flag Beam would parse: each options class declares its own through the
    `_add_argparse_args` classmethod, the protocol Beam documents for defining options."""
    parser = _CheckingParser(prog="recordforge convert", add_help=False, allow_abbrev=False)
    # The same class can be defined twice (a module run as __main__ and imported); one per name.
    classes = {f"{c.__module__}.{c.__qualname__}": c for c in _option_classes()}
    for cls in classes.values():
        try:
            # Beam types the parser as its own private subclass; any argparse parser serves.
            cls._add_argparse_args(parser)  # type: ignore[arg-type]
        except argparse.ArgumentError:
            # A user-defined options class re-declaring a flag Beam declares: Beam's own parse
            # would fail on it the same way, later; its flags are not ours to check.
            continue
    return parser


def check_flags(argv: list[str]) -> None:
    """Raises UsageError for a flag that neither RecordForge nor Beam knows (with the nearest
    known name), a value a flag does not accept, or a stray argument (a shell-expanded glob).

    Beam only warns about unknown flags and drops them, so a typo such as `--num-shards 2` would
    otherwise convert with the default and exit 0. Pure: calling it twice is harmless.
    """
    declare_runner_flags(argv)
    parser = _parser()
    _, unknown = parser.parse_known_args(list(argv))
    if not unknown:
        return
    known = sorted(parser.flag_names)
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


def beam_flag_names(given: Iterable[str] = ()) -> set[str]:
    """Every flag Beam would parse (`--name`), RecordForge's among them, and those of the runner
    the `given` flag names point to (the Dask runner declares its own once imported)."""
    declare_runner_flags(given)
    return set(_parser().flag_names)
