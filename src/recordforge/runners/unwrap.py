"""How a RecordForge exception raised in a Beam worker is found again on the driver."""

from __future__ import annotations

import re
from collections.abc import Iterator

from recordforge import errors
from recordforge.errors import DataError, RecordForgeError

__all__ = ["chain", "from_worker", "strip_step"]

# How a RecordForge exception raised in a Beam worker reaches the driver: as text inside the
# runner's own exception, `recordforge.errors.DataError: <message> [while running 'Step']`.
_WRAPPED = re.compile(r"recordforge\.errors\.(\w+): (.+)")
_WHILE_RUNNING = re.compile(r"(?: \[while running '[^']*'\])+$")


def chain(exn: BaseException) -> Iterator[BaseException]:
    """The exception, then its causes and contexts, each once."""
    seen: set[int] = set()
    todo = [exn]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(c for c in (e.__cause__, e.__context__) if c is not None)


def strip_step(message: str) -> str:
    """A message without the runner's ` [while running 'Step']` suffixes."""
    return _WHILE_RUNNING.sub("", message.rstrip())


def from_worker(exn: BaseException) -> RecordForgeError | None:
    """The RecordForge exception behind a runner's failure: the exception itself where the runner
    kept it in the chain, else one of the same class with the same message, rebuilt from the
    text the runner wrapped it in (the worker's traceback: its last such line). None if there is
    none."""
    for e in chain(exn):
        if isinstance(e, RecordForgeError):
            return e
    for e in chain(exn):
        found = [m for m in map(_WRAPPED.search, str(e).splitlines()) if m]
        if not found:
            continue
        name, message = found[-1].group(1), strip_step(found[-1].group(2).strip())
        cls = getattr(errors, name, None)
        if not (isinstance(cls, type) and issubclass(cls, RecordForgeError)):
            cls = RecordForgeError
        if cls is DataError:
            where = _DATA_ERROR.fullmatch(message)
            if where:
                row = 0 if where["row"] == "unknown" else int(where["row"])
                rebuilt = DataError(
                    file=where["file"], row=row, column=where["column"], reason=where["reason"]
                )
                rebuilt.args = (message,)  # the worker's own text, value included
                return rebuilt
            cls = RecordForgeError
        return cls(message)
    return None


# DataError's message, as its __init__ writes it.
_DATA_ERROR = re.compile(
    r"(?P<file>.*), row (?P<row>\d+|unknown), column '(?P<column>.*?)': (?P<reason>.*)", re.DOTALL
)
