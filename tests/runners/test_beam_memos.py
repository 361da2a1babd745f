"""remember_beams_answers: a DoFn's state and timer specs searched for once per DoFn, and one view
of the options per class."""

from __future__ import annotations

import copy
import gc
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate
from apache_beam.transforms.userstate import BagStateSpec

from recordforge.runners.beam_memos import _DofnSpecs, _Views, remember_beams_answers


class _Stateful(beam.DoFn):
    """Sums each key's values in its state; emits (key, running sum)."""

    SEEN = BagStateSpec("seen", VarIntCoder())

    def process(self, element: tuple[str, int], seen: Any = beam.DoFn.StateParam(SEEN)) -> Iterator[Any]:  # noqa: B008
        seen.add(element[1])
        yield element[0], sum(seen.read())


class _Plain(beam.DoFn):
    def process(self, element: int) -> Iterator[int]:
        yield element + 1


def _beams(function: Any) -> Any:
    """Beam's own function, under the memo that tests/conftest.py puts in place for the suite."""
    if isinstance(function, _DofnSpecs):
        return function.search
    return function.view_as if isinstance(function, _Views) else function


@pytest.fixture
def searches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[type, int]]:
    """(type, id) of each DoFn Beam's own search was run on, with the memo in place (undone after
    the test); not the DoFns themselves, which the list would keep alive."""
    seen: list[tuple[type, int]] = []
    search = _beams(userstate.get_dofn_specs)

    def counted(dofn: Any) -> Any:
        seen.append((type(dofn), id(dofn)))
        return search(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counted)
    monkeypatch.setattr(PipelineOptions, "view_as", _beams(vars(PipelineOptions)["view_as"]))  # undone after
    remember_beams_answers()
    remember_beams_answers()  # a second call keeps the first memo
    assert isinstance(userstate.get_dofn_specs, _DofnSpecs)
    assert userstate.get_dofn_specs.search is counted
    return seen


def test_the_answers_are_beams_and_each_dofn_is_searched_once(searches: list[tuple[type, int]]) -> None:
    stateful, plain = _Stateful(), _Plain()
    for _ in range(3):
        assert userstate.is_stateful_dofn(stateful)
        assert not userstate.is_stateful_dofn(plain)
        userstate.validate_stateful_dofn(stateful)
        states, timers = userstate.get_dofn_specs(stateful)
        assert states == {_Stateful.SEEN} and timers == set()
    assert [t for t, _ in searches] == [_Stateful, _Plain]


def test_a_caller_changing_its_answer_changes_no_other(searches: list[tuple[type, int]]) -> None:
    stateful = _Stateful()
    states, _ = userstate.get_dofn_specs(stateful)
    states.clear()
    assert userstate.get_dofn_specs(stateful)[0] == {_Stateful.SEEN}


def test_a_dofn_is_forgotten_when_it_goes_and_a_new_one_at_its_address_is_searched(
    searches: list[tuple[type, int]],
) -> None:
    memo = userstate.get_dofn_specs
    assert isinstance(memo, _DofnSpecs)
    for _ in range(5):  # a new DoFn often takes a freed one's address
        userstate.is_stateful_dofn(_Plain())
        gc.collect()
    assert memo._known == {}
    stateful = _Stateful()
    assert userstate.is_stateful_dofn(stateful)
    assert searches[-1][1] == id(stateful)
    assert len(searches) == 6 and searches[-1][0] is _Stateful


def test_what_cannot_be_weakly_referenced_is_searched_each_time() -> None:
    class Slotted:
        __slots__ = ()

    seen: list[Any] = []
    memo = _DofnSpecs(lambda dofn: (seen.append(dofn), (set(), set()))[1])
    thing = Slotted()
    assert memo(thing) == (set(), set()) and memo(thing) == (set(), set())
    assert len(seen) == 2


def test_a_pipeline_with_state_runs_as_without_the_memo(
    searches: list[tuple[type, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = []
    memo = userstate.get_dofn_specs

    def counted(dofn: Any) -> Any:
        asked.append(1)
        return memo(dofn)

    monkeypatch.setattr(userstate, "get_dofn_specs", counted)
    with TestPipeline() as p:
        out = (
            p
            | beam.Create([("a", 1), ("a", 2), ("b", 5)], reshuffle=False)
            | beam.ParDo(_Stateful())
            | beam.Map(lambda kv: kv[1])
            | beam.ParDo(_Plain())
            | beam.Filter(lambda v: v > 3)
        )
        assert_that(out, equal_to([4, 6]))
    # Beam asked about its DoFns many times while it built and ran the pipeline; most were answered.
    assert searches and len(asked) >= 2 * len(searches)


@pytest.fixture
def views(monkeypatch: pytest.MonkeyPatch) -> _Views:
    monkeypatch.setattr(PipelineOptions, "view_as", _beams(vars(PipelineOptions)["view_as"]))  # undone after
    beams = PipelineOptions.view_as
    remember_beams_answers()
    remember_beams_answers()
    kept = vars(PipelineOptions)["view_as"]
    assert isinstance(kept, _Views) and kept.view_as is beams
    return kept


def test_a_view_is_made_once_per_class_and_reads_what_beams_would(views: _Views) -> None:
    options = PipelineOptions(["--direct_num_workers=3", "--runner=FnApiRunner"])
    direct = options.view_as(DirectOptions)
    assert direct is options.view_as(DirectOptions) is not options.view_as(StandardOptions)
    assert direct.direct_num_workers == 3 and options.view_as(StandardOptions).runner == "FnApiRunner"
    beams = views.view_as(options, DirectOptions)
    assert beams is not direct and beams.get_all_options() == direct.get_all_options()


def test_a_value_set_through_any_view_is_seen_by_every_view(views: _Views) -> None:
    options = PipelineOptions([])
    standard = options.view_as(StandardOptions)
    options.view_as(DirectOptions).direct_num_workers = 5
    standard.runner = "DirectRunner"
    assert options.view_as(StandardOptions).runner == "DirectRunner"
    assert options.view_as(StandardOptions).view_as(DirectOptions).direct_num_workers == 5
    assert options.get_all_options()["direct_num_workers"] == 5


def test_options_given_other_values_or_copied_get_views_of_their_own(views: _Views) -> None:
    options = PipelineOptions(["--direct_num_workers=2"])
    before = options.view_as(DirectOptions)
    copied = copy.deepcopy(options)  # as beam.Pipeline copies the options it is given
    copied.view_as(DirectOptions).direct_num_workers = 7
    assert options.view_as(DirectOptions).direct_num_workers == 2
    assert copied.view_as(DirectOptions).direct_num_workers == 7
    options._all_options = {**options._all_options, "direct_num_workers": 4}
    assert options.view_as(DirectOptions) is not before
    assert options.view_as(DirectOptions).direct_num_workers == 4
    options._flags = ["--direct_num_workers=9"]
    assert options.view_as(DirectOptions)._flags == ["--direct_num_workers=9"]


def test_views_go_with_their_options(views: _Views) -> None:
    for _ in range(3):
        PipelineOptions([]).view_as(DirectOptions)
        gc.collect()
    assert views._known == {}
