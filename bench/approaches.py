"""One benchmark approach per invocation, so that peak RSS is measured per process from outside.

    python -m bench.approaches APPROACH SOURCE OUTPUT ROWS

prints one JSON line: {"rows": ..., "seconds": ..., "bytes": ...}.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The baselines run on Beam's own local runner, as DirectRunner runs batch pipelines.
BEAM_RUNNER = "apache_beam.runners.portability.fn_api_runner.FnApiRunner"


def _size(pattern: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(pattern))


def tutorial(source: str, output: str, rows: int) -> dict:
    """What TensorFlow's TFRecord tutorial teaches: one tf.train.Example per row, built in
    Python, written with tf.io.TFRecordWriter (GZIP). Nulls are left out, which the tutorial's
    code would not even do."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    start = time.perf_counter()
    pf = pq.ParquetFile(source)
    done = 0
    path = os.path.join(output, "tutorial.tfrecord.gz")
    os.makedirs(output, exist_ok=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    with tf.io.TFRecordWriter(path, options) as writer:
        for batch in pf.iter_batches(batch_size=10000):
            for row in batch.to_pylist():
                feature = {}
                for key, value in row.items():
                    if value is None:
                        continue
                    values = value if isinstance(value, list) else [value]
                    if isinstance(values[0] if values else 0, int):
                        feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
                    elif isinstance(values[0], float):
                        feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
                    else:
                        feature[key] = tf.train.Feature(
                            bytes_list=tf.train.BytesList(value=[v.encode() for v in values])
                        )
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())
                done += 1
                if done >= rows:
                    break
            if done >= rows:
                break
    seconds = time.perf_counter() - start
    return {"rows": done, "seconds": seconds, "bytes": os.path.getsize(path)}


def tfx_style(source: str, output: str, rows: int) -> dict:
    """TFX's Parquet ExampleGen path: Beam's ReadFromParquet (one dict per row), a per-row
    dict-to-Example conversion as TFX's `dict_to_example` does it, WriteToTFRecord (GZIP)."""
    import apache_beam as beam
    import pyarrow.parquet as pq
    import tensorflow as tf

    subset = os.path.join(output, "subset.parquet")
    os.makedirs(output, exist_ok=True)
    pq.write_table(pq.read_table(source).slice(0, rows), subset)

    def dict_to_example(row: dict) -> bytes:
        feature = {}
        for key, value in row.items():
            if value is None or value == []:
                feature[key] = tf.train.Feature()
                continue
            values = value if isinstance(value, list) else [value]
            if isinstance(values[0], int):
                feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            elif isinstance(values[0], float):
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
            else:
                feature[key] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[v.encode() for v in values])
                )
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    start = time.perf_counter()
    with beam.Pipeline(runner=BEAM_RUNNER) as p:
        _ = (
            p
            | beam.io.ReadFromParquet(subset)
            | beam.Map(dict_to_example)
            | beam.io.WriteToTFRecord(os.path.join(output, "tfx"), file_name_suffix=".gz")
        )
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "bytes": _size(os.path.join(output, "tfx*.gz"))}


def tutorial_images(source: str, output: str, rows: int) -> dict:
    """The tutorials' image recipe: read each file, decode it to get its shape, one Example per
    image (height, width, depth, label, image_raw) written with tf.io.TFRecordWriter."""
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(source, "**", "*.png"), recursive=True))[:rows]
    labels = {name: i for i, name in enumerate(sorted({os.path.basename(os.path.dirname(f)) for f in files}))}
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, "images.tfrecord")
    start = time.perf_counter()
    with tf.io.TFRecordWriter(path) as writer:
        for filename in files:
            image_string = open(filename, "rb").read()
            shape = tf.io.decode_png(image_string).shape
            label = labels[os.path.basename(os.path.dirname(filename))]
            feature = {
                "height": tf.train.Feature(int64_list=tf.train.Int64List(value=[shape[0]])),
                "width": tf.train.Feature(int64_list=tf.train.Int64List(value=[shape[1]])),
                "depth": tf.train.Feature(int64_list=tf.train.Int64List(value=[shape[2]])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_string])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    seconds = time.perf_counter() - start
    return {"rows": len(files), "seconds": seconds, "bytes": os.path.getsize(path)}


def tft_census(source: str, output: str, rows: int) -> dict:
    """tensorflow-transform the way its census example does it: instance dicts (one per row)
    with DatasetMetadata, AnalyzeAndTransformDataset, a per-row ExampleProtoCoder, then
    WriteToTFRecord (GZIP). Same work as the `rf_tft` schema: a vocabulary over s0, f0 z-scored,
    every other column passed through."""
    import apache_beam as beam
    import pyarrow.parquet as pq
    import tensorflow as tf
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    subset = os.path.join(output, "subset.parquet")
    os.makedirs(output, exist_ok=True)
    table = pq.read_table(source).slice(0, rows)
    pq.write_table(table, subset)
    # Nullable columns are VarLen: an instance holds [] or [value].
    spec = {}
    for field in table.schema:
        t = field.type.value_type if hasattr(field.type, "value_type") else field.type
        dtype = (
            tf.int64
            if str(t).startswith("int")
            else tf.float32
            if "float" in str(t) or "double" in str(t)
            else tf.string
        )
        spec[field.name] = tf.io.VarLenFeature(dtype)
    metadata = tft.DatasetMetadata.from_feature_spec(spec)

    def to_instance(row: dict) -> dict:
        return {
            k: []
            if v is None
            else [x.encode() if isinstance(x, str) else x for x in (v if isinstance(v, list) else [v])]
            for k, v in row.items()
        }

    def preprocessing_fn(inputs: dict) -> dict:
        outputs = dict(inputs)
        outputs["s0_id"] = tft.compute_and_apply_vocabulary(inputs["s0"])
        outputs["f0"] = tft.scale_to_z_score(inputs["f0"])
        return outputs

    start = time.perf_counter()
    with beam.Pipeline(runner=BEAM_RUNNER) as p:
        with tft_beam.Context(temp_dir=os.path.join(output, "tmp")):
            raw = p | beam.io.ReadFromParquet(subset) | beam.Map(to_instance)
            (data, out_metadata), _ = (raw, metadata) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
            coder = tft.coders.ExampleProtoCoder(out_metadata.schema)
            _ = (
                data
                | beam.Map(coder.encode)
                | beam.io.WriteToTFRecord(os.path.join(output, "tft"), file_name_suffix=".gz")
            )
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "bytes": _size(os.path.join(output, "tft*.gz"))}


def recordforge(source: str, output: str, rows: int, *extra: str) -> dict:
    """The real CLI path: `recordforge convert` on the local default runner, one worker, in a
    process that, like the command's own, imports Beam lean and freezes its heap (runners/startup.py)."""
    from recordforge.runners import startup

    startup.own_process()
    with startup.heavy_imports():
        from recordforge.pipelines.convert import run

    start = time.perf_counter()
    meta = run(["--source", source, "--output", output, "--overwrite", *extra])
    seconds = time.perf_counter() - start
    # rows_written: rows in the records (a SequenceExample holds many), num_records for Examples.
    return {
        "rows": meta["rows_written"],
        "seconds": seconds,
        "bytes": sum(s["bytes"] for s in meta["shards"]),
    }


def beam_sink(source: str, output: str, rows: int, schema: str) -> dict:
    """RecordForge's Parquet reader and encoder, written by Beam's own `WriteToTFRecord` (one
    element and one Python call per record, zlib level 6, Beam's temporary files): the sink
    RecordForge's writers are measured against, on RecordForge's local runner, one worker."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from recordforge.pipelines.config import ConvertConfig
    from recordforge.pipelines.convert import DEFAULT_RUNNER
    from recordforge.pipelines.inputs import resolve_inputs
    from recordforge.runners.traits import RunnerTraits
    from recordforge.transforms.examples import ToExamples
    from recordforge.transforms.parquet_source import ReadParquet

    config = ConvertConfig(sources=(source,), output=output, schema_path=schema)
    start = time.perf_counter()
    inputs = resolve_inputs(config)
    columns = list(inputs.plan.schema.source_columns)
    with beam.Pipeline(options=PipelineOptions([], runner=DEFAULT_RUNNER)) as p:
        read = p | "Read" >> ReadParquet(
            list(config.sources),
            columns=columns,
            batch_size=config.batch_size,
            expanded=inputs.files,
            traits=RunnerTraits(local=True, workers=1),  # one worker in the driver's process
        )
        encoded = read["batches"] | "ToExamples" >> ToExamples(inputs.plan, strict=True)
        _ = (
            encoded.examples
            # ((split, file, first_row), records): WriteToTFRecord takes one element per record
            | "Records" >> beam.FlatMap(lambda keyed: keyed[1].to_pylist())
            | "Write"
            >> beam.io.WriteToTFRecord(os.path.join(output, "data"), file_name_suffix=".tfrecord.gz")
        )
    seconds = time.perf_counter() - start
    return {"rows": rows, "seconds": seconds, "bytes": _size(os.path.join(output, "data*.tfrecord.gz"))}


def _bundle_bytes(bundle: str) -> int:
    with open(os.path.join(bundle, "metadata.json")) as f:
        return sum(s["bytes"] for s in json.load(f)["shards"])


def verify_bundle(source: str, output: str, rows: int) -> dict:
    """`recordforge verify` of a bundle the benchmark wrote (every CRC, sha256, record parsed)."""
    from recordforge.tools.verify import verify

    start = time.perf_counter()
    problems = verify(source)
    seconds = time.perf_counter() - start
    if problems:
        raise SystemExit(f"verify found problems: {problems[:3]}")
    return {"rows": rows, "seconds": seconds, "bytes": _bundle_bytes(source)}


def stats_bundle(source: str, output: str, rows: int) -> dict:
    """`recordforge stats` of a bundle the benchmark wrote (every record of every shard)."""
    from recordforge.tools.stats import stats

    start = time.perf_counter()
    result = stats(source)
    seconds = time.perf_counter() - start
    if result["records"] != rows:
        raise SystemExit(f"stats read {result['records']} records, expected {rows}")
    return {"rows": rows, "seconds": seconds, "bytes": _bundle_bytes(source)}


def export_bundle(source: str, output: str, rows: int) -> dict:
    """`recordforge export --to parquet` of a bundle the benchmark wrote (every record, every core)."""
    import shutil

    from recordforge.exporting.parquet import export

    dest = os.path.join(os.path.dirname(os.path.abspath(source)), "rf_export")
    shutil.rmtree(dest, ignore_errors=True)
    start = time.perf_counter()
    manifest = export(source, dest)
    seconds = time.perf_counter() - start
    if manifest["rows"] != rows:
        raise SystemExit(f"export wrote {manifest['rows']} rows, expected {rows}")
    return {"rows": rows, "seconds": seconds, "bytes": sum(f["bytes"] for f in manifest["files"])}


def random_reads(source: str, output: str, rows: int) -> dict:
    """`rows` reads of random records through `recordforge.data_source` on the bundle `source`,
    one at a time in this one process (one core), each checked against a sequential read's."""
    import random

    import recordforge
    from recordforge.records.array_records import reading
    from recordforge.records.tfrecord import iter_records

    ds = recordforge.data_source(source)
    meta = recordforge.load_bundle(source)
    rng = random.Random(0)
    keys = [rng.randrange(len(ds)) for _ in range(rows)]
    start = time.perf_counter()
    got = [ds[k] for k in keys]
    seconds = time.perf_counter() - start
    wanted = {k: i for i, k in enumerate(keys[:1000])}
    at = 0
    for path in meta["files"]:
        for record in iter_records(path, reading(meta["metadata"])):
            if at in wanted and record != got[wanted[at]]:
                raise SystemExit(f"record {at} read at random differs from the sequential read")
            at += 1
    return {"rows": rows, "seconds": seconds, "bytes": 0}


APPROACHES = {
    "random_reads": random_reads,
    "verify": verify_bundle,
    "stats": stats_bundle,
    "export": export_bundle,
    "tutorial": tutorial,
    "tfx": tfx_style,
    "recordforge": recordforge,
    "beam_sink": beam_sink,
    "tutorial_images": tutorial_images,
    "tft_census": tft_census,
}

if __name__ == "__main__":
    name, source, output, rows, *extra = sys.argv[1:]
    result = APPROACHES[name](source, output, int(rows), *extra)
    print(json.dumps(result), flush=True)
    # The census-style TFT baseline ends in a segfault inside TensorFlow's interpreter teardown
    # (after its output is complete; seen at 100k rows): leave without tearing down.
    os._exit(0)
