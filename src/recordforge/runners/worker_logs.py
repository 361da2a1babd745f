"""What a local worker prints and logs, less the lines the driver reports itself (assumption 4)."""

from __future__ import annotations

import logging
import sys
from typing import Any

__all__ = ["quiet_worker"]

_SDK_WORKER = "apache_beam.runners.worker.sdk_worker"
_SDK_WORKER_MAIN = "apache_beam.runners.worker.sdk_worker_main"


def quiet_worker(*, debug: bool) -> None:
    """In a worker, forked or fresh, before Beam's worker main runs: drops Beam's warning that
    there is no pickled main session (a forked worker has the driver's memory, a fresh one
    imports what it runs), and, unless `debug`, the traceback of a failing instruction that the
    worker would print and log: it goes back to the driver as the instruction's error, and the
    driver reports it in one line."""
    logging.getLogger(_SDK_WORKER_MAIN).addFilter(_NoMainSession())
    if not debug:
        logging.getLogger(_SDK_WORKER).addFilter(_NoInstructionError())
        sys.stderr = _WithoutInstructionTracebacks(sys.stderr)


class _NoMainSession(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("No semi_persistent_directory found")


class _NoInstructionError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Error processing instruction")


class _WithoutInstructionTracebacks:
    """sys.stderr less what SdkWorker._execute prints when an instruction fails: the traceback,
    and the line end that print adds to it. Everything else, a worker's own crash included, and
    what is written to descriptor 2 directly, passes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._dropping = False

    def write(self, text: str) -> int:
        caller = sys._getframe(1)
        if caller.f_code.co_name == "_execute" and caller.f_globals.get("__name__") == _SDK_WORKER:
            self._dropping = text.startswith("Traceback") or (self._dropping and text == "\n")
            if self._dropping:
                return len(text)
        self._dropping = False
        return int(self._stream.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
