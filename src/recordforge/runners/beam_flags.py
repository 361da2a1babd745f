"""Beam's pipeline flags as data (`beam_flag_table.py`), so that a command line is checked before
Beam is imported; `python -m recordforge.runners.beam_flags` writes the table from Beam itself."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from recordforge.errors import UsageError
from recordforge.runners.beam_flag_table import BEAM_FLAGS, BEAM_VERSION

__all__ = [
    "BEAM_FLAGS",
    "BEAM_VERSION",
    "CheckingParser",
    "add_beam_flags",
    "option_parser",
    "table_from_beam",
]


class CheckingParser(argparse.ArgumentParser):
    """A parser raising UsageError instead of exiting, and keeping the names of its flags."""

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


def _option_classes(cls: type | None = None) -> Iterator[type]:
    """Every PipelineOptions subclass imported so far, at any depth: what Beam itself would parse."""
    if cls is None:
        from apache_beam.options.pipeline_options import PipelineOptions

        cls = PipelineOptions
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        yield sub
        yield from _option_classes(sub)


def option_parser(prog: str = "recordforge convert") -> CheckingParser:
    """Every flag Beam would parse now: each options class imported so far declares its own
    through the `_add_argparse_args` classmethod, the protocol Beam documents for defining
    options. Imports Beam."""
    parser = CheckingParser(prog=prog, add_help=False, allow_abbrev=False)
    # The same class can be defined twice (a module run as __main__ and imported); one per name.
    classes = {f"{c.__module__}.{c.__qualname__}": c for c in _option_classes()}
    for cls in classes.values():
        try:
            cls._add_argparse_args(parser)  # type: ignore[attr-defined]
        except argparse.ArgumentError:
            # A user-defined options class re-declaring a flag Beam declares: Beam's own parse
            # would fail on it the same way, later; its flags are not ours to check.
            continue
    return parser


_TYPES: dict[str, Any] = {"int": int, "float": float}


def add_beam_flags(parser: argparse.ArgumentParser) -> None:
    """Declares Beam's flags on `parser` as the table records them: names and aliases, whether
    each takes a value, and the values an int, float or choice flag accepts. Other value types
    (Beam's own parsers) are checked by Beam itself once it is imported."""
    for names, kind, type_name, choices in BEAM_FLAGS:
        kwargs: dict[str, Any] = {"dest": names[0].lstrip("-"), "default": None}
        if kind == "switch":
            kwargs["action"] = "store_true"
        elif kind == "optional":
            kwargs["nargs"] = "?"
        elif kind == "list":
            kwargs["action"] = "append"
        if kind != "switch":
            kwargs.update(type=_TYPES.get(type_name, str), choices=choices)
        try:
            parser.add_argument(*names, **kwargs)
        except argparse.ArgumentError:
            continue  # declared already (RecordForge's own flags come first)


def table_from_beam() -> tuple[str, list[tuple[tuple[str, ...], str, str, tuple[str, ...] | None]]]:
    """Beam's version and every flag its options classes declare (the Dask runner's included),
    as `BEAM_FLAGS` holds them; imports Beam."""
    import apache_beam as beam

    import recordforge.runners.dask_runner  # noqa: F401  (declares Beam's Dask flags)

    rows = []
    for action in option_parser()._actions:
        names = tuple(action.option_strings)
        if action.nargs == 0:
            kind = "switch"
        elif action.nargs == "?":
            kind = "optional"
        elif isinstance(action, argparse._AppendAction):
            kind = "list"
        else:
            kind = "value"
        type_name = getattr(action.type, "__name__", "str") if action.type in (int, float) else "str"
        choices = tuple(str(c) for c in action.choices) if action.choices else None
        rows.append((names, kind, type_name, choices))
    return beam.__version__, sorted(rows)


def _module_text() -> str:
    version, rows = table_from_beam()
    lines = [
        '"""Beam\'s pipeline flags, written by `python -m recordforge.runners.beam_flags` (do not edit)."""',
        "",
        f"BEAM_VERSION = {version!r}",
        "# (names, kind: switch | optional | value | list, value type, choices)",
        "BEAM_FLAGS: tuple[tuple[tuple[str, ...], str, str, tuple[str, ...] | None], ...] = (",
    ]
    lines += [f"    {row!r}," for row in rows]
    lines.append(")")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(_module_text(), end="")
