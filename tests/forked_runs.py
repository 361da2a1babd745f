"""Runs `recordforge` commands at once in children forked from one process that imported Beam."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any

__all__ = ["ForkedRuns", "Outcome"]

# A fresh interpreter takes seconds to import Beam; a child forked from this server starts at once,
# so the runs of a batch really start together, and a batch costs what its runs cost.


@dataclass(frozen=True)
class Outcome:
    """How one command ended."""

    code: int
    stdout: str
    stderr: str


class ForkedRuns:
    """This file run as a server: each batch's commands are forked together, each after its delay."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own group: a hung batch is ended with everything it forked
        )
        assert self._read(120) == "ready"

    def together(
        self,
        runs: list[tuple[list[str], float]],
        env: dict[str, str] | None = None,
        # A bound for a hang, not a speed check: two conversions forked together on a 2-core CI
        # machine that also runs the rest of the suite have taken over 120 s.
        timeout: float = 300,
        envs: list[dict[str, str]] | None = None,
    ) -> list[Outcome]:
        """Runs `recordforge *argv` for each (argv, delay in seconds), all forked at once; `env` is
        added to every run's environment, `envs` (one per run) to each run's own."""
        assert self._proc.stdin is not None
        each = envs or [{} for _ in runs]
        request = {
            "runs": [{"argv": a, "delay": d, "env": e} for (a, d), e in zip(runs, each, strict=True)],
            "env": env or {},
        }
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        return [Outcome(**o) for o in json.loads(self._read(timeout))]

    def close(self) -> None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def _read(self, timeout: float) -> str:
        assert self._proc.stdout is not None
        ready, _, _ = select.select([self._proc.stdout], [], [], timeout)
        if not ready:
            self.close()
            raise TimeoutError(f"the forked runs did not finish in {timeout:g} s")
        return self._proc.stdout.readline().strip()


def _child(run: dict[str, Any], env: dict[str, str], out: str, err: str) -> None:
    code = 70
    try:
        for fd, path in ((1, out), (2, err)):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.environ.update(env)
        os.environ.update(run["env"])
        time.sleep(run["delay"])
        from recordforge.cli import main as cli
        from recordforge.runners import startup

        code = cli.main(run["argv"])
        startup.before_exit()
    except BaseException:  # noqa: BLE001 - reported as the child's stderr
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    import threading

    from recordforge.runners import startup

    startup.own_process()
    with startup.heavy_imports():
        import recordforge.cli.main  # noqa: F401
        import recordforge.pipelines.convert  # noqa: F401
    # fork() copies only the calling thread: another one could hold a lock the children need.
    assert threading.active_count() == 1, threading.enumerate()
    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryDirectory() as folder:
            children = []
            for i, run in enumerate(request["runs"]):
                out, err = f"{folder}/{i}.out", f"{folder}/{i}.err"
                pid = os.fork()
                if pid == 0:
                    _child(run, request["env"], out, err)
                children.append((pid, out, err))
            outcomes = []
            for pid, out, err in children:
                _, status = os.waitpid(pid, 0)
                with open(out) as o, open(err) as e:
                    outcomes.append(
                        {"code": os.waitstatus_to_exitcode(status), "stdout": o.read(), "stderr": e.read()}
                    )
        print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    _serve()
