"""runner_traits: the runner as the transforms see it, from the options alone; session: the
folders those traits name, made for the run and removed after it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from recordforge.runners.dask_runner import RUNNER as DASK_RUNNER
from recordforge.runners.session import LOCAL_RUNNER, runner_name, runner_traits, session
from recordforge.runners.traits import RunnerTraits

STOCK = "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"
LOCAL = f"--runner={LOCAL_RUNNER}"


@pytest.mark.parametrize(
    ("flags", "local", "workers", "claims", "spill"),
    [
        ([LOCAL], True, 1, False, True),  # RecordForge's local runner, one worker: nothing to share
        ([LOCAL, "--direct_num_workers=2", "--direct_running_mode=multi_processing"], True, 2, True, True),
        ([LOCAL, "--direct_num_workers=2", "--direct_runner_bundle_repeat=1"], True, 2, False, True),
        ([], False, 0, False, True),  # no runner named: Beam's default, as beam.Pipeline makes it
        (["--runner=DirectRunner"], False, 0, False, True),
        ([STOCK, "--direct_num_workers=2"], False, 0, False, True),
        (["--runner=DataflowRunner"], False, 0, False, False),
        (["--runner=DaskRunner"], False, 0, False, False),
    ],
)
def test_traits_follow_from_the_options(
    flags: list[str], local: bool, workers: int, claims: bool, spill: bool
) -> None:
    traits = runner_traits(PipelineOptions(flags))
    assert (traits.local, traits.workers, traits.claims is not None, traits.spill) == (
        local,
        workers,
        claims,
        spill,
    )
    assert (traits.progress is not None) == local  # a progress line where workers count here
    assert traits.several_workers == (workers != 1)
    for folder in (traits.claims, traits.progress):
        assert folder is None or not os.path.exists(folder)  # named, not made: session makes it


def test_each_run_gets_folders_of_its_own() -> None:
    two = [LOCAL, "--direct_num_workers=2"]
    a, b = runner_traits(PipelineOptions(two)), runner_traits(PipelineOptions(two))
    assert len({a.claims, a.progress, b.claims, b.progress}) == 4


@pytest.mark.parametrize(
    ("given", "runner"),
    [
        (None, LOCAL_RUNNER),
        ("DaskRunner", DASK_RUNNER),
        ("dask", DASK_RUNNER),
        ("DataflowRunner", "DataflowRunner"),
    ],
)
def test_the_runner_a_name_means(given: str | None, runner: str) -> None:
    assert runner_name(given) == runner


def test_the_session_makes_the_folders_and_removes_them_with_what_workers_left(tmp_path: Path) -> None:
    traits = RunnerTraits(local=True, claims=str(tmp_path / "claims"), progress=str(tmp_path / "progress"))
    with session(traits, total=lambda: 10):
        for folder in (traits.claims, traits.progress):
            assert os.path.isdir(folder) and (os.stat(folder).st_mode & 0o777) == 0o700
            Path(folder, "left by a worker").write_text("x")
    assert sorted(os.listdir(tmp_path)) == []


def test_a_session_never_takes_over_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / "theirs").write_text("x")
    with pytest.raises(FileExistsError), session(RunnerTraits(local=True, claims=str(tmp_path / "claims"))):
        pass
    assert (tmp_path / "claims" / "theirs").read_text() == "x"
