"""Reading any TFRecord file of tf.train.Examples: compression detected, offsets, CRCs, a feature spec."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from recordforge.errors import CorruptFile
from recordforge.files.storage import exists
from recordforge.records.array_records import ARRAY_RECORD, reading
from recordforge.records.bundle_json import load_metadata
from recordforge.records.example_pb import parse_example
from recordforge.records.tfrecord import detect_compression

__all__ = ["FeatureSummary", "infer_feature_spec", "parsed_records", "record_files"]

_CHUNK = 4 << 20


def record_files(path: str) -> list[tuple[str, str]]:
    """(file, compression) of every shard of an output folder, or of one TFRecord file."""
    out = path.rstrip("/")
    if exists(f"{out}/metadata.json"):
        meta = load_metadata(f"{out}/metadata.json")
        return [(f"{out}/{s['file']}", reading(meta)) for s in meta["shards"]]
    return [(out, detect_compression(out))]


@dataclass
class FeatureSummary:
    """What a sample of records says about one feature."""

    kind: str
    present: int = 0
    min_count: int | None = None
    max_count: int = 0
    kinds: set[str] = field(default_factory=set)

    def add(self, kind: str, count: int) -> None:
        self.kinds.add(kind)
        self.present += 1
        self.min_count = count if self.min_count is None else min(self.min_count, count)
        self.max_count = max(self.max_count, count)


def parsed_records(
    path: str,
    records: Iterable[tuple[int, bytes]],
    reading: str,
    *,
    parse: Callable[[bytes], Any] = parse_example,
    message: str = "tf.train.Example",
) -> Iterator[Any]:
    """`records` of the file at `path` ((offset, bytes), as `read_records` gives them for its
    `reading`), parsed; one that does not parse raises CorruptFile naming it (its number from
    1 and its byte offset; in an ArrayRecord file, its index)."""
    for number, (offset, raw) in enumerate(records, 1):
        try:
            yield parse(raw)
        except Exception as exn:  # protobuf's DecodeError and friends
            where = (
                f"record at index {offset}"
                if reading == ARRAY_RECORD
                else f"record {number} at byte {offset}"
            )
            text = " ".join(str(exn).split()) or type(exn).__name__
            raise CorruptFile(path, f"{where} is not a {message} ({text})") from exn


def infer_feature_spec(
    records: list[dict[str, tuple[str, list[Any]]]],
) -> tuple[dict[str, FeatureSummary], dict[str, dict[str, Any]]]:
    """Summaries per feature and a JSON feature spec of parsed records (`parse_example`):
    FixedLenFeature where every sampled record has the feature with the same number of values,
    VarLenFeature otherwise."""
    summaries: dict[str, FeatureSummary] = {}
    for record in records:
        for name, (kind, values) in record.items():
            summaries.setdefault(name, FeatureSummary(kind)).add(kind, len(values))
    spec: dict[str, dict[str, Any]] = {}
    dtypes = {"int64": "int64", "float": "float32", "bytes": "string", "none": "string"}
    for name, s in sorted(summaries.items()):
        kind = next(iter(s.kinds - {"none"}), "none") if len(s.kinds) > 1 else s.kind
        dtype = dtypes[kind]
        fixed = s.present == len(records) and s.min_count == s.max_count and s.max_count > 0
        if fixed:
            shape = [] if s.max_count == 1 else [s.max_count]
            spec[name] = {"kind": "FixedLenFeature", "dtype": dtype, "shape": shape}
        else:
            spec[name] = {"kind": "VarLenFeature", "dtype": dtype}
    return summaries, spec
