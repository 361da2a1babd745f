"""SampleCodec: serialized Examples to tar samples, a batch column by column where it can."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from recordforge.records.example_pb import Example
from recordforge.records.webdataset.columns import _encode_columns, _Fallback
from recordforge.records.webdataset.members import (
    _IMAGE_EXT,
    Member,
    _members,
    _npy,
    sample_bytes,
    sample_key,
)
from recordforge.schemas.feature import Feature

__all__ = ["SampleCodec"]


@dataclass(frozen=True)
class SampleCodec:
    """Writes serialized Examples as tar samples (the members of a schema's features)."""

    members: tuple[Member, ...]

    @classmethod
    def of(cls, features: Iterable[Feature]) -> SampleCodec:
        members = [m for f in features for m in _members(f)]
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError("two features share a WebDataset member name ('/' is written as ':')")
        return cls(tuple(sorted(members, key=lambda m: m.name)))

    def encode(self, key: str, record: bytes) -> bytes:
        """One sample: the record's present features, by member name."""
        feature = Example.FromString(record).features.feature
        out = []
        for m in self.members:
            if m.feature not in feature:
                continue
            ext, data = self._member(m, feature[m.feature], feature)
            out.append((m.feature, ext, data))
        return sample_bytes(key, out)

    def encode_batch(self, file: str, first_row: int, records: pa.Array) -> pa.LargeBinaryArray:
        """A batch's samples, record i keyed by row `first_row + i` of `file`: made column by
        column (below), or record by record where that way does not take the batch."""
        if len(records):
            try:
                return _encode_columns(self.members, file, first_row, records)
            except _Fallback:
                pass
        return self.encode_records(file, first_row, records)

    def encode_records(self, file: str, first_row: int, records: pa.Array) -> pa.LargeBinaryArray:
        """`encode_batch` record by record (the reference the columnwise way is tested against)."""
        samples = [
            self.encode(sample_key(file, first_row + i), record)
            for i, record in enumerate(records.to_pylist())
        ]
        return pa.array(samples, pa.large_binary())

    def _member(self, m: Member, feat: Any, feature: Any) -> tuple[str, bytes]:
        kind = feat.WhichOneof("kind")
        values = list(getattr(feat, kind).value) if kind else []
        if m.ext == "cls":
            return "cls", str(values[0]).encode()
        if m.ext in ("txt", "bin"):
            return m.ext, values[0]
        if m.ext == "image":
            fmt = feature[m.feature + "/format"].bytes_list.value
            name = fmt[0].decode() if fmt else "bin"
            return _IMAGE_EXT.get(name, name), values[0]
        if m.ext == "json":
            return "json", json.dumps([v.decode() for v in values], ensure_ascii=False).encode()
        if m.ext == "pyd":
            return "pyd", pickle.dumps([bytes(v) for v in values], protocol=4)
        if m.dtype == "float64":
            array = np.frombuffer(values[0] if values else b"", "<f8")
        elif m.dtype == "float32":
            array = np.asarray(values, np.float32)
        else:
            ints = np.asarray(values, np.int64)
            array = ints.astype(bool) if m.dtype == "bool" else ints.view(m.dtype)
        return "npy", _npy(array.reshape(m.shape))
