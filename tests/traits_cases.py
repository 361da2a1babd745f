"""The runner trait values a transform is tested with on its own (tests/transforms/)."""

from __future__ import annotations

from pathlib import Path

from recordforge.runners.traits import ANY_RUNNER, RunnerTraits

# Workers spread by Reshuffles; local workers sharing items through claims; one local worker.
CASES = ("spread", "shared", "one")


def traits_case(case: str, tmp_path: Path) -> RunnerTraits:
    """The traits of `case`, with its claims folder made in `tmp_path` as `runners.session` would."""
    if case == "spread":
        return ANY_RUNNER
    if case == "one":  # as runners.session gives it: no one to share items with, so no claims
        return RunnerTraits(local=True, workers=1, claims=None, spill=True)
    claims = tmp_path / "claims"
    claims.mkdir(exist_ok=True)
    return RunnerTraits(local=True, workers=2, claims=str(claims), spill=True)
