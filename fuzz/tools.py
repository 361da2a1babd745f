"""The reading tools on mutated bundles: each succeeds or raises a RecordForgeError, in bounded time."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from fuzz.bundles import FILES, KINDS, build_bundles, bundle_file
from recordforge.errors import RecordForgeError
from recordforge.reading.random_access import DataSource
from recordforge.tools.describe import head, inspect
from recordforge.tools.stats import stats
from recordforge.tools.verify import verify

__all__ = ["SECONDS_PER_INPUT", "tools"]

# Inputs are at most fuzz/run.py's MAX_LEN (64 KiB): a tool linear in its input reads one in
# milliseconds (a gzip input inflates at most ~1000x); a quadratic loop or a bomb takes far longer.
SECONDS_PER_INPUT = 20.0

_STATE: dict[str, Path] = {}


def _bundles() -> dict[str, Path]:
    if not _STATE:
        root = Path(tempfile.mkdtemp(prefix="recordforge-fuzz-"))
        _STATE["root"] = root
        _STATE.update(build_bundles(root / "base"))
    return {kind: _STATE[kind] for kind in KINDS}


def _read_all(path: str) -> None:
    source = DataSource(path)
    n = len(source)
    for record in source.__getitems__(range(min(n, 64))):
        source.parse(record)


def tools(data: bytes) -> None:
    """Byte 0 picks a bundle and one of its files, the rest is that file's new content; verify,
    stats, head, inspect and data_source then read the bundle."""
    if not data:
        return
    kind = KINDS[data[0] // len(FILES) % len(KINDS)]
    which = FILES[data[0] % len(FILES)]
    base = _bundles()[kind]
    work = _STATE["root"] / "work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(base, work)
    target, shard = bundle_file(work, which), bundle_file(work, "shard")
    if target is None or shard is None:
        return
    target.write_bytes(data[1:])
    out = str(work)
    calls = [
        ("verify", lambda: verify(out, workers=1)),
        ("stats", lambda: stats(out, workers=1)),
        ("head", lambda: head(str(shard))),
        ("inspect", lambda: inspect(out)),
        ("data_source", lambda: _read_all(out)),
    ]
    for name, call in calls:
        began = time.monotonic()
        try:
            call()
        except RecordForgeError:
            pass
        took = time.monotonic() - began
        assert took < SECONDS_PER_INPUT, f"{name} took {took:.1f} s on a {len(data)}-byte input"
