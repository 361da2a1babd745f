"""Dask partitions through distributed's serialization: Arrow batches as IPC bodies, exactly the
rows they hold, the rest pickled, every element back as it was."""

from __future__ import annotations

import pyarrow as pa
import pytest
from apache_beam.transforms.window import GlobalWindows, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from dask.sizeof import sizeof
from distributed.protocol import deserialize, serialize

from recordforge.runners.dask_partitions import Elements

PARENT = pa.record_batch(
    {
        "i": pa.array(range(100_000), pa.int64()),
        "s": pa.array([f"row {k}" if k % 7 else None for k in range(100_000)]),
        "l": pa.array([[k] * (k % 3) for k in range(100_000)], pa.large_list(pa.int32())),
    }
)


def _roundtrip(elements: Elements) -> tuple[Elements, int]:
    header, frames = serialize(elements, serializers=("dask", "pickle"))
    assert header["serializer"] == "dask"
    return deserialize(header, frames), sum(memoryview(f).nbytes for f in frames)


@pytest.mark.parametrize(
    "elements",
    [
        Elements(),
        Elements([GlobalWindows.windowed_value(PARENT)]),
        Elements([GlobalWindows.windowed_value(PARENT.slice(500, 1000)), GlobalWindows.windowed_value(b"")]),
        Elements(
            [
                ("tag", GlobalWindows.windowed_value(PARENT.slice(0, 0))),
                (None, GlobalWindows.windowed_value(0)),
            ]
        ),
        Elements([(b"key", "k", PARENT.slice(99_990)), (b"", None, [1.5, None])]),
        Elements([WindowedValue(PARENT.slice(3, 4), Timestamp(7), [IntervalWindow(0, 10)])]),
    ],
    ids=["empty", "batch", "slice and bytes", "tagged", "shuffle pieces", "windowed"],
)
def test_every_element_comes_back_as_it_was(elements: Elements) -> None:
    back, _ = _roundtrip(elements)
    assert type(back) is Elements
    assert back == elements


def test_a_slice_travels_as_its_own_rows_not_its_parents_buffers() -> None:
    piece = PARENT.slice(1000, 100)
    back, size = _roundtrip(Elements([GlobalWindows.windowed_value(piece)]))
    assert back[0].value.equals(piece)
    assert size < 4 * piece.nbytes + 4096 < PARENT.nbytes // 10


def test_what_plain_pickle_cannot_goes_through_cloudpickle() -> None:
    back, _ = _roundtrip(Elements([GlobalWindows.windowed_value((lambda x: x + 1, PARENT.slice(0, 2)))]))
    fn, batch = back[0].value
    assert fn(1) == 2 and batch.equals(PARENT.slice(0, 2))


def test_sizeof_counts_the_batch_a_windowed_value_holds() -> None:
    assert sizeof(GlobalWindows.windowed_value(PARENT)) >= PARENT.nbytes
    assert sizeof(Elements([GlobalWindows.windowed_value(PARENT)] * 3)) >= 3 * PARENT.nbytes
