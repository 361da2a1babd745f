"""cli/errors.py describe: the one line a failed command prints, for failures found in a runner's text
(named apart from tests/e2e/test_errors.py: test files share one namespace)."""

from __future__ import annotations

from recordforge.cli.errors import describe

# What the local runner raised when a worker's disk filled (a clean-clone CI run, 2026-11-29),
# cut to its first and last lines.
_FULL_DISK = (
    'Traceback (most recent call last): File "apache_beam/runners/common.py", line 1512, in '
    'apache_beam.runners.common.DoFnRunner.process; File "/x/recordforge/records/streams.py", '
    "line 91, in write; self._handle.write(data); OSError: [Errno 28] No space left on device; "
    "During handling of the above exception, another exception occurred:; self._handle.write(data); "
    "RuntimeError: OSError: [Errno 28] No space left on device [while running "
    "'WriteTFRecords/WriteBySize/WriteParts']"
)


def test_a_workers_os_error_is_one_line_naming_it_and_its_step() -> None:
    """It was 'internal error: RuntimeError: Traceback ...' (the whole worker traceback on one
    line). Mutation: `_worker_os_error` not consulted: the internal error comes back."""
    line, code = describe(RuntimeError(_FULL_DISK))
    assert code == 1
    assert line == (
        "a worker failed: No space left on device [errno 28] "
        "(in the step 'WriteTFRecords/WriteBySize/WriteParts')"
    )
    arrow = RuntimeError("OSError: Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert describe(arrow) == ("a worker failed: No space left on device [errno 28]", 1)


def test_an_unknown_failure_is_still_an_internal_error() -> None:
    line, code = describe(RuntimeError("something else entirely"))
    assert code == 1 and line.startswith("internal error: RuntimeError: something else entirely")
