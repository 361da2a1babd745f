"""RecordForge's conversion as Beam composites, for a pipeline of one's own (each imported on use)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "ANY_RUNNER",
    "ReadCsv",
    "ReadImageFolder",
    "ReadParquet",
    "RunnerTraits",
    "ShardSpec",
    "Sizing",
    "ToExamples",
    "ToSequences",
    "WriteBundle",
    "WriteRejected",
    "WriteTFRecords",
]

# Where each public name lives: importing this package loads none of them (a reader pulls in
# Beam, the bundle step the schema exporters), so `recordforge.transforms.x` stays cheap.
_WHERE = {
    "ANY_RUNNER": "recordforge.runners.traits",
    "RunnerTraits": "recordforge.runners.traits",
    "ReadCsv": "recordforge.transforms.csv_source",
    "ReadImageFolder": "recordforge.transforms.image_folder",
    "ReadParquet": "recordforge.transforms.parquet_source",
    "ShardSpec": "recordforge.records.shard_spec",
    "Sizing": "recordforge.records.shard_spec",
    "ToExamples": "recordforge.transforms.examples",
    "ToSequences": "recordforge.transforms.sequences",
    "WriteBundle": "recordforge.transforms.bundle",
    "WriteRejected": "recordforge.transforms.rejects",
    "WriteTFRecords": "recordforge.transforms.sinks",
}

if TYPE_CHECKING:
    from recordforge.records.shard_spec import ShardSpec, Sizing
    from recordforge.runners.traits import ANY_RUNNER, RunnerTraits
    from recordforge.transforms.bundle import WriteBundle
    from recordforge.transforms.csv_source import ReadCsv
    from recordforge.transforms.examples import ToExamples
    from recordforge.transforms.image_folder import ReadImageFolder
    from recordforge.transforms.parquet_source import ReadParquet
    from recordforge.transforms.rejects import WriteRejected
    from recordforge.transforms.sequences import ToSequences
    from recordforge.transforms.sinks import WriteTFRecords


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
