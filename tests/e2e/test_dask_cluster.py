"""RecordForge on a real Dask cluster (runners/dask_runner.py): a scheduler and two worker
processes started as subprocesses on 127.0.0.1, each worker in its own working folder; inputs
read from and bundles written to the GCS emulator; every result compared with the local runner's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask_profiler
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from independent import file_records

import recordforge
from demo.sampledata import taxi_table
from recordforge.files import layout
from recordforge.files.storage import list_files, read_bytes
from recordforge.output import crashpoints
from recordforge.pipelines.convert import run
from recordforge.runners.dask_runner import RUNNER
from recordforge.tools.verify import verify
from recordforge.transforms import csv_ranges

_COUNTS = ("num_records", "rows_read", "rows_written", "rows_rejected", "rejected_by_rule")
ROWS_PER_FILE = 20_000  # the killed run's input: 4 files, 16 row groups


@dataclass
class Cluster:
    """A scheduler and its workers, each a subprocess; `start_worker` adds one."""

    root: Path
    scheduler_file: Path
    env: dict[str, str]
    address: str = ""
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(
        self, name: str, args: list[str], cwd: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        cwd.mkdir(parents=True, exist_ok=True)
        log = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=cwd,
            env={**self.env, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start_worker(self, name: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """A worker `name`, with `env` added to the cluster's environment."""
        folder = self.root / name  # the worker's working folder, not the driver's
        self.workers[name] = self.start(
            name,
            [
                "distributed.cli.dask_worker",
                "--scheduler-file",
                str(self.scheduler_file),
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-nanny",  # the subprocess is the worker: killing it kills the worker
                "--no-dashboard",
                "--name",
                name,
                "--local-directory",
                str(folder / "scratch"),
            ],
            folder,
            env,
        )
        return self.workers[name]


@pytest.fixture(scope="module")
def cluster(gcs_emulator: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A Dask scheduler and two workers, subprocesses with the GCS emulator's environment."""
    root = tmp_path_factory.mktemp("dask-cluster")
    c = Cluster(root, root / "scheduler.json", {**os.environ, **gcs_emulator.env, **dask_profiler.ENV})
    c.start(
        "scheduler",
        [
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(c.scheduler_file),
        ],
        root / "scheduler",
    )
    try:
        deadline = time.monotonic() + 60
        while not c.address:
            try:  # written by the scheduler once it listens
                c.address = json.loads(c.scheduler_file.read_text())["address"]
            except (OSError, ValueError, KeyError):
                assert time.monotonic() < deadline, (root / "scheduler.log").read_text()
                time.sleep(0.05)
        c.start_worker("w0")
        c.start_worker("w1")
        with _client(c) as client:
            client.wait_for_workers(2, timeout=60)
        yield c
    finally:
        # Workers first, then the scheduler; each given 20 s to stop, then killed.
        for proc in sorted(c.procs, key=lambda p: p is c.procs[0]):
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def _client(c: Cluster) -> Any:
    from distributed import Client

    return Client(c.address, set_as_default=False, timeout=30)


def _dask(c: Cluster) -> list[str]:
    return ["--runner", RUNNER, "--dask_client_address", c.address]


def _put(path: str, data: bytes) -> None:
    with FileSystems.create(path) as f:
        f.write(data)


def _parquet_inputs(src: str) -> str:
    for i in range(3):
        buf = io.BytesIO()
        pq.write_table(taxi_table(900, seed=i, first_id=i * 900), buf, row_group_size=300)
        _put(f"{src}/t{i}.parquet", buf.getvalue())
    return f"{src}/*.parquet"


_CSV_SCHEMA = {
    "features": [
        {"name": "id", "type": "int64", "nulls": "required"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": "float64", "narrow": True, "min": 0},
    ]
}


def _csv_input(src: str) -> tuple[str, int]:
    """A CSV of 400 rows, 40 of them bad (a wrong column count, a non-integer id, a negative
    amount, a missing id): the path and the number of bad rows."""
    lines, bad = ["id,name,amount"], 0
    for i in range(400):
        kind = i % 10
        if kind == 3 and i % 40 == 3:
            lines.append(f"{i},extra,1.5,surplus")
        elif kind == 3 and i % 40 == 13:
            lines.append(f"x{i},bad id,2.0")
        elif kind == 3 and i % 40 == 23:
            lines.append(f"{i},negative,-{i}.25")
        elif kind == 3:
            lines.append(f",no id,{i}.0")
        else:
            lines.append(f'{i},"name {i}, quoted",{i}.5')
            continue
        bad += 1
    _put(f"{src}/rows.csv", ("\n".join(lines) + "\n").encode())
    return f"{src}/rows.csv", bad


def _raw_bytes(path: str) -> bytes:
    """A file's bytes as stored (FileSystems.open would gunzip a .gz)."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def _records(out: str) -> Counter:
    bundle = recordforge.load_bundle(out)
    return Counter(r for f in bundle["files"] for r in file_records(f, bundle["metadata"]["compression"]))


def _rejected(out: str) -> Counter:
    root = recordforge.version_path(out)
    matches = FileSystems.match([layout.join(root, layout.REJECTED_DIR) + "/**"])[0].metadata_list
    return Counter(line for m in matches for line in read_bytes(m.path).decode().splitlines())


def _counts(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: meta.get(k) for k in _COUNTS}


def test_workers_run_in_their_own_folders(cluster: Cluster) -> None:
    with _client(cluster) as client:
        client.wait_for_workers(len(cluster.workers), timeout=60)  # one may just have been started
        folders = client.run(os.getcwd)
    assert sorted(folders.values()) == sorted(str(cluster.root / n) for n in cluster.workers)
    assert os.getcwd() not in folders.values()


def test_converts_from_and_to_gcs_like_the_local_runner(
    cluster: Cluster, gcs_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import get_task_stream
    from distributed.utils import key_split

    # Chunks of 1,000 bytes: on Dask the CSV file is read as byte ranges by both workers (the
    # one local worker reads it whole), and every row, rejected ones too, keeps its number.
    monkeypatch.setattr(csv_ranges, "CHUNK_BYTES", 1000)

    parquet = _parquet_inputs(f"{gcs_bucket}/in/parquet")
    csv, bad = _csv_input(f"{gcs_bucket}/in/csv")
    (tmp_path / "csv.yaml").write_text(yaml.safe_dump(_CSV_SCHEMA))
    runs = {
        "parquet": ["--source", parquet, "--schema", "examples/taxi.yaml"],
        "csv": ["--source", csv, "--schema", str(tmp_path / "csv.yaml"), "--max_rejected", "100"],
    }
    with _client(cluster) as client:
        for name, args in runs.items():
            local = run([*args, "--output", f"{gcs_bucket}/local-{name}"])
            with get_task_stream(client=client) as stream:
                dask = run([*args, "--output", f"{gcs_bucket}/dask-{name}", *_dask(cluster)])
            assert _counts(dask) == _counts(local), name
            assert _records(f"{gcs_bucket}/dask-{name}") == _records(f"{gcs_bucket}/local-{name}"), name
            assert _rejected(f"{gcs_bucket}/dask-{name}") == _rejected(f"{gcs_bucket}/local-{name}"), name
            assert verify(f"{gcs_bucket}/dask-{name}") == [] and verify(f"{gcs_bucket}/local-{name}") == []
            # The scheduler's record of where each task ran: reads and encoding ran on both (the
            # Parquet files' nine row groups; the CSV file's byte ranges).
            steps: dict[str, set[str]] = {}
            for task in stream.data:
                steps.setdefault(key_split(task["key"]), set()).add(task["worker"])
            both = {s for s, workers in steps.items() if len(workers) == 2}
            assert any(s.startswith("ToExamples") for s in both), (name, steps)
            assert any(s.startswith("Read") for s in both), (name, steps)
    assert dask["num_records"] == 400 - bad and dask["rows_rejected"] == bad
    assert sum(_rejected(f"{gcs_bucket}/dask-csv").values()) == bad
    assert local["rejected_by_rule"] and dask["rows_read"] == 400


def test_deterministic_shards_are_byte_identical(cluster: Cluster, gcs_bucket: str) -> None:
    args = ["--source", _parquet_inputs(f"{gcs_bucket}/in"), "--schema", "examples/taxi.yaml"]
    args += ["--deterministic", "--num_shards", "3"]
    local = run([*args, "--output", f"{gcs_bucket}/local"])
    dask = run([*args, "--output", f"{gcs_bucket}/dask", *_dask(cluster)])

    def shards(out: str, meta: dict[str, Any]) -> list[tuple[str, str, str]]:
        return [
            (
                s["file"].split("/", 1)[1],
                s["sha256"],
                hashlib.sha256(_raw_bytes(layout.join(out, s["file"]))).hexdigest(),
            )
            for s in meta["shards"]
        ]

    local_shards, dask_shards = shards(f"{gcs_bucket}/local", local), shards(f"{gcs_bucket}/dask", dask)
    assert len(dask_shards) == 3 and all(listed == measured for _, listed, measured in dask_shards)
    assert dask_shards == local_shards
    assert verify(f"{gcs_bucket}/dask") == []


def test_a_deterministic_run_killed_on_dask_resumes_to_the_same_bytes_on_gcs(
    cluster: Cluster, gcs_bucket: str, tmp_path: Path
) -> None:
    """--deterministic on Dask, to gs://: the whole cluster's work killed (SIGKILL, the workers and
    then the driver, as when the machines are preempted: a dead driver's tasks would otherwise
    go on writing every shard) once 7 of the 10 shards are recorded; on a new pair of workers the
    rerun keeps the finished shards, writes the others and publishes the local runner's bytes."""
    src = tmp_path / "src"
    src.mkdir()
    rows, files = 50_000, 6
    for i in range(files):
        pq.write_table(
            taxi_table(rows, seed=i, first_id=i * rows), src / f"t{i}.parquet", row_group_size=5000
        )
    args = ["--source", str(src / "*.parquet"), "--schema", "examples/taxi.yaml"]
    args += ["--deterministic", "--num_shards", "10"]
    local, out = f"{gcs_bucket}/local", f"{gcs_bucket}/out"
    expected = run([*args, "--output", local])
    cli = [sys.executable, "-m", "recordforge", "convert", *args, "--output", out, *_dask(cluster)]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        if sum("/_pieces/shard-" in p and p.endswith(".json") for p in list_files(out)) >= 7:
            for worker in cluster.workers.values():
                worker.send_signal(signal.SIGKILL)
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    _, err = proc.communicate(timeout=60)
    for name in list(cluster.workers):  # the module's cluster goes on with two fresh workers
        cluster.workers.pop(name).wait(timeout=30)
        cluster.start_worker(f"{name}-again")
    with _client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
    assert proc.returncode == -9, f"the run ended before 7 shards were recorded: {err}"
    finished = sum("/_pieces/shard-" in p and p.endswith(".json") for p in list_files(out))
    rerun = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    meta = json.loads(read_bytes(f"{out}/{layout.METADATA}"))
    resumed = meta["resumed"]
    assert 7 <= resumed["shards"] == finished < 10 and resumed["parts"] == 0, (resumed, finished)
    assert resumed["rows"] + resumed["rows_converted"] == meta["rows_read"] == rows * files

    def shards(output: str, m: dict[str, Any]) -> list[tuple[str, bytes]]:
        return [(s["file"].split("/", 1)[1], _raw_bytes(layout.join(output, s["file"]))) for s in m["shards"]]

    assert shards(out, meta) == shards(local, expected)
    assert verify(out) == []
    print(f"resumed: {resumed}")


def test_a_worker_killed_mid_run(cluster: Cluster, tmp_path: Path) -> None:
    """SIGKILL the worker running the encoding while a conversion runs: the run either
    completes with exactly the right records, or fails (exit 1, ending with RecordForge's error
    line) and publishes nothing: the previous bundle intact. Never wrong data with exit 0."""
    from distributed.utils import key_split

    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        table = taxi_table(ROWS_PER_FILE, seed=i, first_id=i * ROWS_PER_FILE)
        pq.write_table(table, src / f"t{i}.parquet", row_group_size=5000)
    out = tmp_path / "out"
    args = ["--source", str(src / "*.parquet"), "--schema", "examples/taxi.yaml", "--output", str(out)]
    previous = run(args)  # the local runner: the published bundle, and the records expected
    expected = _records(str(out))
    # The CLI, as a user runs it, with the runner's user-facing name.
    dask = ["--runner", "DaskRunner", "--dask_client_address", cluster.address]
    proc = subprocess.Popen(
        [sys.executable, "-m", "recordforge", "convert", *args, "--overwrite", *dask],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = None
    with _client(cluster) as client:
        names = {addr: info["name"] for addr, info in client.scheduler_info()["workers"].items()}
        deadline = time.monotonic() + 120
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            for addr, keys in client.processing().items():
                if any(key_split(k).startswith("ToExamples") for k in keys):
                    killed = names[addr]
                    cluster.workers[killed].send_signal(signal.SIGKILL)
                    break
            time.sleep(0.02)
    assert killed is not None, "the run ended before a worker could be killed during the encoding"
    _, stderr = proc.communicate(timeout=300)
    cluster.workers.pop(killed).wait(timeout=30)  # gone from the cluster: later tests see its two
    cluster.start_worker(f"{killed}-again")  # the module's cluster goes on with two workers
    published = json.loads((out / "metadata.json").read_text())
    if proc.returncode == 0:
        # Dask ran the lost worker's tasks again elsewhere: the right records, once each.
        assert published["version"] != previous["version"]
        assert _counts(published) == _counts(previous)
        outcome = "completed"
    else:
        last = stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and last.startswith("recordforge convert: error: "), stderr
        assert published["version"] == previous["version"]
        outcome = f"failed: {last}"
    assert _records(str(out)) == expected  # and conftest verifies the bundle under tmp_path
    print(f"worker {killed} killed mid-run; the run {outcome}")


def test_many_partitions_still_make_shards_of_the_target_size(cluster: Cluster, tmp_path: Path) -> None:
    """Each Dask partition is a bundle, and each bundle leaves a short last part: with 24
    partitions and a 60 KB target, the joins must still give shards within 25% of the target,
    but for one short shard."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        pq.write_table(taxi_table(3000, seed=i, first_id=i * 3000), src / f"t{i}.parquet", row_group_size=500)
    out, local = tmp_path / "out", tmp_path / "local"
    target = 60_000
    args = ["--source", str(src / "*.parquet"), "--schema", "examples/taxi.yaml"]
    args += ["--shard_size", str(target), "--batch_size", "250"]
    meta = run([*args, "--output", str(out), *_dask(cluster), "--dask_npartitions", "24"])
    sizes = [s["bytes"] for s in meta["shards"]]
    short = [b for b in sizes if not 0.75 * target <= b <= 1.25 * target]
    assert len(sizes) > 3 and len(short) <= 1 and all(b < target for b in short), sizes
    run([*args, "--output", str(local)])
    assert _records(str(out)) == _records(str(local))
    assert meta["rows_written"] == 12_000 and verify(str(out)) == []


def test_array_record_and_indexed_shards_on_gcs_read_at_random(cluster: Cluster, gcs_bucket: str) -> None:
    """ArrayRecord shards staged locally and uploaded, on Dask and on the local runner, and indexed
    TFRecords, all on gs://: verified, and read at random through data_source."""
    import random

    from recordforge.records.array_records import reading

    parquet = _parquet_inputs(f"{gcs_bucket}/in/random")
    base = ["--source", parquet, "--schema", "examples/taxi.yaml", "--shard_size", "30KB"]
    outs = {
        "dask": [
            *base,
            "--output_format",
            "array_record",
            "--output",
            f"{gcs_bucket}/ar-dask",
            *_dask(cluster),
        ],
        "local": [*base, "--output_format", "array_record", "--output", f"{gcs_bucket}/ar-local"],
        "indexed": [*base, "--record_index", "--output", f"{gcs_bucket}/indexed"],
    }
    records = {}
    for name, argv in outs.items():
        meta = run(argv)
        out = argv[argv.index("--output") + 1]
        assert verify(out) == [], name
        assert len(meta["shards"]) > 1 and meta["num_records"] == 2700, name
        bundle = recordforge.load_bundle(out)
        sequential = [r for f in bundle["files"] for r in file_records(f, reading(bundle["metadata"]))]
        ds = recordforge.data_source(out)
        assert len(ds) == len(sequential) == meta["num_records"]
        keys = random.Random(1).sample(range(len(ds)), 300)
        assert [ds[k] for k in keys] == [sequential[k] for k in keys], name
        records[name] = Counter(sequential)
    assert records["dask"] == records["local"] == records["indexed"]


def _kill_test_input(tmp_path: Path, rows: int, files: int) -> list[str]:
    """`files` Parquet files of `rows` rows (row groups of 2,500) under tmp_path/src, and the
    flags converting them in shards of 128 KiB (about a part per 2,500 rows)."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(files):
        table = taxi_table(rows, seed=i, first_id=i * rows)
        pq.write_table(table, src / f"t{i}.parquet", row_group_size=2500)
    return ["--source", str(src / "*.parquet"), "--schema", "examples/taxi.yaml", "--shard_size", "128KiB"]


def test_a_run_killed_on_dask_is_resumed_by_its_rerun(cluster: Cluster, tmp_path: Path) -> None:
    """The driver of a Dask run killed (SIGKILL) once about 70% of its parts are recorded; once
    the cluster is idle, the same command resumes: it converts at most a third of the rows and
    publishes the records the local runner does."""
    rows, files = 25_000, 6
    args = _kill_test_input(tmp_path, rows, files)
    out, local = tmp_path / "out", tmp_path / "local"
    expected = run([*args, "--output", str(local)])
    parts = expected["num_records"] * 53 // (128 << 10)  # about as many full parts as shards
    cli = [sys.executable, "-m", "recordforge", "convert", *args, "--output", str(out), *_dask(cluster)]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list(out.glob("v-*/_pieces/part-*.json"))) >= 0.7 * parts:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, f"the run ended before 70% of its parts were recorded: {err}"
    with _client(cluster) as client:  # the dead driver's tasks stopped or finished
        deadline = time.monotonic() + 120
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.1)
    rerun = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    meta = json.loads((out / layout.METADATA).read_text())
    resumed = meta["resumed"]
    assert resumed["rows"] + resumed["rows_converted"] == meta["rows_read"] == rows * files
    assert resumed["rows_converted"] <= rows * files / 3, resumed
    assert _records(str(out)) == _records(str(local)) and verify(str(out)) == []


def test_a_worker_killed_at_a_finished_piece(cluster: Cluster, tmp_path: Path) -> None:
    """A third worker that kills itself (SIGKILL, the crash point `piece_written`) when it has
    recorded its 5th part, while the run records pieces for a rerun: Dask runs the lost tasks
    again on the other workers, and the run either completes or fails with one line. Completed,
    it publishes the local runner's records exactly once (the dead worker's recorded parts are
    not published beside the retried tasks' copies); failed, the same command resumes and does."""
    rows, files = 25_000, 6
    args = _kill_test_input(tmp_path, rows, files)
    out, local = tmp_path / "out", tmp_path / "local"
    run([*args, "--output", str(local)])
    crash = {crashpoints.ENV: "piece_written", crashpoints.AFTER_ENV: "5"}
    doomed = cluster.start_worker("doomed", env=crash)
    try:
        with _client(cluster) as client:
            client.wait_for_workers(3, timeout=60)
        cli = [sys.executable, "-m", "recordforge", "convert", *args, "--output", str(out), *_dask(cluster)]
        first = subprocess.run(cli, capture_output=True, text=True, timeout=600)
        assert doomed.wait(timeout=60) == -signal.SIGKILL, "the worker did not reach its 5th part"
    finally:
        if doomed.poll() is None:
            doomed.kill()
        cluster.workers.pop("doomed").wait(timeout=30)
    if first.returncode == 0:
        outcome = "completed"
    else:
        last = first.stderr.strip().splitlines()[-1]
        assert first.returncode == 1 and last.startswith("recordforge convert: error: "), first.stderr
        assert not (out / layout.METADATA).exists()
        rerun = subprocess.run(cli, capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr
        outcome = f"failed ({last}), and its rerun resumed"
    meta = json.loads((out / layout.METADATA).read_text())
    assert meta["rows_read"] == rows * files and meta["num_records"] == rows * files
    assert _records(str(out)) == _records(str(local)) and verify(str(out)) == []
    print(f"a worker killed at its 5th part: the run {outcome}")
