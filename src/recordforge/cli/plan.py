"""`recordforge plan`: the same flags as `convert`; prints the estimate, or one line why a run would fail."""

from __future__ import annotations

import argparse
import json

from recordforge.runners import startup

__all__ = ["plan_command"]


def plan_command(argv: list[str]) -> int:
    """Resolves the conversion `argv` asks for, as `convert` would (every check before data
    moves), and prints its plan (`--json`: as one JSON object); writes nothing."""
    as_json = "--json" in argv
    argv = [a for a in argv if a != "--json"]
    if "-h" in argv or "--help" in argv:
        from recordforge.pipelines.flags import add_flags

        parser = argparse.ArgumentParser(
            prog="recordforge plan",
            description="Estimate a conversion before running it: rows, output bytes and shards per "
            "split (measured on a sample converted by the real encoder and writer), work items and "
            "workers, time and memory here, and with --runner DataflowRunner workers and cost. "
            "Writes nothing; exits 1 with one line where `convert` would fail before moving data.",
        )
        parser.add_argument("--json", action="store_true", help="print the plan as one JSON object")
        add_flags(parser)
        parser.print_help()
        return 0
    from recordforge.pipelines.command_line import check_command_line

    check_command_line(argv)
    with startup.heavy_imports():
        from recordforge.pipelines.options import check_flags

        check_flags(argv)
        from recordforge.pipelines.planning import plan_lines, plan_request
        from recordforge.pipelines.resolve import request_from_argv

    plan = plan_request(request_from_argv(argv))
    if as_json:
        print(json.dumps(plan.to_dict(), sort_keys=True))
    else:
        print("\n".join(plan_lines(plan)))
    return 0
