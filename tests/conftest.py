"""Shared fixtures: independent readers of written output, and a pipeline factory."""

from __future__ import annotations

import json
import os
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from recordforge.pipelines.convert import DEFAULT_RUNNER  # noqa: E402
from recordforge.runners import startup  # noqa: E402
from recordforge.runners.beam_memos import remember_beams_answers  # noqa: E402

# The suite's processes build and run pipelines as the `recordforge` command's own process does:
# Beam's answers about a DoFn or an options object are worked out once per object (beam_memos.py),
# which halves a small conversion's time (about 1.3 s to 0.6 s in a test's process). That the
# kept answers are Beam's own is tests/runners/test_beam_memos.py's; that a library caller's
# process is left without them, tests/e2e/test_startup.py's, in processes of their own.
if beam.__version__.startswith(startup.BEAM_VERSION + "."):
    remember_beams_answers()

pytest_plugins = ["gcs_emulator"]


@pytest.fixture
def parquet_source(tmp_path: Any) -> str:
    """Three Parquet files of 700 taxi rows each, in row groups of 300: a glob pattern."""
    import pyarrow.parquet as pq

    from demo.sampledata import taxi_table

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        pq.write_table(taxi_table(700, seed=i, first_id=i * 700), src / f"t{i}.parquet", row_group_size=300)
    return str(src / "*.parquet")


def published_root(output: Any) -> Any:
    """The folder of an output's published version (a Path for a Path), from its manifest."""
    from pathlib import Path

    with open(os.path.join(output, "metadata.json")) as f:
        version = json.load(f)["version"]
    return Path(output) / version if isinstance(output, Path) else os.path.join(output, version)


@pytest.fixture
def pipeline() -> TestPipeline:
    return TestPipeline(runner=DEFAULT_RUNNER)


def example_to_dict(raw: bytes) -> dict[str, list[Any]]:
    """A serialized tf.train.Example as {feature: values}, read with protobuf alone."""
    from tensorflow.core.example import example_pb2

    ex = example_pb2.Example.FromString(raw)
    out = {}
    for name, feat in ex.features.feature.items():
        kind = feat.WhichOneof("kind")
        out[name] = list(getattr(feat, kind).value) if kind else []
    return out


def canonical(record: dict[str, list[Any]], float_features: frozenset[str]) -> tuple:
    """A hashable, exact form of a record: floats by their float32 bit pattern (NaN == NaN)."""
    import struct

    return tuple(
        sorted(
            (k, tuple(struct.pack("<f", x) if k in float_features else x for x in v))
            for k, v in record.items()
        )
    )


def _canonical_example(raw: bytes, float_features: frozenset[str]) -> tuple:
    return canonical(example_to_dict(raw), float_features)


def assert_beam_reads(
    files: list[str],
    compression: str,
    expected: list[dict[str, list[Any]]],
    float_features: frozenset[str],
) -> None:
    """Reads shards with Beam's own ReadFromTFRecord (an independent reader) and checks, inside
    the pipeline, that the records equal `expected` as a multiset, feature by feature."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.testing.util import assert_that, equal_to

    beam_comp = {
        "gzip": CompressionTypes.GZIP,
        "zlib": CompressionTypes.DEFLATE,
        "none": CompressionTypes.UNCOMPRESSED,
    }[compression]
    with TestPipeline(runner=DEFAULT_RUNNER) as p:
        reads = [
            p | f"Read{i}" >> beam.io.ReadFromTFRecord(f, compression_type=beam_comp)
            for i, f in enumerate(files)
        ]
        records = reads | beam.Flatten() | beam.Map(_canonical_example, float_features=float_features)
        assert_that(records, equal_to([canonical(e, float_features) for e in expected]))


def read_with_tf(output: str) -> list[dict[str, Any]]:
    """Reads an output folder with plain tf.data + tf.io.parse_example and the bundle's spec,
    without RecordForge's reader; returns one dict of numpy values per record."""
    import tensorflow as tf

    from recordforge.schemas.export import decode_parsed, to_tf_feature_spec

    with open(os.path.join(output, "metadata.json")) as f:
        meta = json.load(f)
    with open(os.path.join(output, "feature_spec.json")) as f:
        json_spec = json.load(f)
    spec = to_tf_feature_spec(json_spec)
    files = [os.path.join(output, s["file"]) for s in meta["shards"]]
    rows: list[dict[str, Any]] = []
    if not files:
        return rows
    ds = tf.data.TFRecordDataset(files, compression_type=meta["tf_compression_type"]).batch(64)
    for batch in ds:
        parsed = decode_parsed(tf.io.parse_example(batch, spec), json_spec)
        n = int(batch.shape[0])
        cols = {}
        for name, t in parsed.items():
            if isinstance(t, tf.RaggedTensor):
                cols[name] = t.to_list()
            elif isinstance(t, tf.SparseTensor):
                vals = t.values.numpy()
                idx = t.indices.numpy()[:, 0]
                cols[name] = [vals[idx == i] for i in range(n)]
            else:
                cols[name] = list(t.numpy())
        rows.extend({k: v[i] for k, v in cols.items()} for i in range(n))
    return rows


def tf_raw_records(files: list[str], compression_type: str = "") -> list[bytes]:
    """Every record of TFRecord files, in order, as tf.data reads them (its framing checks both
    CRCs), in batches: an eager step per record costs more than reading the record does."""
    import tensorflow as tf

    if not files:
        return []
    ds = tf.data.TFRecordDataset([str(f) for f in files], compression_type=compression_type)
    return [bytes(raw) for batch in ds.batch(4096) for raw in batch.numpy()]


def tf_records(output: Any) -> list[dict[str, list[Any]]]:
    """Every record of an output folder, read with tf.data and parsed with protobuf alone."""
    import tensorflow as tf

    with open(os.path.join(output, "metadata.json")) as f:
        meta = json.load(f)
    files = [os.path.join(output, s["file"]) for s in meta["shards"]]
    if not files:
        return []
    ds = tf.data.TFRecordDataset(files, compression_type=meta["tf_compression_type"])
    # In batches: an eager step per record costs more than parsing the record does.
    return [example_to_dict(raw) for batch in ds.batch(4096) for raw in batch.numpy()]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "corrupts: the test damages bundles on purpose")
    config.addinivalue_line("markers", "stress: minutes long; `make stress` runs them, `make test` does not")
    config.addinivalue_line(
        "markers",
        "e2e: whole conversions, subprocesses, kills, clusters and emulators (every test in tests/e2e/); "
        "`make check` leaves them out",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.parent.name == "e2e":
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _verify_published_bundles(request: pytest.FixtureRequest, tmp_path: Any) -> Any:
    """Every bundle a test publishes under its tmp_path must pass `recordforge verify`."""
    yield
    if request.node.get_closest_marker("corrupts"):
        return
    from recordforge.tools.verify import verify

    for success in sorted(tmp_path.rglob("_SUCCESS")):
        # One worker: a process pool per bundle costs more than these test bundles take to read.
        assert verify(str(success.parent), workers=1) == [], success.parent
