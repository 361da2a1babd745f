"""A GCS emulator for tests: gcp-storage-emulator on 127.0.0.1, and the environment Beam needs to reach it.

``gcs_bucket`` (function-scoped) yields ``"gs://<fresh bucket>"`` on an in-process emulator that lives for
the whole session, with the environment below set in ``os.environ`` for the test (so child processes
inherit it) and restored afterwards. The bucket and everything in it is deleted after the test.

What a gs:// run against the emulator needs (no pipeline options; Beam 2.77, google-cloud-storage 3.x):

- ``STORAGE_EMULATOR_HOST=http://127.0.0.1:<port>``: google-cloud-storage's ``Client`` sends every request
  there. Beam's ``GcsIO`` builds a new ``storage.Client`` for each ``FileSystems`` call, so this one
  variable redirects reads, writes, listings, renames and deletes.
- ``GOOGLE_APPLICATION_CREDENTIALS=<file>``, a fake ``authorized_user`` file holding an access token that
  expires in 2999 (``_fake_credentials``): Beam's ``GcsIO`` always asks ``auth.get_service_credentials``,
  which calls ``google.auth.default()`` inside ``retry.with_exponential_backoff(num_retries=4,
  initial_delay_secs=2)``; with no credentials at all it fails, is retried, and after 22-24 s Beam
  connects anonymously (once per process: the result is cached). The file makes ``google.auth.default``
  succeed at once, with no network; the token is never refreshed because it never expires, and the
  emulator ignores the ``Authorization`` header it is sent with. ``NO_GCE_CHECK=true`` and a
  ``GCE_METADATA_HOST`` on a closed port do not help (measured: still 22 s), because the failure itself
  is what Beam retries; ``--no_auth`` only applies to the Dataflow API client, not to ``GcsIO``; and
  ``auth.set_running_in_gce`` does not change how Beam 2.77 looks credentials up.
- ``GOOGLE_CLOUD_PROJECT=<any>``: only so that ``google.auth.default`` does not log "No project ID could
  be determined".

With that, a fresh process's first ``FileSystems.match`` on gs:// takes about 20 ms (asserted < 1 s in
``test_gcs_emulator.py``), against 22-24 s without the credentials file.

Preconditions: gcp-storage-emulator (2026.7.19) ignores ``ifGenerationMatch`` entirely: an upload with
``if_generation_match=0`` overwrites an existing object and a delete with a wrong generation deletes.
Real GCS answers 412 to both. So that code relying on generation preconditions (the output lease) can be
tested, this fixture wraps the emulator's object insert and delete handlers with a check of
``ifGenerationMatch`` (0: the object must not exist; N: its live generation must be N) that answers 412
``conditionNotMet`` like GCS. The check and the write are atomic because the emulator serves one request
at a time (``http.server.HTTPServer``, not threading). Not covered: ``ifGenerationNotMatch``,
``ifMetageneration*``, preconditions on copy/rewrite/compose/patch/batch requests, and the final chunk of
a resumable upload (checked when the upload starts, not when it completes).
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest

__all__ = ["GcsEmulator", "gcs_bucket", "gcs_emulator"]

_LOGGER = logging.getLogger(__name__)

_HOST = "127.0.0.1"


@dataclass(frozen=True)
class GcsEmulator:
    """A running emulator: its endpoint and the environment variables a gs:// client needs."""

    endpoint: str
    env: dict[str, str]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        return int(sock.getsockname()[1])


def _fake_credentials(folder: Path) -> str:
    """An ADC file google.auth loads without network: a user token that never expires or refreshes."""
    path = folder / "emulator-adc.json"
    info = {
        "type": "authorized_user",
        "client_id": "gcs-emulator",
        "client_secret": "gcs-emulator",
        "refresh_token": "gcs-emulator",
        "token": "gcs-emulator",
        "expiry": "2999-01-01T00:00:00Z",
    }
    path.write_text(json.dumps(info))
    return str(path)


def _precondition_failed(response: Any, detail: str) -> None:
    response.status = HTTPStatus.PRECONDITION_FAILED
    message = f"At least one of the pre-conditions you specified did not hold. {detail}"
    response.json(
        {
            "error": {
                "code": 412,
                "message": message,
                "errors": [{"domain": "global", "reason": "conditionNotMet", "message": message}],
            }
        }
    )


def _object_name(request: Any) -> str | None:
    """The object an insert or delete request names (query, multipart metadata or resumable body)."""
    if request.params and request.params.get("object_id"):
        return str(request.params["object_id"])
    if "name" in request.query:
        return str(request.query["name"][0])
    data = request.data
    if isinstance(data, dict):
        meta = data.get("meta") if "meta" in data else data
        if isinstance(meta, dict) and meta.get("name"):
            return str(meta["name"])
    return None


def _with_generation_match(handler: Callable[..., Any]) -> Callable[..., Any]:
    from gcp_storage_emulator.exceptions import NotFound

    def checked(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if wanted and "upload_id" not in request.query:
            bucket, name = request.params["bucket_name"], _object_name(request)
            try:
                live = int(storage.get_file_obj(bucket, name)["generation"])
            except NotFound:
                live = 0
            if live != int(wanted[0]):
                _precondition_failed(response, f"ifGenerationMatch={wanted[0]}, live generation {live}")
                return None
        return handler(request, response, storage, *args, **kwargs)

    checked.wraps_for_preconditions = handler  # type: ignore[attr-defined]
    return checked


def _install_preconditions() -> Callable[[], None]:
    """Wrap the emulator's object insert and delete handlers; returns the function that unwraps them."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    originals = {"insert": objects.insert, "delete": objects.delete}
    wrapped = {fn: _with_generation_match(fn) for fn in originals.values()}
    replaced: list[tuple[dict[str, Any], str, Any]] = []
    for _, handlers in server.HANDLERS:
        for method, fn in list(handlers.items()):
            if fn in wrapped:
                handlers[method] = wrapped[fn]
                replaced.append((handlers, method, fn))
    # The router's fallback for uploads POSTed without /upload looks objects.insert up at call time.
    objects.insert = wrapped[originals["insert"]]
    objects.delete = wrapped[originals["delete"]]

    def uninstall() -> None:
        for handlers, method, fn in replaced:
            handlers[method] = fn
        objects.insert = originals["insert"]
        objects.delete = originals["delete"]

    return uninstall


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """An in-memory emulator on 127.0.0.1 and a free port, for the whole session."""
    from gcp_storage_emulator.server import create_server

    # The emulator logs a warning per response ("Content handled as string"): noise in caplog.
    for name in ("gcp_storage_emulator", "api.object", "api.bucket", "api.storage"):
        logging.getLogger(name).setLevel(logging.ERROR)
    uninstall = _install_preconditions()
    port = _free_port()
    server = create_server(_HOST, port, in_memory=True)
    server.start()
    endpoint = f"http://{_HOST}:{port}"
    env = {
        "STORAGE_EMULATOR_HOST": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": _fake_credentials(tmp_path_factory.mktemp("gcs-emulator")),
        "GOOGLE_CLOUD_PROJECT": "recordforge-test",
    }
    _LOGGER.info("GCS emulator at %s", endpoint)
    try:
        yield GcsEmulator(endpoint=endpoint, env=env)
    finally:
        server.stop()
        uninstall()


@pytest.fixture
def gcs_bucket(gcs_emulator: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``"gs://<bucket>"``: a new empty bucket, with the emulator's environment set for this test."""
    from google.cloud import storage

    for key, value in gcs_emulator.env.items():
        monkeypatch.setenv(key, value)
    # Anonymous: the fixture's own client needs no credentials (STORAGE_EMULATOR_HOST is set).
    client = storage.Client.create_anonymous_client()
    name = f"rf-test-{uuid.uuid4().hex[:12]}"
    bucket = client.create_bucket(name)
    try:
        yield f"gs://{name}"
    finally:
        _empty_and_delete(client, bucket)


def _empty_and_delete(client: Any, bucket: Any) -> None:
    """Deletes the bucket's objects and the bucket. A client killed mid-upload (the kill tests)
    leaves the emulator an unfinished upload session that is no object and yet makes it refuse to
    delete the bucket (409): with no object left, the bucket stays, as the emulator dies with the
    test session."""
    from google.api_core.exceptions import Conflict

    for attempt in range(3):
        for blob in client.list_blobs(bucket.name):
            blob.delete()
        try:
            bucket.delete()
            return
        except Conflict:
            if attempt == 2 and not list(client.list_blobs(bucket.name)):
                return
            time.sleep(0.2)
    raise AssertionError(f"gs://{bucket.name}: objects keep appearing after the test")
