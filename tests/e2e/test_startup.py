"""The tools that run no pipeline start without Beam or TensorFlow (importing Beam alone takes
about 2 s): --version, --help, head, inspect, verify, stats and infer-schema on local files. Start-up times
are measured in docs/performance.md, not asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from demo.sampledata import taxi_table
from recordforge.pipelines.convert import run

_PROBE = """
import sys
from recordforge.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exn:
    code = exn.code
heavy = [m for m in ("apache_beam", "tensorflow", "tensorflow_transform") if m in sys.modules]
print("LOADED", heavy, "CODE", code, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("startup")
    pq.write_table(taxi_table(500, seed=3), root / "t.parquet")
    run(["--source", str(root / "t.parquet"), "--output", str(root / "out")])
    return root / "out"


@pytest.mark.parametrize(
    "command",
    [
        ["--version"],
        ["--help"],
        ["head", "SHARD", "-n", "1"],
        ["inspect", "OUT", "-n", "1"],
        ["verify", "OUT"],
        ["stats", "OUT"],
        ["infer-schema", "SRC"],
    ],
    ids=lambda c: c[0],
)
def test_read_only_commands_do_not_import_beam_or_tensorflow(bundle: Path, command: list[str]) -> None:
    shard = str(next(bundle.glob("v-*/data-*")))
    names = {"SHARD": shard, "OUT": str(bundle), "SRC": str(bundle.parent / "t.parquet")}
    argv = [names.get(a, a) for a in command]
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "LOADED [] CODE 0", proc.stderr[-2000:]


def test_compression_names_are_beams() -> None:
    from apache_beam.io.filesystem import CompressionTypes

    from recordforge.records.tfrecord import Compression

    assert [Compression.beam(c) for c in ("gzip", "zlib", "none")] == [
        CompressionTypes.GZIP,
        CompressionTypes.DEFLATE,
        CompressionTypes.UNCOMPRESSED,
    ]


def test_a_transform_run_prints_no_tensorflow_noise(tmp_path: Path) -> None:
    """TensorFlow, imported for tensorflow-transform, writes C++ start-up lines to descriptor 2
    (CUDA stubs, CPU features, absl's pre-init notice) unless the CLI silences its import."""
    import pyarrow as pa

    pq.write_table(
        pa.table({"word": ["a", "b", "a", "c"] * 50, "x": [1.0, 2.0, 3.0, 4.0] * 50}), tmp_path / "t.parquet"
    )
    (tmp_path / "s.yaml").write_text(
        "features:\n"
        "  - {name: word, type: string, transform: {vocabulary: {}}}\n"
        "  - {name: x, type: float64, narrow: true, transform: {scale_to_z_score: {}}}\n"
    )
    argv = ["--source", str(tmp_path / "t.parquet"), "--schema", str(tmp_path / "s.yaml")]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # a user's shell
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", *argv, "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.startswith("wrote 200 records in 1 shard")
    # The command's process imports Beam lean and freezes its heap (startup.py); what
    # it writes is what the library writes in this test's process, which does neither.
    run([*argv, "--output", str(tmp_path / "lib")])
    for name in ("data-00000-of-00001.tfrecord.gz", "schema.pbtxt", "feature_spec.json"):
        cli_file, lib_file = (next((tmp_path / o).glob(f"v-*/{name}")) for o in ("out", "lib"))
        assert cli_file.read_bytes() == lib_file.read_bytes(), name


_IMPORT_PROBE = """
import gc, json, sys
from recordforge.runners import startup
if sys.argv[1] == "own":
    startup.own_process()
if sys.argv[2] != "checked":
    startup.BEAM_VERSION = "0.0"
with startup.heavy_imports():
    import apache_beam as beam
    from recordforge.pipelines import convert
loaded = [m for m in startup.UNUSED_BY_CONVERSIONS if m in sys.modules]
frozen = gc.get_freeze_count()
import apache_beam.io.gcp.bigquery, apache_beam.io.gcp.pubsub
import pyarrow as pa
# pyarrow behaves as in any process (it gives pandas Timestamps for nanoseconds when it has pandas)
ns = type(pa.scalar(1, pa.timestamp("ns")).as_py()).__name__
pool = pa.default_memory_pool().backend_name
from apache_beam.transforms import userstate
from apache_beam.options.pipeline_options import PipelineOptions
memo = [type(userstate.get_dofn_specs).__name__, type(vars(PipelineOptions)["view_as"]).__name__]
print(json.dumps({"loaded": loaded, "pool": pool, "memo": memo, "frozen": frozen > 0, "gc": gc.isenabled(),
                  "ns": ns,
                  "finders": sum(type(f).__module__ == "recordforge.runners.startup" for f in sys.meta_path),
                  "io": all(hasattr(beam.io, n) for n in ("ReadFromParquet", "WriteToTFRecord"))}))
"""


@pytest.mark.parametrize(
    ("who", "beam", "lean"),
    [("own", "checked", True), ("library", "checked", False), ("own", "other", False)],
    ids=["the-command", "a-library-caller", "another-beam-version"],
)
def test_only_the_commands_own_process_imports_beam_lean_and_freezes(who: str, beam: str, lean: bool) -> None:
    """The command's process imports Beam without the clients a conversion never uses and
    freezes what the import made; a library caller's process, or any other Beam version, gets
    Beam whole and an untouched heap (the freeze is the command's only). Either way the left-out
    modules import normally afterwards, and pyarrow behaves as anywhere. Only the command's
    process, on the Beam version checked, searches each DoFn for its specs once."""
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, who, beam], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    from recordforge.runners.startup import UNUSED_BY_CONVERSIONS

    assert got["loaded"] == ([] if lean else list(UNUSED_BY_CONVERSIONS))
    assert got["frozen"] == (who == "own")
    assert got["gc"] and got["io"] and got["finders"] == 0
    assert got["ns"] == "Timestamp"
    assert (got["pool"] == "system") == (who == "own")
    assert got["memo"] == (["_DofnSpecs", "_Views"] if lean else ["function", "function"])


@pytest.mark.parametrize("given", ["jemalloc", "mimalloc"])
def test_an_arrow_allocator_the_user_names_is_kept(given: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE, "own", "checked"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ARROW_DEFAULT_MEMORY_POOL": given},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["pool"] == given


_FAILING_IMPORT_PROBE = """
import gc, sys
from recordforge.runners import startup
startup.own_process()
try:
    with startup.heavy_imports():
        import apache_beam
        raise KeyboardInterrupt
except KeyboardInterrupt:
    pass
assert gc.isenabled() and not any(type(f).__module__ == "recordforge.runners.startup" for f in sys.meta_path)
class Cycle:
    def __init__(self, path):
        self.me, self.path = self, path
    def __del__(self):
        open(self.path, "w").write("finalized")
Cycle(sys.argv[1])
startup.before_exit()
"""


def test_an_interrupted_import_restores_the_collector_and_exit_finalizes_garbage(tmp_path: Path) -> None:
    """Ctrl-C during the import leaves the collector on and no finder behind; at exit, garbage in
    reference cycles is still finalized before the heap is frozen."""
    flag = tmp_path / "flag"
    proc = subprocess.run(
        [sys.executable, "-c", _FAILING_IMPORT_PROBE, str(flag)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert flag.read_text() == "finalized"


def test_the_command_rejects_rows_with_nanosecond_timestamps_as_the_library_does(tmp_path: Path) -> None:
    """A rejected row's record holds its source values as pyarrow gives them: the command's
    process must give the same as any other (nanoseconds that are not whole microseconds)."""
    import pyarrow as pa

    stamps = pa.array([1_600_000_000_123_456_789 + i for i in range(6)], pa.timestamp("ns"))
    pq.write_table(pa.table({"t": stamps, "x": [1, -1, 2, -2, 3, 4]}), tmp_path / "t.parquet")
    (tmp_path / "s.yaml").write_text(
        "features:\n  - {name: t, type: timestamp, unit: ns}\n  - {name: x, type: int64, min: 0}\n"
    )
    argv = [
        "--source",
        str(tmp_path / "t.parquet"),
        "--schema",
        str(tmp_path / "s.yaml"),
        "--max_rejected",
        "9",
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "recordforge", "convert", *argv, "--output", str(tmp_path / "cli")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run([*argv, "--output", str(tmp_path / "lib")])
    cli, lib = (sorted((tmp_path / o).glob("v-*/_rejected/*")) for o in ("cli", "lib"))
    assert len(cli) == len(lib) > 0
    for cli_file, lib_file in zip(cli, lib, strict=True):
        assert cli_file.read_bytes() == lib_file.read_bytes()
    assert b"123456790" in b"".join(f.read_bytes() for f in cli)  # the nanoseconds are kept


def test_the_installed_beam_version_is_read_without_importing_beam() -> None:
    import apache_beam

    from recordforge.runners.startup import _installed_beam_version

    assert _installed_beam_version() == apache_beam.__version__
