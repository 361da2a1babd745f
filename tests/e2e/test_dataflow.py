"""The cloud path without credentials: the Dataflow job graph, the template, portable runners."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from conftest import published_root
from independent import file_records

from recordforge.errors import RecordForgeError, UsageError
from recordforge.pipelines.config import ConvertConfig
from recordforge.pipelines.convert import build, run
from recordforge.pipelines.flags import FLAGS
from recordforge.pipelines.options import ConvertOptions
from recordforge.pipelines.resolve import resolve
from recordforge.pipelines.template import template_metadata
from recordforge.runners.dryrun import dataflow_preflight
from recordforge.transforms.source_types import expand_patterns

IMPULSE = "beam:transform:impulse:v1"

ROOT = Path(__file__).resolve().parents[2]
DATAFLOW = [
    "--runner=DataflowRunner",
    "--project=my-project",
    "--region=us-central1",
    "--temp_location=gs://bucket/tmp",
]


def test_template_metadata_matches_pipeline_flags() -> None:
    meta = json.loads((ROOT / "deploy" / "metadata.json").read_text())
    assert meta == template_metadata(), "deploy/metadata.json is stale: run `make metadata`"
    params = {p["name"]: p for p in meta["parameters"]}
    flags = {f.name: f for f in FLAGS}
    assert set(params) == set(flags)
    for name, p in params.items():
        assert p["helpText"] == flags[name].help
        assert p["isOptional"] == (name not in ("source", "output"))
        assert p["regexes"], name
    if shutil.which("gcloud"):
        # gcloud validates the spec offline and prints it instead of uploading.
        proc = subprocess.run(
            [
                "gcloud",
                "dataflow",
                "flex-template",
                "build",
                "gs://b/t.json",
                "--image",
                "gcr.io/my-project/recordforge:1",
                "--sdk-language",
                "PYTHON",
                "--metadata-file",
                str(ROOT / "deploy" / "metadata.json"),
                "--print-only",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert '"name": "RecordForge convert"' in proc.stdout


def test_boolean_flags_take_template_style_values() -> None:
    view = PipelineOptions(["--deterministic=true", "--overwrite=false"]).view_as(ConvertOptions)
    assert view.deterministic is True and view.overwrite is False
    assert PipelineOptions(["--overwrite"]).view_as(ConvertOptions).overwrite is True


def test_dataflow_dry_run_builds_the_job_graph(parquet_source: str) -> None:
    options = PipelineOptions(
        [
            *DATAFLOW,
            "--dry_run=True",
            "--sdk_container_image=gcr.io/my-project/recordforge:1",
            "--sdk_location=container",
            "--experiments=use_runner_v2",
        ]
    )
    p = beam.Pipeline(options=options)
    build(
        p,
        resolve(
            p.options,
            ConvertConfig(sources=(parquet_source,), output="gs://bucket/out"),
            look_at_output=False,
        ),
    )
    result = p.run()
    assert result.state == "DONE"
    proto = p.runner.proto_pipeline
    names = {t.unique_name for t in proto.components.transforms.values()}
    # Stable labels: part of Dataflow's job-update compatibility.
    for label in [
        "Read",
        "Read/Files",
        "Read/RowGroups",
        "Read/Spread",
        "Read/Read",
        "ToExamples",
        "ToExamples/Encode",
        "WriteTFRecords",
        "WriteTFRecords/WriteBySize/WriteParts",
        "WriteTFRecords/WriteBySize/Publish",
        "WriteBundle",
        "WriteBundle/Write",
        "RowsPerBatch",
    ]:
        assert label in names, label
    # The only Create with data holds file paths; the others start the run-once steps (publish
    # the shards, write the bundle) or are Beam's own singleton machinery.
    impulses = {t.unique_name for t in proto.components.transforms.values() if t.spec.urn == IMPULSE}
    assert "Read/Files/Impulse" in impulses and "WriteTFRecords/WriteBySize/Once" in impulses
    assert all("Once" in n for n in impulses - {"Read/Files/Impulse"}), impulses
    envs = list(proto.components.environments.values())
    assert [e.urn for e in envs] == ["beam:env:docker:v1"]
    assert b"gcr.io/my-project/recordforge:1" in envs[0].payload
    assert "use_runner_v2" in options.get_all_options()["experiments"]


def test_dataflow_dry_run_with_tensorflow_transform(parquet_source: str, tmp_path: Path) -> None:
    """The TFT stages (decode, analyze on the train split, transform, encode) build into the
    Dataflow job graph; the preprocessing_fn is traced at construction, not on workers."""
    from recordforge.schemas import dump_schema, infer_schema, schema_from_dict
    from recordforge.sources.probe import read_arrow_schema

    first = expand_patterns([parquet_source])[0].path
    doc = infer_schema(read_arrow_schema(first, "parquet")).to_dict()
    for feature in doc["features"]:
        if feature["type"] == "string":
            feature["transform"] = {"vocabulary": {"top_k": 10}, "output": f"{feature['name']}_id"}
            break
    (tmp_path / "s.yaml").write_text(dump_schema(schema_from_dict(doc)))
    p = beam.Pipeline(options=PipelineOptions([*DATAFLOW, "--dry_run=True"]))
    config = ConvertConfig(
        sources=(parquet_source,),
        # A local output: TFT creates its temporary folder while the graph is built, which on
        # gs:// would need GCS (allowed for dry runs by the preflight check).
        output=str(tmp_path / "out"),
        schema_path=str(tmp_path / "s.yaml"),
        splits="train=9,eval=1",
    )
    build(p, resolve(p.options, config, look_at_output=False))
    assert p.run().state == "DONE"
    names = {t.unique_name for t in p.runner.proto_pipeline.components.transforms.values()}
    for label in [
        "Preprocess/AsTftInput",
        "Preprocess/Only[train]",
        "Preprocess/Analyze",
        "Preprocess/Transform",
        "Preprocess/WriteTransformFn",
        "Preprocess/Encode",
        "WriteTFRecords[train]",
        "WriteTFRecords[eval]",
    ]:
        assert label in names, label


def test_dataflow_dry_run_stages_the_package(parquet_source: str) -> None:
    options = PipelineOptions([*DATAFLOW, "--dry_run=True", f"--setup_file={ROOT / 'setup.py'}"])
    p = beam.Pipeline(options=options)
    build(
        p,
        resolve(
            p.options,
            ConvertConfig(sources=(parquet_source,), output="gs://bucket/out"),
            look_at_output=False,
        ),
    )
    p.run()
    staged = [
        d.role_payload
        for e in p.runner.proto_pipeline.components.environments.values()
        for d in e.dependencies
    ]
    assert any(b"workflow.tar.gz" in s for s in staged)


def test_sdist_carries_the_package(tmp_path: Path) -> None:
    subprocess.run(
        # Without isolation the build uses this environment's setuptools: no package index needed.
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (sdist,) = tmp_path.glob("recordforge-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    for module in [
        "pipelines/convert.py",
        "records/encoding.py",
        "records/_native.c",
        "records/_native.pyi",
        "schemas/model.py",
        "py.typed",
        "transforms/sinks.py",
    ]:
        assert any(n.endswith(f"src/recordforge/{module}") for n in names), module


def test_dataflow_preflight_refuses_what_workers_cannot_use(parquet_source: str) -> None:
    files = expand_patterns([parquet_source])
    local = (parquet_source, "/tmp/out")
    with pytest.raises(RecordForgeError, match="cannot read or write local paths"):
        dataflow_preflight(PipelineOptions(DATAFLOW), local, files)
    dataflow_preflight(PipelineOptions([*DATAFLOW, "--dry_run=True"]), local, files)
    bad_temp = [*DATAFLOW[:-1], "--temp_location=/tmp/x"]
    with pytest.raises(RecordForgeError, match="--temp_location must be a gs:// path"):
        dataflow_preflight(PipelineOptions(bad_temp), ("gs://b/*.parquet", "gs://b/o"), files)
    # Not Dataflow: nothing to check.
    dataflow_preflight(PipelineOptions([]), local, files)


def _records(output: str) -> Counter:
    meta = json.loads(Path(output, "metadata.json").read_text())
    return Counter(r for s in meta["shards"] for r in file_records(os.path.join(output, s["file"]), "gzip"))


def _shard_bytes(output: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(published_root(Path(output)).glob("data-*"))}


def test_portable_runner_output_is_byte_identical(parquet_source: str, tmp_path: Path) -> None:
    common = ["--source", parquet_source, "--deterministic", "--num_shards", "3", "--batch_size", "256"]
    run([*common, "--output", str(tmp_path / "inproc")])
    run(
        [
            *common,
            "--output",
            str(tmp_path / "portable"),
            "--runner=PortableRunner",
            "--job_endpoint=embed",
            "--environment_type=LOOPBACK",
        ]
    )
    inproc, portable = _shard_bytes(str(tmp_path / "inproc")), _shard_bytes(str(tmp_path / "portable"))
    assert list(inproc) == [f"data-0000{i}-of-00003.tfrecord.gz" for i in range(3)]
    assert inproc == portable
    assert sum(_records(str(tmp_path / "inproc")).values()) == 2100


@pytest.mark.parametrize("type_check", [False, True])
def test_batches_and_records_get_coders_that_size_them_without_pickling(
    tmp_path: Path, parquet_source: str, type_check: bool
) -> None:
    from recordforge.transforms.coders import ArrowCoder
    from recordforge.transforms.source_types import SourceBatchCoder

    p = beam.Pipeline(options=PipelineOptions(pipeline_type_check=type_check))
    build(
        p,
        resolve(
            p.options,
            ConvertConfig(sources=(parquet_source,), output=str(tmp_path / "out")),
            look_at_output=False,
        ),
    )
    proto, context = p.to_runner_api(return_context=True)
    coders = {}
    for transform in proto.components.transforms.values():
        for tag, pcoll_id in transform.outputs.items():
            coder = context.coders.get_by_id(proto.components.pcollections[pcoll_id].coder_id)
            coders[(transform.unique_name, tag)] = coder
    # The main outputs of the Parquet read and of the encoder (tag "None").
    assert isinstance(coders[("Read/Read/ParDo(_ReadParquetFn)", "None")], SourceBatchCoder)
    key, records = coders[("ToExamples/Encode/ParDo(_ToExamplesFn)", "None")].coders()
    assert isinstance(records, ArrowCoder)


def test_batch_coders_round_trip_and_size_from_buffers() -> None:
    import pyarrow as pa

    from recordforge.transforms.coders import ArrowCoder
    from recordforge.transforms.source_types import SourceBatch, SourceBatchCoder

    batch = pa.record_batch({"x": pa.array([1, None, 3]), "s": pa.array([b"", b"\x00\xff", None])})
    element = SourceBatch("gs://b/f.parquet", 7, batch, text_lists=True)
    coder = SourceBatchCoder()
    back = coder.decode(coder.encode(element))
    assert back == element and back.batch.equals(batch)
    assert coder.estimate_size(element) >= batch.nbytes
    records = pa.array([b"\x0a\x00", b""], pa.large_binary())
    assert ArrowCoder().decode(ArrowCoder().encode(records)).equals(records)
    assert ArrowCoder().estimate_size(records) == records.nbytes


# --- `recordforge convert --runner DataflowRunner --dry_run=True`, as users run it -------------

# Without credentials, Beam's first look-up of them waits ~22 s (retries, then anonymous); a dry
# run that reached for the output would show it in its time and in its log.
_NO_CREDENTIALS_WAIT_S = 20


def _dry_run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess, float]:
    import time

    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", *DATAFLOW, "--dry_run=True", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    return proc, time.monotonic() - start


def _no_credentials_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT"):
        env.pop(name, None)
    return env


def _check_summary(proc: subprocess.CompletedProcess, output: str) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("dry run: built the Dataflow job beamapp-"), lines
    assert lines[0].endswith(f"offline; nothing submitted, nothing written to {output}")
    assert "primitive transforms (" in lines[1] and "ParDo" in lines[1] and "GroupByKey" in lines[1]
    stages = [line.strip() for line in lines[3:]]
    assert lines[2].strip().startswith(f"{len(stages)} fused stages")
    assert [s.split(". ", 1)[0] for s in stages] == [str(i) for i in range(1, len(stages) + 1)]
    # Row groups are listed in one stage and read after the Reshuffle that spreads them, and
    # reading is fused with encoding.
    listing = next(i for i, s in enumerate(stages) if "Read/RowGroups" in s)
    reading = next(i for i, s in enumerate(stages) if "Read/Read" in s)
    assert listing < reading and "Read/Spread" in stages[listing] and "Read/Spread" in stages[reading]
    assert "ToExamples/Encode" in stages[reading], stages
    assert "credentials" not in proc.stderr.lower(), proc.stderr[-3000:]


def test_cli_dry_run_with_a_local_output_leaves_it_untouched(parquet_source: str, tmp_path: Path) -> None:
    output = tmp_path / "not" / "made"
    proc, took = _dry_run_cli("--source", parquet_source, "--output", str(output), env=_no_credentials_env())
    _check_summary(proc, str(output))
    assert took < _NO_CREDENTIALS_WAIT_S, took
    assert list(tmp_path.iterdir()) == [tmp_path / "src"]  # not even the parent folder


def test_cli_dry_run_with_a_gcs_output_sends_it_no_request(
    parquet_source: str, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output is not listed, locked or written: the emulator (which any gs:// request from
    the dry run would reach) receives no request at all, and without credentials in the
    environment nothing waits for them."""
    from gcp_storage_emulator import server
    from google.cloud import storage

    bucket = storage.Client.create_anonymous_client().bucket(gcs_bucket.removeprefix("gs://"))
    bucket.blob("out/notes.txt").upload_from_string(b"a user's file")
    before = sorted((b.name, b.generation) for b in bucket.list_blobs())
    requests: list[str] = []
    handle = server.Router.handle

    def logged(router: Any, method: str) -> None:
        requests.append(f"{method} {router._request_handler.path}")
        handle(router, method)

    monkeypatch.setattr(server.Router, "handle", logged)
    output = f"{gcs_bucket}/out"
    proc, took = _dry_run_cli("--source", parquet_source, "--output", output, env=_no_credentials_env())
    monkeypatch.setattr(server.Router, "handle", handle)
    _check_summary(proc, output)
    assert took < _NO_CREDENTIALS_WAIT_S, took
    assert requests == []
    assert sorted((b.name, b.generation) for b in bucket.list_blobs()) == before


def test_dry_run_returns_the_job_summary(parquet_source: str, tmp_path: Path) -> None:
    """run() builds the job offline and returns its summary; the counts agree with the proto."""
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("kept")
    summary = run(["--source", parquet_source, "--output", str(output), *DATAFLOW, "--dry_run=True"])
    assert summary["dry_run"] is True and summary["output"] == str(output)
    assert summary["job_name"].startswith("beamapp-")
    assert sum(summary["kinds"].values()) == summary["primitives"]
    assert {"ParDo", "GroupByKey", "Impulse", "Flatten"} <= set(summary["kinds"])
    steps = [label for stage in summary["stages"] for label in stage]
    for label in ["Read/Files", "Read/Spread", "Read/Read", "ToExamples/Encode", "WriteBundle/Write"]:
        assert label in steps, label
    assert [p.name for p in output.iterdir()] == ["notes.txt"]


def test_dry_run_with_tensorflow_transform_deletes_what_building_wrote(
    parquet_source: str, tmp_path: Path
) -> None:
    """TFT's analyzers write temporary assets into the run's version folder while the graph is
    built: a local dry run deletes that folder again; on gs:// it is refused before building."""
    from recordforge.schemas import dump_schema, infer_schema, schema_from_dict
    from recordforge.sources.probe import read_arrow_schema

    first = expand_patterns([parquet_source])[0].path
    doc = infer_schema(read_arrow_schema(first, "parquet")).to_dict()
    feature = next(f for f in doc["features"] if f["type"] == "string")
    feature["transform"] = {"vocabulary": {"top_k": 10}, "output": f"{feature['name']}_id"}
    (tmp_path / "s.yaml").write_text(dump_schema(schema_from_dict(doc)))
    common = ["--source", parquet_source, "--schema", str(tmp_path / "s.yaml"), *DATAFLOW, "--dry_run=True"]
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("kept")
    summary = run([*common, "--output", str(output)])
    assert any("Preprocess/Analyze" in stage for stage in summary["stages"])
    assert [p.name for p in output.iterdir()] == ["notes.txt"]
    with pytest.raises(UsageError, match="give a local --output for the dry run"):
        run([*common, "--output", "gs://bucket/out"])


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--dry_run=True"], "needs --runner DataflowRunner"),
        ([*DATAFLOW[:-1], "--temp_location=gs://b/tmp", "--dry_run=True"], "not a gs://bucket/path"),
        ([*DATAFLOW[:-1], "--temp_location=gs://Bucket/tmp", "--dry_run=True"], "not a gs://bucket/path"),
        ([*DATAFLOW[:-1], "--temp_location=gs://bucket", "--dry_run=True"], "not a gs://bucket/path"),
        ([*DATAFLOW[:-1], "--dry_run=True"], "--temp_location is required for Dataflow"),
        ([*DATAFLOW[:1], "--project=p", *DATAFLOW[2:], "--dry_run=True"], "Invalid Project ID (p)"),
    ],
)
def test_dry_run_flags_refused_in_one_line(
    parquet_source: str, tmp_path: Path, flags: list[str], problem: str
) -> None:
    """Refused before anything is built: a dry run on another runner would run for real, and a
    missing or invalid temp location would make Beam create a bucket (waiting on credentials)."""
    import re

    with pytest.raises(UsageError, match=re.escape(problem)):
        run(["--source", parquet_source, "--output", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


def test_dockerfile_bases_are_pinned() -> None:
    """A rebuild of the same commit must not pick up another base image."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    args = dict(re.findall(r"^ARG (\w+)=(\S+)$", text, re.M))
    for image in re.findall(r"^FROM (\S+)", text, re.M):
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest", image
