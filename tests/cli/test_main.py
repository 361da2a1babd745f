"""The command line before Beam: help and refused arguments answer without importing Beam or
TensorFlow, and the commands take their inputs the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recordforge.cli.main import main

# The command, and its exit code: 0 for help, 2 for arguments refused.
_BEFORE_BEAM = [
    (["convert", "--help"], 0),
    (["infer-schema", "--help"], 0),
    (["verify", "--help"], 0),
    (["stats", "--help"], 0),
    (["head", "--help"], 0),
    (["inspect", "--help"], 0),
    (["convert", "--num-shards", "2"], 2),  # a typo of a RecordForge flag
    (["convert", "--direct_num_workrs", "2"], 2),  # a typo of a Beam flag
    (["convert", "--direct_num_workers", "two"], 2),  # a Beam flag's value of the wrong type
    (["convert", "--compression", "brotli"], 2),  # a value outside a flag's choices
    (["convert", "--source", "a.parquet", "b.parquet"], 2),  # a glob the shell expanded
    (["infer-schema"], 2),
]

_PROBE = """
import sys
from recordforge.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exn:
    code = exn.code
loaded = sorted(m for m in ("apache_beam", "tensorflow") if m in sys.modules)
print("LOADED", ",".join(loaded), "CODE", code)
"""


@pytest.mark.parametrize(("argv", "code"), _BEFORE_BEAM, ids=[" ".join(a) for a, _ in _BEFORE_BEAM])
def test_help_and_refused_arguments_load_neither_beam_nor_tensorflow(argv: list[str], code: int) -> None:
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert last == f"LOADED  CODE {code}", (last, done.stderr[-1500:])


def test_infer_schema_takes_its_source_as_convert_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2], "b": ["x", "y"]}), src)
    assert main(["infer-schema", str(src)]) == 0
    positional = capsys.readouterr().out
    assert main(["infer-schema", "--source", str(src)]) == 0
    assert capsys.readouterr().out == positional
    assert "name: a" in positional and "name: b" in positional
    assert main(["infer-schema", str(src), "--source", str(src)]) == 2
    assert "give the source once" in capsys.readouterr().err


class _WorkerConnectionBroken(Exception):
    """What Beam's gRPC threads in the driver raise as a worker the Ctrl-C ended goes away."""


def _command_whose_thread_fails(interrupt: bool) -> int:
    """A command run as the CLI runs one, whose other thread fails (after a Ctrl-C, if `interrupt`)."""
    import signal
    import threading

    from recordforge import interrupts
    from recordforge.cli import main as cli

    def handler(argv: list[str]) -> int:
        go = threading.Event()

        def fail() -> None:
            go.wait()
            raise _WorkerConnectionBroken("the worker's connection broke")

        thread = threading.Thread(target=fail, name="beam_control_read")
        thread.start()
        try:
            if interrupt:
                signal.raise_signal(signal.SIGINT)  # the CLI's handler records it
                interrupts.check()  # the command's next safe point raises it
            return 0
        finally:
            go.set()
            thread.join()

    return cli._run("convert", handler, [], debug=False)


def test_a_thread_that_fails_because_of_a_ctrl_c_prints_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The interrupt is one line on stderr: Beam's threads reading the connections of forked
    workers that the same Ctrl-C ended (their process group's) print no traceback (found by
    tests/e2e/test_interrupt_loop.py). A thread failing with no interrupt still reaches the
    hook that was there before, which is put back."""
    import threading

    from recordforge import interrupts

    monkeypatch.setattr(interrupts, "MOMENT_S", 0.05)
    seen: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda args: seen.append(f"{args.thread.name}: {args.exc_value}")
    )
    hook = threading.excepthook
    assert _command_whose_thread_fails(interrupt=True) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "recordforge convert: interrupted: nothing published; the last published bundle is intact"
    ], err
    assert seen == [] and threading.excepthook is hook
    assert _command_whose_thread_fails(interrupt=False) == 0
    assert seen == ["beam_control_read: the worker's connection broke"] and threading.excepthook is hook


def test_the_installed_signal_handler_records_and_raises_nothing() -> None:
    """The handler `_run` installs for SIGINT and SIGTERM only records the signal: the command
    raises `Interrupted` at its next safe point (interrupts.check), from ordinary code.

    Mutation it catches: `cli/main.py` `_record_signal` raising `Interrupted(signum)` after it
    records (the old `_raise_interrupted`), which landed at whatever bytecode the main thread ran
    (a generator's cleanup once, which deleted the run's finished pieces)."""
    import signal

    from recordforge import interrupts
    from recordforge.cli import main as cli
    from recordforge.errors import Interrupted

    seen: list[object] = []

    def handler(argv: list[str]) -> int:
        installed = signal.getsignal(signal.SIGTERM)
        seen.append(installed)
        assert callable(installed) and signal.getsignal(signal.SIGINT) is installed
        assert installed(signal.SIGTERM, None) is None  # raises nothing
        seen.append("returned")
        assert interrupts.signum() == signal.SIGTERM
        with pytest.raises(Interrupted) as raised:
            interrupts.check()
        assert raised.value.signum == signal.SIGTERM
        raise raised.value

    before = signal.getsignal(signal.SIGTERM)
    assert cli._run("convert", handler, [], debug=False) == 128 + signal.SIGTERM
    assert seen == [cli._record_signal, "returned"]
    assert signal.getsignal(signal.SIGTERM) is before and not interrupts.received()


# A command whose handler gets a signal and reaches no safe point, then gets a second one.
_SECOND_SIGNAL = """
import os, signal, sys, time
from recordforge.cli import main as cli

def handler(argv):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)
    print("FIRST RECORDED", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)  # no safe point: only the second signal ends it
    return 0

sys.exit(cli._run("convert", handler, [], debug=False))
"""


def test_a_second_signal_ends_the_process_at_once() -> None:
    """A second SIGTERM while the first is pending (the command has not reached a safe point)
    ends the process by the signal itself, raising nothing in a handler.

    Mutation it catches: `_record_signal` only recording a second signal too (the process then
    runs on to the end of its sleep: 30 s, and the timeout fails the test)."""
    import signal
    import time

    begin = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _SECOND_SIGNAL], capture_output=True, text=True, timeout=25)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr)
    assert done.stdout == "FIRST RECORDED\n"
    assert done.stderr.strip().splitlines() == [
        f"recordforge: signal {signal.SIGTERM} again: stopped at once"
    ]
    assert time.monotonic() - begin < 20


def test_a_child_forked_from_the_command_dies_of_the_signal() -> None:
    """A process forked from the command (a pool's worker) inherits the handler: there it ends
    the child by the signal, as the default action would, rather than recording it where no
    safe point will ever ask."""
    import os
    import signal

    from recordforge.cli import main as cli

    def handler(argv: list[str]) -> int:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time_left = 10.0
                import time

                time.sleep(time_left)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT
        return 0

    assert cli._run("convert", handler, [], debug=False) == 0
