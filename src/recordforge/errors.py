"""Exceptions RecordForge raises, each naming where the problem is."""

from __future__ import annotations

from typing import Any

__all__ = [
    "CorruptFile",
    "DataError",
    "Interrupted",
    "RecordForgeError",
    "SchemaError",
    "SourceError",
    "TypesChanged",
    "UsageError",
]


class RecordForgeError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""


class UsageError(RecordForgeError, ValueError):
    """A command line the program cannot run: an unknown flag, a bad value, a stray argument."""


class Interrupted(BaseException):
    """A termination signal (SIGINT, SIGTERM) arrived; raised at a safe point after the CLI's
    handler recorded it (interrupts.py), a BaseException, like KeyboardInterrupt, so that
    `except Exception` blocks between that point and the CLI do not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"interrupted by signal {self.signum}"


class CorruptFile(RecordForgeError, ValueError):
    """A file being read is damaged, or is not what it claims to be: `what` says what is wrong
    and where (the record, or the byte) in the file at `path`."""

    def __init__(self, path: str, what: str) -> None:
        self.path = path
        self.what = what
        super().__init__(f"{path}: {what}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Two-argument __init__: tell pickle how to rebuild it across process boundaries.
        return (type(self), (self.path, self.what))


class SchemaError(RecordForgeError, ValueError):
    """The schema (file, flags or inferred) is invalid; raised before any data is read."""


class SourceError(RecordForgeError, ValueError):
    """An input pattern matched nothing, or an input file cannot be read."""


class TypesChanged(RecordForgeError, ValueError):
    """A CSV cell that the type inferred from its file's first rows cannot hold: the run that
    raised it publishes nothing, and `convert` decides the types again over every row."""

    MARKER = "the type inferred from the first rows of the file does not hold"


class DataError(RecordForgeError, ValueError):
    """A value does not fit the schema: names the file, the row (1-based, data rows), the column."""

    def __init__(self, *, file: str, row: int, column: str, reason: str, value: Any = None) -> None:
        self.file = file
        self.row = row
        self.column = column
        self.reason = reason
        self.value = value
        shown = "" if value is None else f" (value: {_short(value)})"
        # row 0: the reader could not tell the position (pyarrow, for malformed CSV rows).
        where = f"row {row}" if row > 0 else "row unknown"
        super().__init__(f"{file}, {where}, column {column!r}: {reason}{shown}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only __init__: tell pickle how to rebuild it across Beam worker boundaries.
        return (_rebuild_data_error, (self.file, self.row, self.column, self.reason, self.value))


def _rebuild_data_error(file: str, row: int, column: str, reason: str, value: Any) -> DataError:
    return DataError(file=file, row=row, column=column, reason=reason, value=value)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
