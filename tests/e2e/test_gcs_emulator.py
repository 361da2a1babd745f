"""What Beam's FileSystems and google-cloud-storage do on gs:// against the test GCS emulator."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from apache_beam.io.filesystems import FileSystems
from gcs_emulator import GcsEmulator
from google.api_core import exceptions as gexc
from google.cloud import storage


def _write(path: str, data: bytes) -> None:
    with FileSystems.create(path) as f:
        f.write(data)


def _read(path: str) -> bytes:
    with FileSystems.open(path) as f:
        return f.read()


def _listing(pattern: str) -> dict[str, int]:
    return {m.path: m.size_in_bytes for m in FileSystems.match([pattern])[0].metadata_list}


def test_write_then_read_back(gcs_bucket: str) -> None:
    data = bytes(range(256)) * 1000 + b"\x00\xff"
    _write(f"{gcs_bucket}/out/a.bin", data)
    assert _read(f"{gcs_bucket}/out/a.bin") == data
    _write(f"{gcs_bucket}/out/empty", b"")
    assert _read(f"{gcs_bucket}/out/empty") == b""


def test_match_pattern_and_recursive_prefix(gcs_bucket: str) -> None:
    for name, data in {
        "d/a-1": b"1",
        "d/a-22": b"22",
        "d/b": b"",
        "d/sub/a-3": b"333",
        "e/a-4": b"4",
    }.items():
        _write(f"{gcs_bucket}/{name}", data)
    # '*' does not cross '/'; '**' does.
    assert _listing(f"{gcs_bucket}/d/a-*") == {f"{gcs_bucket}/d/a-1": 1, f"{gcs_bucket}/d/a-22": 2}
    assert _listing(f"{gcs_bucket}/d/**") == {
        f"{gcs_bucket}/d/a-1": 1,
        f"{gcs_bucket}/d/a-22": 2,
        f"{gcs_bucket}/d/b": 0,
        f"{gcs_bucket}/d/sub/a-3": 3,
    }
    assert _listing(f"{gcs_bucket}/nothing/**") == {}


def test_rename_delete_and_exists(gcs_bucket: str) -> None:
    _write(f"{gcs_bucket}/d/a", b"A")
    _write(f"{gcs_bucket}/d/b", b"B")
    _write(f"{gcs_bucket}/d/keep", b"K")
    FileSystems.rename([f"{gcs_bucket}/d/a"], [f"{gcs_bucket}/d/renamed"])
    assert not FileSystems.exists(f"{gcs_bucket}/d/a")
    assert _read(f"{gcs_bucket}/d/renamed") == b"A"

    assert FileSystems.exists(f"{gcs_bucket}/d/keep")
    # A "folder" is only a name prefix on GCS: exists() of it is False even with objects under it.
    assert not FileSystems.exists(f"{gcs_bucket}/d")
    assert not FileSystems.exists(f"{gcs_bucket}/d/")

    FileSystems.delete([f"{gcs_bucket}/d/renamed", f"{gcs_bucket}/d/b"])
    assert _listing(f"{gcs_bucket}/**") == {f"{gcs_bucket}/d/keep": 1}


def test_child_process_reaches_the_emulator_without_credential_lookups(gcs_bucket: str) -> None:
    _write(f"{gcs_bucket}/from-parent", b"parent")
    code = textwrap.dedent(
        f"""
        import json, sys, time
        from apache_beam.io.filesystems import FileSystems
        start = time.perf_counter()
        found = [m.path for m in FileSystems.match(["{gcs_bucket}/*"])[0].metadata_list]
        first = time.perf_counter() - start
        with FileSystems.create("{gcs_bucket}/from-child") as f:
            f.write(b"child")
        with FileSystems.open("{gcs_bucket}/from-parent") as f:
            read = f.read().decode()
        print(json.dumps({{"first_match_s": first, "found": found, "read": read}}))
        """
    )
    # The environment reaches the child through os.environ (set by the fixture), nothing else.
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["found"] == [f"{gcs_bucket}/from-parent"]
    assert out["read"] == "parent"
    # A credential look-up waits seconds on a metadata server that is not there; the emulator answers at once.
    assert out["first_match_s"] < 5.0, out
    assert "credentials" not in proc.stderr.lower(), proc.stderr
    assert _read(f"{gcs_bucket}/from-child") == b"child"


def test_environment_names(gcs_emulator: GcsEmulator, gcs_bucket: str) -> None:
    assert set(gcs_emulator.env) == {
        "STORAGE_EMULATOR_HOST",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_CLOUD_PROJECT",
    }
    assert all(os.environ[k] == v for k, v in gcs_emulator.env.items())


def _bucket(gcs_bucket: str) -> storage.Bucket:
    return storage.Client.create_anonymous_client().bucket(gcs_bucket.removeprefix("gs://"))


def test_create_only_if_absent_fails_with_412_when_the_object_exists(gcs_bucket: str) -> None:
    bucket = _bucket(gcs_bucket)
    first = bucket.blob("lock")
    first.upload_from_string(b"first", if_generation_match=0)
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("lock").upload_from_string(b"second", if_generation_match=0)
    assert bucket.blob("lock").download_as_bytes() == b"first"

    # Rewrite only our own generation; a stale generation is refused.
    old = first.generation
    first.upload_from_string(b"rewritten", if_generation_match=old)
    assert first.generation != old
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("lock").upload_from_string(b"late", if_generation_match=old)

    # Delete only a named generation.
    with pytest.raises(gexc.PreconditionFailed):
        bucket.blob("lock").delete(if_generation_match=old)
    bucket.blob("lock").delete(if_generation_match=first.generation)
    assert bucket.get_blob("lock") is None


def test_the_emulator_itself_ignores_generation_preconditions(monkeypatch: pytest.MonkeyPatch) -> None:
    # Why gcs_emulator.py wraps the emulator's handlers: unwrapped (here, a separate server process), an
    # upload "only if absent" overwrites and a delete of a named generation deletes any generation.
    # When this fails, upstream implements preconditions and the wrapper can go.
    port = _free_port()
    cmd = [sys.executable, "-m", "gcp_storage_emulator", "start", "-q", "-M", "-H", "127.0.0.1"]
    server = subprocess.Popen([*cmd, "--port", str(port), "--default-bucket", "raw"])
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        bucket = storage.Client.create_anonymous_client().bucket("raw")
        _wait_until_served(port)
        bucket.blob("lock").upload_from_string(b"first", if_generation_match=0)
        bucket.blob("lock").upload_from_string(b"second", if_generation_match=0)
        assert bucket.blob("lock").download_as_bytes() == b"second"
        bucket.blob("lock").delete(if_generation_match=1)
        assert bucket.get_blob("lock") is None
    finally:
        server.terminate()
        server.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_until_served(port: int) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
