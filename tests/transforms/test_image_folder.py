"""ReadImageFolder on its own in a TestPipeline, with each runner trait value: every image of the
listing once, with its label, in batches that know their first row."""

from __future__ import annotations

import pickle
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from traits_cases import CASES, traits_case

from demo.sampledata import mnist_folder
from recordforge.transforms.image_folder import ImageFolder, ReadImageFolder, list_image_folder


@pytest.mark.parametrize("case", CASES)
def test_every_image_arrives_once_with_its_label_and_bytes(
    pipeline: beam.Pipeline, tmp_path: Path, case: str
) -> None:
    mnist_folder(str(tmp_path / "digits"), per_class=2)
    folder = list_image_folder(str(tmp_path / "digits"))
    ids = {label: i for i, label in enumerate(folder.labels)}
    expected = [
        (row, path, label, ids[label], split, Path(path).read_bytes())
        for row, (path, label, split) in enumerate(folder.entries)
    ]
    read = pipeline | ReadImageFolder(folder, batch_size=7, traits=traits_case(case, tmp_path))
    rows = read["batches"] | beam.FlatMap(
        lambda b: [
            (b.first_row + i, *r.values(), data)
            for i, (r, data) in enumerate(zip(b.batch.to_pylist(), b.read["path"].to_pylist(), strict=True))
        ]
    )
    assert_that(rows, equal_to(expected), label="rows")
    assert_that(read["unreadable"], equal_to([]), label="unreadable")
    pipeline.run().wait_until_finish()


@pytest.mark.parametrize(
    "groups",
    [
        [("r/a", ["1.png", "2.png"], "a", "train"), ("r/b", [], "b", ""), ("r/c", ["3.png"], "c", "")],
        [("r/a", [], "a", ""), ("r/b", ["x.png"], "b", "")],
        [("r/a", [], "a", "")],
        [("r/é", ["ü 1.png", ""], "é", "")],
    ],
)
def test_a_listing_pickled_with_a_reader_comes_back_whole(groups: list) -> None:
    folder = ImageFolder("r", groups, sorted({g[2] for g in groups}), [], None, 0.0)
    back = pickle.loads(pickle.dumps(folder))
    assert (back.root, back.groups, back.count, back.labels, back.sizes) == (
        folder.root,
        folder.groups,
        folder.count,
        folder.labels,
        folder.sizes,
    )
