"""How the Dask runner's partitions travel between workers: Arrow batches as Arrow IPC bodies."""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any

import cloudpickle
import pyarrow as pa
from apache_beam.utils.windowed_value import WindowedValue
from dask.sizeof import sizeof
from distributed.protocol.serialize import dask_deserialize, dask_serialize

__all__ = ["Elements", "dumps", "loads"]


class Elements(list):  # type: ignore[type-arg]
    """A partition: the elements one task hands to the next (WindowedValues, or the tuples a
    split or a multi-output ParDo makes). Its own type so that Dask serializes it with `dumps`."""


def _batch(schema: pa.Schema, body: Any) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(body), schema)


def _as_ipc(batch: pa.RecordBatch) -> tuple[Any, tuple[pa.Schema, pickle.PickleBuffer]]:
    # batch.serialize() writes the rows the batch holds: a slice of a larger batch (a CSV block's
    # rows, a shuffle's piece) would otherwise pickle its parent's whole buffers. The body goes
    # out of band: a frame of its own, not copied into the pickle.
    return _batch, (batch.schema, pickle.PickleBuffer(batch.serialize()))


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        return _as_ipc(obj) if type(obj) is pa.RecordBatch else NotImplemented


class _CloudPickler(cloudpickle.Pickler):  # what plain pickle cannot (a lambda in an element)
    def reducer_override(self, obj: Any) -> Any:
        return _as_ipc(obj) if type(obj) is pa.RecordBatch else super().reducer_override(obj)


def dumps(elements: Elements) -> list[Any]:
    """[the pickled partition, then the IPC body of each Arrow batch in it, in order]."""
    for pickler in (_Pickler, _CloudPickler):
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        try:
            pickler(out, protocol=5, buffer_callback=buffers.append).dump(list(elements))
        except (pickle.PicklingError, AttributeError, TypeError):
            if pickler is _CloudPickler:
                raise
            continue
        return [out.getbuffer(), *(b.raw() for b in buffers)]
    raise AssertionError("unreachable")  # pragma: no cover


def loads(frames: list[Any]) -> Elements:
    return Elements(pickle.loads(frames[0], buffers=frames[1:]))


@dask_serialize.register(Elements)
def _serialize(elements: Elements) -> tuple[dict[str, Any], list[Any]]:
    return {}, dumps(elements)


@dask_deserialize.register(Elements)
def _deserialize(header: dict[str, Any], frames: list[Any]) -> Elements:
    return loads(frames)


@sizeof.register(WindowedValue)
def _sizeof(value: WindowedValue) -> int:
    # Dask's default is the wrapper's own few bytes: a partition of batches would count as
    # nothing in the scheduler's transfer costs and the workers' memory limits.
    return sys.getsizeof(value) + int(sizeof(value.value))
