"""head and inspect on damaged and crafted files: one line naming the file and the record, in
bounded memory; and every reading command's line on each damaged input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from crafted import (
    array_record_bundle,
    corrupt_array_record,
    example,
    frame,
    gzip_bomb,
    huge_claim,
    long_names,
    tfrecord_bundle,
)

from recordforge.cli.main import main
from recordforge.errors import CorruptFile
from recordforge.tools.describe import format_inspect, head, inspect

SPEC = {"x": {"kind": "FixedLenFeature", "dtype": "int64", "shape": []}}

# Runs a command in a child process and prints the child's CPU time (user + system) and peak
# memory (ru_maxrss, KiB on Linux): the measuring process's own are not counted. CPU time, not
# wall time: a busy machine stretches the one, hardly the other.
_MEASURE = """
import resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "recordforge", *sys.argv[1:]], capture_output=True, text=True)
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(usage.ru_utime + usage.ru_stime)
print(usage.ru_maxrss)
print(proc.returncode)
print(proc.stderr.strip())
"""


def _measured(*argv: str) -> tuple[float, int, int, str]:
    """(CPU seconds, peak memory in bytes, exit status, stderr) of `recordforge argv...` in a
    child process (its own start, imports included)."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *argv], capture_output=True, text=True, timeout=300, check=True
    ).stdout.split("\n", 3)
    return float(out[0]), int(out[1]) * 1024, int(out[2]), out[3].strip()


def test_head_of_a_gzip_bomb_stays_small(tmp_path: Path) -> None:
    """A 1 MB gzip file, one header claiming 2**40 bytes then 1 GiB of zeros: refused at the
    header in under 500 MB (before: 2.1 GB, the whole GiB inflated and joined)."""
    bomb = gzip_bomb(tmp_path / "bomb.tfrecord.gz")
    assert bomb.stat().st_size < 2 << 20
    _, peak, code, err = _measured("head", str(bomb))
    assert code == 1
    assert err == (
        f"recordforge head: error: {bomb}: not a TFRecord file (record length 1099511627776 over "
        "the limit of 2147483647 bytes (max_record_bytes) at byte 0)"
    )
    assert peak < 500 << 20, peak


def test_head_and_inspect_name_a_record_that_is_not_an_example(tmp_path: Path) -> None:
    good = example(x=("int64", [1]))
    path = tmp_path / "f.tfrecord"
    path.write_bytes(frame(good) + frame(b"\xff\xff\xff"))
    for read in (head, inspect):
        with pytest.raises(CorruptFile, match=f"^{path}: record 2 at byte 30 is not a tf.train.Example"):
            read(str(path))


@pytest.mark.corrupts
def test_inspect_names_a_bundle_record_that_is_not_an_example(tmp_path: Path) -> None:
    good = example(x=("int64", [1]))
    out = tfrecord_bundle(tmp_path / "b", [good, b"\x0a\x05\xff"], SPEC)
    shard = out / "data-00000-of-00001.tfrecord"
    with pytest.raises(CorruptFile, match=f"^{shard}: record 2 at byte 30 is not a tf.train.Example"):
        inspect(str(out))


@pytest.mark.corrupts
def test_head_and_inspect_name_a_corrupt_array_record_chunk(tmp_path: Path) -> None:
    records = [example(x=("int64", [i])) for i in range(100)]
    out = array_record_bundle(tmp_path / "b", records, SPEC)
    shard = out / "data-00000-of-00001.array_record"
    corrupt_array_record(shard, 40)
    for read in (head, lambda p: inspect(p, n=100)):
        with pytest.raises(
            CorruptFile, match=f"^{shard}: record at index 40 cannot be read \\(Corrupted Riegeli"
        ):
            read(str(shard) if read is head else str(out))


def _damaged(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A damaged input of `kind`, and what its line must hold."""
    records = [example(x=("int64", [i])) for i in range(100)]
    if kind == "huge claim":
        return huge_claim(tmp_path / "huge.tfrecord", 1 << 20), "claims 1099511627776 bytes"
    if kind == "gzip bomb":
        return gzip_bomb(tmp_path / "bomb.tfrecord.gz", 64 << 20), "over the limit of 2147483647 bytes"
    if kind == "not an example":
        path = tmp_path / "f.tfrecord"
        path.write_bytes(frame(records[0]) + frame(b"\xff\xff\xff"))
        return path, "record 2 at byte 30 is not a tf.train.Example"
    out = array_record_bundle(tmp_path / "b", records, SPEC)
    corrupt_array_record(out / "data-00000-of-00001.array_record", 2)  # among inspect's first 5
    return out, "record at index 2 cannot be read (Corrupted Riegeli"


@pytest.mark.corrupts
@pytest.mark.parametrize("kind", ["huge claim", "gzip bomb", "not an example", "array record chunk"])
@pytest.mark.parametrize("command", ["head", "inspect", "stats", "verify"])
def test_one_line_for_every_damaged_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, kind: str
) -> None:
    """Every reading command, on each damaged input: exit status 1 and one line naming the
    file and what is wrong where, never "internal error" (verify reads bundles only, and
    stats counts records that are not Examples)."""
    path, said = _damaged(tmp_path, kind)
    if command == "verify" and kind != "array record chunk":
        return
    if command == "head" and path.is_dir():
        path = path / "data-00000-of-00001.array_record"
    code = main([command, str(path)])
    captured = capsys.readouterr()
    if command == "stats" and kind == "not an example":
        assert code == 0 and "internal error" not in captured.err
        return
    assert code == 1, captured
    lines = captured.err.strip().splitlines() if command != "verify" else captured.out.strip().splitlines()
    assert "internal error" not in captured.err + captured.out
    assert any(said in line and "data-00000-of-00001" in line or str(path) in line for line in lines), (
        captured
    )
    assert any(said in line for line in lines), captured
    if command != "verify":
        assert len(lines) == 1, captured


def test_stats_of_long_feature_names(tmp_path: Path) -> None:
    """One 64 KiB feature name and 4,000 short ones (a 200 KB file): under 5 s of CPU and 500 MB
    (before: 41 s and 900 MB here, the key table copying itself for every name). A busy CI run
    once took 5.3 s of wall time for it; the CPU time is the command's own work."""
    path = long_names(tmp_path / "names.tfrecord")
    assert path.stat().st_size < 250_000
    cpu, peak, code, err = _measured("stats", str(path))
    assert code == 0, err
    assert cpu < 5, cpu
    assert peak < 500 << 20, peak


# Found by the bundle_json fuzz target (fuzz/bundle_json.py): (file, its new bytes, what the
# line says); before, each command gave an "internal error" (UnicodeDecodeError from stats,
# AttributeError, KeyError) or read a shard beside the bundle's folder (inspect).
DAMAGED_JSON = {
    "not utf-8": ("metadata.json", b'{"shards": "\xf1"}', "metadata.json: not UTF-8"),
    "spec a list": ("feature_spec.json", b"[]", "feature_spec.json: not a feature spec: is a list"),
    "climbing shard": ("metadata.json", None, "metadata.json: not a bundle's metadata: shard 0: 'file'"),
}


@pytest.mark.corrupts
@pytest.mark.parametrize("damage", list(DAMAGED_JSON))
@pytest.mark.parametrize("command", ["inspect", "stats", "verify", "export"])
def test_one_line_for_a_damaged_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, damage: str
) -> None:
    out = tfrecord_bundle(tmp_path / "b", [example(x=("int64", [1]))], SPEC)
    name, data, said = DAMAGED_JSON[damage]
    if data is None:
        meta = json.loads((out / name).read_text())
        meta["shards"][0]["file"] = "../b/" + meta["shards"][0]["file"]
        data = json.dumps(meta).encode()
    (out / name).write_bytes(data)
    code = main(
        [command, str(out), *([str(tmp_path / "dest"), "--to", "parquet"] if command == "export" else [])]
    )
    captured = capsys.readouterr()
    if command == "verify":  # a problem line, not an error
        assert code == 1 and f"{out}/{said}" in captured.out, captured
        return
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1, captured
    assert lines[0].startswith(f"recordforge {command}: error: {out}/{said}"), captured


@pytest.mark.corrupts
def test_inspect_of_a_manifest_without_the_runs_counts(tmp_path: Path) -> None:
    """metadata.json holds what load_metadata requires (shards, compression) and no counts;
    before: KeyError 'rows_read' from format_inspect."""
    out = tfrecord_bundle(tmp_path / "b", [example(x=("int64", [1]))], SPEC)
    meta = json.loads((out / "metadata.json").read_text())
    kept = {k: meta[k] for k in ("shards", "compression")}
    (out / "metadata.json").write_text(json.dumps(kept))
    text = format_inspect(inspect(str(out)))
    assert "? records in 1 shards (none)" in text
    assert "rows read ?, written ?, rejected ?; schema ? (?)" in text


def test_head_reads_a_webdataset_shard(tmp_path: Path) -> None:
    """A WebDataset shard is told by its ustar header (no suffix trusted) and shown as the
    Examples it was written from; it was read as a TFRecord file and refused."""
    from fuzz.bundles import build_bundles
    from recordforge.records import webdataset

    shard = next((build_bundles(tmp_path)["webdataset"]).glob("*.tar"))
    plain = tmp_path / "shard.tfrecord"  # a misleading name
    plain.write_bytes(shard.read_bytes())
    result = head(str(plain), n=6)
    assert result["compression"] == webdataset.WEBDATASET and result["sampled"] == 6
    examples = [e for _, e in webdataset.read_examples(str(shard))]
    assert [r["id"] for r in result["records"]] == [("int64", [i]) for i in range(6)]
    assert len(examples) == 6
    assert main(["head", str(plain), "-n", "1"]) == 0
