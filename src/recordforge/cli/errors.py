"""What a failed command prints: one line and an exit code; Beam's and TensorFlow's logs kept out of it."""

from __future__ import annotations

import logging
import re

from recordforge.errors import UsageError
from recordforge.runners.unwrap import chain, from_worker, strip_step

__all__ = ["configure_logging", "describe", "drop_beam_errors", "one_line"]


def configure_logging(debug: bool) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The command prints its own summary; per-shard INFO lines are for --debug. Warnings (files
    # deleted by --overwrite, unreadable inputs skipped) always show.
    logging.getLogger("recordforge").setLevel(logging.INFO if debug else logging.WARNING)
    if debug:
        return
    # Before TensorFlow is first imported, which happens later in this process or its workers.
    from recordforge.runners.quiet import silence_tensorflow_import

    silence_tensorflow_import()
    logging.getLogger("absl").setLevel(logging.ERROR)
    for handler in logging.getLogger().handlers:
        handler.addFilter(drop_beam_errors)


def drop_beam_errors(record: logging.LogRecord) -> bool:
    """Beam logs a failing step's traceback before raising; the CLI prints the error itself, once.
    A filter on the handler, not a logger level: forked local workers log through this handler."""
    return not (record.name.startswith("apache_beam") and record.levelno >= logging.ERROR)


def one_line(text: str) -> str:
    """A message as one line: a list of problems (a schema's, say) joined with '; '."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    head, rest = lines[0], lines[1:]
    if not rest:
        return head
    return head + (" " if head.endswith(":") else "; ") + "; ".join(rest)


def describe(exn: BaseException) -> tuple[str, int]:
    """(the one line to print after `error: `, the exit code) for an exception that ended a command."""
    ours = from_worker(exn)
    if ours is not None:
        return strip_step(one_line(str(ours))), 2 if isinstance(ours, UsageError) else 1
    for e in chain(exn):
        if isinstance(e, OSError):
            if e.filename is not None and e.strerror:
                return f"{e.filename}: {e.strerror}", 1
            return one_line(str(e)), 1
        if type(e).__module__.startswith("pyarrow") and isinstance(e, KeyError | ValueError):
            # ArrowKeyError is a KeyError: str() would quote it.
            return strip_step(one_line(str(e.args[0]) if e.args else type(e).__name__)), 1
    for e in chain(exn):
        found = _worker_os_error(str(e))
        if found is not None:
            return found, 1
    first = one_line(str(exn))
    return (
        f"internal error: {type(exn).__name__}: {first} (run with --debug for the traceback)",
        1,
    )


# An OSError raised in a worker reaches the driver as text in the runner's exception (Python's
# `OSError: [Errno 28] No space left on device`, Arrow's `... Detail: [errno 28] ...`), with the
# step it failed in.
_OS_ERROR = re.compile(r"\[errno (\d+)\] ([^\[;\n]+)", re.IGNORECASE)
_STEP = re.compile(r"\[while running '([^']*)'\]")


def _worker_os_error(text: str) -> str | None:
    """One line for a worker's OSError found in a runner's failure text, or None."""
    found = _OS_ERROR.findall(text)
    if not found:
        return None
    errno, reason = found[-1]
    steps = _STEP.findall(text)
    where = f" (in the step {steps[-1]!r})" if steps else ""
    return f"a worker failed: {reason.strip()} [errno {errno}]{where}"
