"""The publishing protocol on gs://, against the GCS emulator (tests/gcs_emulator.py): convert,
rebuild with --overwrite and --if_changed, a second run while one holds the lock, a crashed run's
cleanup, verify and read."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.io.filesystems import FileSystems
from independent import file_records

import recordforge
from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError
from recordforge.files import layout
from recordforge.files.storage import list_files, read_bytes
from recordforge.output.lease import Lease
from recordforge.pipelines.convert import run


def _put_parquet(path: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=500)
    with FileSystems.create(path) as f:
        f.write(buf.getvalue())


def _records(out: str) -> list[bytes]:
    bundle = recordforge.load_bundle(out)
    return [r for f in bundle["files"] for r in file_records(f, bundle["metadata"]["compression"])]


def test_publishing_on_gcs(gcs_bucket: str) -> None:
    src, out = f"{gcs_bucket}/in", f"{gcs_bucket}/out"
    _put_parquet(f"{src}/a.parquet", taxi_table(1500, seed=1))
    _put_parquet(f"{out}/notes.txt", pa.table({"x": [1]}))  # a user's file in the output
    args = ["--source", f"{src}/*.parquet", "--output", out, "--schema", "examples/taxi.yaml"]
    with pytest.raises(RecordForgeError, match="holds no RecordForge dataset"):
        run(args)
    first = run([*args, "--overwrite"])
    assert first["num_records"] == 1500 and recordforge.verify(out) == [
        "notes.txt: extra file, not in the manifest"
    ]
    assert len(_records(out)) == 1500

    # Unchanged inputs: nothing to do. A new file: a new version; the old one stays for readers.
    assert run([*args, "--if_changed"])["skipped"] is True
    _put_parquet(f"{src}/b.parquet", taxi_table(700, seed=2))
    second = run([*args, "--if_changed"])
    assert second["num_records"] == 2200 and second["previous_version"] == first["version"]
    assert len(_records(out)) == 2200

    # A run killed outright: its journal entry and half its files; and its lock (another host).
    dead = "v-20260101T000000Z-0badf00d"
    with FileSystems.create(layout.journal_entry(out, dead)) as f:
        f.write(b"{}")
    with FileSystems.create(f"{out}/{dead}/_tmp-0123/part") as f:
        f.write(b"partial")
    holder = {"run_id": dead, "host": "elsewhere", "pid": 1, "started": "2026-01-01T00:00:00Z"}
    lease = Lease.acquire(layout.lock_path(out), holder)
    # While it is held (heartbeat alive), a second run fails at once, naming the holder.
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", *args, "--overwrite"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1 and f"is being written by run {dead} (host elsewhere" in proc.stderr
    assert json.loads(read_bytes(f"{out}/metadata.json"))["version"] == second["version"]
    lease.release()

    third = run([*args, "--overwrite"])
    files = {layout.relative(p, out).split("/", 1)[0] for p in list_files(out)}
    assert dead not in files and first["version"] not in files  # the dead run's and the oldest go
    assert {second["version"], third["version"], "notes.txt", "_recordforge", "metadata.json"} <= files
    assert recordforge.verify(out) == ["notes.txt: extra file, not in the manifest"]
    assert len(_records(out)) == 2200
    # Readers that list the version folder see exactly the manifest's shards.
    root = recordforge.version_path(out)
    shards = sorted(p for p in list_files(root) if "/data-" in p)
    assert shards == sorted(f"{out}/{s['file']}" for s in third["shards"])


def test_gcs_clients_fetch_no_bucket_metadata_in_the_background(
    gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """google-cloud-storage would start a thread per bucket to fetch its metadata for tracing
    labels; importing RecordForge turns that off (in Dask workers too), so a conversion's GCS
    operations start no such thread."""
    import threading

    started: list[str] = []
    original = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    path = f"{gcs_bucket}/metadata-probe/x.bin"
    with FileSystems.create(path) as f:
        f.write(b"x")
    FileSystems.rename([path], [path + ".renamed"])
    with FileSystems.open(path + ".renamed") as f:
        assert f.read() == b"x"
    assert not [name for name in started if "fetch" in name or "verify_existence" in name], started
