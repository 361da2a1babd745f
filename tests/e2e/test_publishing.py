"""Publishing never loses data: each dangerous path is driven on purpose (bad flags and inputs,
two runs at once, a reader during a rebuild, inputs changed mid-read) and the last good bundle is
checked to be exactly as it was. Kills at each step of the protocol: test_crash_points.py."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from conftest import published_root

import recordforge
from demo.sampledata import taxi_table
from recordforge.errors import RecordForgeError, SchemaError, SourceError
from recordforge.pipelines.convert import run
from recordforge.tools.verify import verify


@pytest.mark.parametrize("name", ["croissant.json", "feature_spec.json", "dataset_info.json", "schema.pbtxt"])
def test_a_users_file_named_like_a_bundle_file_is_never_replaced(tmp_path: Path, name: str) -> None:
    """A publish writes files of these names at the top of the output (and a rebuild may delete
    them): one RecordForge did not write stops the run before anything is written, even with
    --overwrite, and stays as it was."""
    pq.write_table(pa.table({"x": [1]}), tmp_path / "a.parquet")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / name).write_text("mine")
    args = ["--source", str(tmp_path / "a.parquet"), "--output", str(tmp_path / "out"), "--overwrite"]
    with pytest.raises(RecordForgeError, match=f"out/{name} was not written by RecordForge"):
        run([*args, "--compression", "none"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [name]
    assert (tmp_path / "out" / name).read_text() == "mine"


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file below `folder` with the sha256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and "_recordforge" not in p.parts
    }


@pytest.fixture
def published(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """A source and a good published bundle of it, with a snapshot of every file."""
    src = tmp_path / "in"
    src.mkdir()
    pq.write_table(taxi_table(3000, seed=1), src / "a.parquet", row_group_size=1000)
    out = tmp_path / "out"
    run(["--source", str(src / "*.parquet"), "--output", str(out), "--schema", "examples/taxi.yaml"])
    return src, out, _snapshot(out)


def _convert(*args: str) -> list[str]:
    return [sys.executable, "-m", "recordforge", "convert", *args]


def test_glob_characters_in_output_are_refused_and_siblings_untouched(tmp_path: Path) -> None:
    for name in ("exp1", "exp2"):
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "keep.txt").write_text(name)
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    for pattern in ("exp[12]", "exp?", "exp*"):
        with pytest.raises(RecordForgeError, match="glob character"):
            run(
                [
                    "--source",
                    str(tmp_path / "a.parquet"),
                    "--output",
                    str(tmp_path / "runs" / pattern),
                    "--overwrite",
                ]
            )
    assert sorted(p.read_text() for p in (tmp_path / "runs").rglob("keep.txt")) == ["exp1", "exp2"]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["exp1", "exp2"]


def test_if_changed_and_overwrite_never_delete_user_files(published: tuple) -> None:
    src, out, _ = published
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "plot.png").write_bytes(b"\x89PNG")
    # Named like a version folder, but no run journal entry says RecordForge made it.
    lookalike = out / "v-20200101T000000Z-deadbeef"
    lookalike.mkdir()
    (lookalike / "model.ckpt").write_text("weights")
    pq.write_table(taxi_table(500, seed=2), src / "b.parquet")
    args = ["--source", str(src / "*.parquet"), "--output", str(out), "--schema", "examples/taxi.yaml"]
    meta = run([*args, "--if_changed"])
    assert meta["num_records"] == 3500
    meta = run([*args, "--overwrite"])
    assert (out / "notes.txt").read_text() == "mine" and (
        out / "mine" / "plot.png"
    ).read_bytes() == b"\x89PNG"
    assert (lookalike / "model.ckpt").read_text() == "weights"
    problems = verify(str(out))
    # verify names the files the manifest does not account for, and nothing else.
    assert sorted(problems) == [
        "mine/plot.png: extra file, not in the manifest",
        "notes.txt: extra file, not in the manifest",
        "v-20200101T000000Z-deadbeef/model.ckpt: extra file, not in the manifest",
    ]
    (out / "notes.txt").unlink()
    (out / "mine" / "plot.png").unlink()
    (lookalike / "model.ckpt").unlink()


def test_a_folder_with_user_files_is_refused_without_overwrite(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1]}), tmp_path / "a.parquet")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    args = ["--source", str(tmp_path / "a.parquet"), "--output", str(tmp_path / "out")]
    with pytest.raises(RecordForgeError, match="holds no RecordForge dataset .*notes.txt"):
        run(args)
    meta = run([*args, "--overwrite"])  # publishes beside it
    assert meta["num_records"] == 1 and (tmp_path / "out" / "notes.txt").read_text() == "mine"
    (tmp_path / "out" / "notes.txt").unlink()


def test_a_published_bundle_is_not_replaced_without_being_asked(published: tuple) -> None:
    src, out, before = published
    with pytest.raises(RecordForgeError, match="already holds a published dataset.*--overwrite"):
        run(["--source", str(src / "*.parquet"), "--output", str(out)])
    assert _snapshot(out) == before


@pytest.mark.parametrize(
    ("mistake", "error", "message"),
    [
        ("typo_source", SourceError, r"input pattern '.*\*\.parquett' matched no files"),
        ("bad_schema", SchemaError, r"feature #1 'x': `type: nonsense` is not one of"),
        ("source_inside_output", RecordForgeError, r"the input .* is where RecordForge writes its bundle"),
        ("schema_inside_output", RecordForgeError, r"--schema .* is where RecordForge writes its bundle"),
        ("bad_split", RecordForgeError, r"--splits: split names repeat"),
    ],
)
def test_a_failed_overwrite_leaves_the_last_good_bundle(
    published: tuple, mistake: str, error: type[Exception], message: str
) -> None:
    src, out, before = published
    args = [
        "--source",
        str(src / "*.parquet"),
        "--output",
        str(out),
        "--overwrite",
        "--schema",
        "examples/taxi.yaml",
    ]
    if mistake == "typo_source":
        args[1] = str(src / "*.parquett")
    elif mistake == "bad_schema":
        (src.parent / "bad.yaml").write_text("features:\n  - name: x\n    type: nonsense\n")
        args[-1] = str(src.parent / "bad.yaml")
    elif mistake == "source_inside_output":
        version = published_root(out).name
        args += ["--format", "parquet"]  # else its name fails the run first: it must reach the check
        args[1] = str(out / version / "*.tfrecord.gz")
    elif mistake == "schema_inside_output":
        args[-1] = str(out / "schema.yaml")
    else:
        args += ["--splits", "train=1,train=2"]
    with pytest.raises(error, match=message):
        run(args)
    assert _snapshot(out) == before
    assert verify(str(out)) == []


def test_a_users_schema_in_an_unpublished_output_is_read_not_deleted(tmp_path: Path) -> None:
    pq.write_table(pa.table({"x": [1, 2, 3]}), tmp_path / "a.parquet")
    out = tmp_path / "out"
    out.mkdir()
    text = "features:\n  - name: x\n    type: int64\n"
    (out / "schema.yaml").write_text(text)
    with pytest.raises(RecordForgeError, match="schema.yaml was not written by RecordForge"):
        run(
            [
                "--source",
                str(tmp_path / "a.parquet"),
                "--output",
                str(out),
                "--schema",
                str(out / "schema.yaml"),
                "--overwrite",
            ]
        )
    assert (out / "schema.yaml").read_text() == text


def test_a_strict_rebuild_with_a_bad_row_keeps_the_last_good_bundle(published: tuple) -> None:
    src, out, before = published
    bad = taxi_table(10, seed=3).to_pylist()
    bad[4]["fare_amount"] = None  # required in examples/taxi.yaml
    pq.write_table(pa.Table.from_pylist(bad, schema=taxi_table(1, seed=3).schema), src / "b.parquet")
    with pytest.raises(Exception, match="b.parquet, row 5"):
        run(
            [
                "--source",
                str(src / "*.parquet"),
                "--output",
                str(out),
                "--schema",
                "examples/taxi.yaml",
                "--if_changed",
            ]
        )
    assert _snapshot(out) == before
    assert verify(str(out)) == []
    assert [p.name for p in out.glob("v-*")] == [published_root(out).name]  # the failed run's folder is gone


def test_a_rebuild_publishes_a_new_version_and_keeps_one_before_it(published: tuple) -> None:
    src, out, _ = published
    args = [
        "--source",
        str(src / "*.parquet"),
        "--output",
        str(out),
        "--schema",
        "examples/taxi.yaml",
        "--overwrite",
    ]
    first = json.loads((out / "metadata.json").read_text())["version"]
    second = run(args)
    assert second["previous_version"] == first
    assert sorted(p.name for p in out.glob("v-*")) == sorted([first, second["version"]])
    third = run(args)
    # The version before the replaced one goes; the replaced one stays for readers still on it.
    assert sorted(p.name for p in out.glob("v-*")) == sorted([second["version"], third["version"]])
    assert sorted(p.name for p in (out / "_recordforge" / "runs").iterdir()) == sorted(
        [second["version"], third["version"]]
    )
    assert verify(str(out)) == []


def test_inputs_changed_during_the_run_are_not_published(tmp_path: Path) -> None:
    from recordforge.transforms.bundle import BundleSpec, _check_inputs_unchanged

    path = tmp_path / "a.csv"
    path.write_text("x\n1\n2\n")
    st = path.stat()
    spec = BundleSpec.__new__(BundleSpec)
    object.__setattr__(spec, "sources", ((str(path), st.st_size, st.st_mtime),))
    object.__setattr__(spec, "source_format", "csv")
    _check_inputs_unchanged(spec)
    path.write_text("x\n1\n")  # cut short
    with pytest.raises(SourceError, match="a.csv: the input changed while it was being read"):
        _check_inputs_unchanged(spec)
    path.unlink()
    with pytest.raises(SourceError, match="disappeared"):
        _check_inputs_unchanged(spec)


def test_a_csv_truncated_while_being_read_fails_and_publishes_nothing(tmp_path: Path) -> None:
    src = tmp_path / "big.csv"
    table = taxi_table(600_000, seed=4).select(["trip_id", "fare_amount", "payment_type"])
    pacsv.write_csv(table, src)
    size = src.stat().st_size
    out = tmp_path / "out"
    proc = subprocess.Popen(
        _convert("--source", str(src), "--output", str(out), "--batch_size", "2000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("v-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.01)
    with open(src, "r+b") as f:  # cut it while the run reads it
        f.truncate(size // 3)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert "big.csv" in err and "changed while it was being read" in err
    assert not (out / "_SUCCESS").exists() and not (out / "metadata.json").exists()


def test_a_flipped_byte_in_a_checksummed_parquet_page_fails_the_run(tmp_path: Path) -> None:
    import struct

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"x": list(range(1000))}), path, write_page_checksum=True, compression="none")
    data = bytearray(path.read_bytes())
    data[data.find(struct.pack("<q", 500))] ^= 1  # 500 -> 501, as a bit flip on disk would
    path.write_bytes(bytes(data))
    with pytest.raises(Exception, match="c.parquet.*(checksum|CRC)"):
        run(["--source", str(path), "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out" / "_SUCCESS").exists()


_HOLD = """
import os, socket, sys, time
from recordforge.files import layout
from recordforge.output.lease import Lease
owner = {"run_id": "v-20260101T000000Z-0000beef", "pid": os.getpid(), "host": socket.gethostname()}
lease = Lease.acquire(layout.lock_path(sys.argv[1]), owner)
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_run_fails_at_once_naming_the_holder_then_reclaims_a_dead_ones_lock(
    published: tuple,
) -> None:
    src, out, before = published
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    args = _convert(
        "--source",
        str(src / "*.parquet"),
        "--output",
        str(out),
        "--schema",
        "examples/taxi.yaml",
        "--overwrite",
    )
    second = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert second.returncode == 1, second.stderr
    assert "is being written by run v-20260101T000000Z-0000beef" in second.stderr
    assert _snapshot(out) == before
    holder.kill()  # kill -9: the lock stays, naming a process that no longer exists
    holder.wait()
    third = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert "not running on this host" in third.stderr  # reclaimed, and said so
    assert verify(str(out)) == []


def test_two_runs_started_together_never_mix(published: tuple) -> None:
    src, out, _ = published
    pq.write_table(taxi_table(100_000, seed=7), src / "big.parquet", row_group_size=20_000)
    args = _convert(
        "--source",
        str(src / "*.parquet"),
        "--output",
        str(out),
        "--schema",
        "examples/taxi.yaml",
        "--overwrite",
    )
    procs = [
        subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes in ([0, 0], [0, 1]), results
    for code, err in results:
        if code:
            assert "is being written by run v-" in err
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["num_records"] == 103_000 and verify(str(out)) == []


def test_a_reader_during_a_rebuild_sees_a_whole_version(published: tuple) -> None:
    src, out, _ = published
    pq.write_table(taxi_table(200_000, seed=8), src / "big.parquet", row_group_size=20_000)
    seen: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def read_loop() -> None:
        while not stop.is_set():
            try:
                bundle = recordforge.load_bundle(str(out))
                files = bundle["files"]
                assert all(os.path.exists(f) for f in files)
                seen.append(bundle["metadata"]["num_records"])
            except Exception as exn:  # noqa: BLE001 - collected and asserted on below
                errors.append(repr(exn))
            time.sleep(0.005)

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        run(
            [
                "--source",
                str(src / "*.parquet"),
                "--output",
                str(out),
                "--schema",
                "examples/taxi.yaml",
                "--overwrite",
            ]
        )
    finally:
        stop.set()
        reader.join()
    assert errors == []
    assert set(seen) <= {3000, 203_000} and seen[0] == 3000 and seen[-1] == 203_000


@pytest.mark.corrupts
def test_verify_checks_the_whole_promise(published: tuple, tmp_path: Path) -> None:
    import shutil

    _, good, _ = published
    cases = {}
    for case in ("stray", "escape", "invariant", "trailer"):
        out = tmp_path / case
        shutil.copytree(good, out)
        meta = json.loads((out / "metadata.json").read_text())
        shard = out / meta["shards"][0]["file"]
        if case == "stray":
            (published_root(out) / "deep" / "er").mkdir(parents=True)
            (published_root(out) / "deep" / "er" / "x.bin").write_bytes(b"?")
        elif case == "escape":
            meta["shards"][0]["file"] = "../" + meta["shards"][0]["file"]
        elif case == "invariant":
            meta["rows_read"] += 1
        else:  # cut the gzip trailer, and make the manifest agree with the cut file
            data = shard.read_bytes()[:-8]
            shard.write_bytes(data)
            meta["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        (out / "metadata.json").write_text(json.dumps(meta))
        cases[case] = "\n".join(verify(str(out)))
    assert "deep/er/x.bin: extra file, not in the manifest" in cases["stray"]
    assert "shard path escapes the bundle's folder" in cases["escape"]
    assert "rows_read == rows_written + rows_rejected (3001 != 3000 + 0)" in cases["invariant"]
    assert "truncated" in cases["trailer"]


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_rebuild_says_so_in_one_line_and_cleans_up(
    published: tuple, sig: int, code: int
) -> None:
    src, out, before = published
    pq.write_table(taxi_table(300_000, seed=6), src / "big.parquet", row_group_size=10_000)
    args = _convert(
        "--source",
        str(src / "*.parquet"),
        "--output",
        str(out),
        "--schema",
        "examples/taxi.yaml",
        "--overwrite",
    )
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Signalled once the rebuild has written its first file in its new version folder (an event:
    # it is converting, not starting), rather than a guessed delay after the folder appears.
    old_versions = {p.name for p in out.glob("v-*")}
    deadline = time.monotonic() + 120
    while not any(f.is_file() for v in out.glob("v-*") if v.name not in old_versions for f in v.rglob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, "the rebuild wrote no file"
        time.sleep(0.005)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    (line,) = err.strip().splitlines()
    assert line.startswith(
        "recordforge convert: interrupted: nothing published; the last published bundle is intact"
    ), line
    # The bundle as it was; the interrupted run's folder is gone, or holds only the pieces it
    # finished (recorded in _pieces/, its parts in a temporary folder) for a rerun to resume.
    after = _snapshot(out)
    left = {Path(f).parts[0] for f in after.keys() - before.keys()}
    assert {f: h for f, h in after.items() if Path(f).parts[0] not in left} == before
    for version in left:
        assert line.endswith(f"the pieces it finished are kept in {version}: the same command "
                             "resumes them (--resume=false starts clean)")  # fmt: skip
        inside = {Path(f).parts[1] for f in after if Path(f).parts[0] == version}
        assert "_pieces" in inside and all(p.startswith("_") for p in inside), inside
    assert len(left) <= 1
    assert not (out / "_recordforge" / "lock").exists()


def test_publishing_the_shards_twice_is_harmless(tmp_path: Path) -> None:
    from recordforge.output.shard_plans import Limits, Part
    from recordforge.records.shard_format import TFRecordFormat
    from recordforge.transforms.rolling import _publish

    tmp = tmp_path / "_tmp-x"
    tmp.mkdir()
    parts = []
    for i in range(3):
        (tmp / f"{i}.part").write_bytes(b"x" * i)
        parts.append(Part(str(tmp / f"{i}.part"), i, i, "sha", (i,)))
    prefix = str(tmp_path / "data")
    limits = Limits(max_bytes=1, max_records=0)  # every part is a shard as it is
    fmt = TFRecordFormat("none")
    first = _publish(b"", parts, [], prefix, fmt, str(tmp), limits)
    again = _publish(b"", parts, [], prefix, fmt, str(tmp), limits)  # a retried step
    assert first == again and not tmp.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"data-0000{i}-of-00003.tfrecord" for i in range(3)]
