"""A Delta Lake table on gs:// (the GCS emulator, tests/gcs_emulator.py): the latest snapshot (read
from a checkpoint and the commit after it) and, with --delta_version, an older one (from before
the checkpoint) convert to exactly the records the same table converts to from a local folder
(every record compared, read with tests/independent.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deltalake
from apache_beam.io.filesystems import FileSystems
from independent import bundle_records
from test_delta import _table
from test_table_formats import _rows

from recordforge.pipelines.convert import run


def _upload(folder: Path, to: str) -> None:
    """Every file of the local table (data files and its _delta_log/) to the same paths below `to`."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with FileSystems.create(f"{to}/{path.relative_to(folder).as_posix()}") as f:
            f.write(path.read_bytes())


def _convert(table: str, out: str, *extra: str) -> dict[str, Any]:
    return run(["--source", table, "--format", "delta", "--output", out, *extra])


def test_a_delta_table_on_gcs_converts_like_the_same_table_read_locally(
    gcs_bucket: str, tmp_path: Path
) -> None:
    local, remote = tmp_path / "t", f"{gcs_bucket}/tables/t"
    rows = _rows(90)
    deltalake.write_deltalake(str(local), _table(rows[:40]))  # version 0
    deltalake.write_deltalake(str(local), _table(rows[40:60]), mode="append")  # version 1
    deltalake.DeltaTable(str(local)).create_checkpoint()  # the latest starts from it, version 0 cannot
    deltalake.write_deltalake(str(local), _table(rows[60:]), mode="append")  # version 2
    _upload(local, remote)
    for version in ([], ["--delta_version", "0"]):
        at = version[-1] if version else "latest"
        mine = _convert(str(local), str(tmp_path / f"local-{at}"), *version)
        theirs = _convert(remote, f"{gcs_bucket}/out-{at}", *version)
        assert theirs["delta"] == {**mine["delta"], "table": remote}
        assert (theirs["rows_read"], theirs["rows_written"]) == (mine["rows_read"], mine["rows_written"])
        assert theirs["rows_written"] == (90 if not version else 40)
        want = bundle_records(tmp_path / f"local-{at}")
        got = bundle_records(f"{gcs_bucket}/out-{at}")
        assert len(got) == len(want) and sorted(got) == sorted(want)
