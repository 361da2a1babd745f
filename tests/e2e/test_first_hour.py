"""A new user's first mistakes: each ends as one line on stderr, with the right exit code."""

from __future__ import annotations

import gzip
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import recordforge
from recordforge import errors as rf_errors
from recordforge import interrupts
from recordforge.cli import errors as cli_errors
from recordforge.cli import main as cli
from recordforge.errors import (
    CorruptFile,
    DataError,
    Interrupted,
    RecordForgeError,
    SchemaError,
    SourceError,
    TypesChanged,
    UsageError,
)
from recordforge.pipelines.options import check_flags
from recordforge.records.tfrecord import CorruptRecord
from recordforge.schemas import load_schema

COMMANDS = ("convert", "infer-schema", "inspect", "head", "verify", "stats")


def _main(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --- help, version, usage -------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_every_command_has_working_help(capsys: Any, command: str, flag: str) -> None:
    code, out, err = _main(capsys, command, flag)
    assert (code, err) == (0, "")
    assert out.startswith(f"usage: recordforge {command}")
    # A description paragraph follows the usage block.
    assert len(out.split("\n\n")) >= 3


def test_convert_help_documents_every_flag_with_defaults(capsys: Any) -> None:
    code, out, _ = _main(capsys, "convert", "--source", "x", "--help")
    assert code == 0
    for flag in ("--splits", "--split_key", "--split_column", "--split_salt", "--compression"):
        assert flag in out
    assert "~3% from GZIP" in out
    assert "(default: recordforge)" in out  # --split_salt
    assert "(default: None)" not in out
    assert "Apache Beam's pipeline options" in out


@pytest.mark.parametrize("argv", [["--version"], ["version"], ["-V"]])
def test_version(capsys: Any, argv: list[str]) -> None:
    assert _main(capsys, *argv) == (0, f"recordforge {recordforge.__version__}\n", "")


def test_top_level_help_lists_commands(capsys: Any) -> None:
    code, out, _ = _main(capsys, "--help")
    assert code == 0
    assert all(c in out for c in COMMANDS) and "--debug" in out


def test_unknown_command_suggests_the_nearest(capsys: Any) -> None:
    code, out, err = _main(capsys, "conver", "--source", "x")
    assert (code, out) == (2, "")
    assert _one_line(err) == "recordforge: error: unknown command 'conver'; did you mean convert?"


def test_subcommand_usage_error_names_the_subcommand(capsys: Any) -> None:
    code, _, err = _main(capsys, "head")
    assert code == 2
    assert _one_line(err) == (
        "recordforge head: error: the following arguments are required: path (see recordforge head --help)"
    )


# --- flags ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-shards", "2"], "unknown flag --num-shards; did you mean --num_shards?"),
        (["--compresion", "none"], "unknown flag --compresion; did you mean --compression?"),
        (["--output=o", "--shard-size=1MB"], "unknown flag --shard-size; did you mean --shard_size?"),
        (["--num_shards", "two"], "argument --num_shards: invalid int value: 'two'"),
        (
            ["--compression", "zip"],
            "argument --compression: invalid choice: 'zip' (choose from 'gzip', 'zlib', 'none', 'zstd')",
        ),
    ],
)
def test_flag_typos_are_usage_errors(capsys: Any, argv: list[str], message: str) -> None:
    code, out, err = _main(capsys, "convert", "--source", "a.parquet", *argv)
    assert (code, out) == (2, "")
    assert _one_line(err) == f"recordforge convert: error: {message}"


def test_shell_expanded_glob_says_to_quote_it(capsys: Any) -> None:
    code, _, err = _main(capsys, "convert", "--source", "data/a.parquet", "data/b.parquet", "--output", "out")
    assert code == 2
    line = _one_line(err)
    assert line.startswith("recordforge convert: error: unexpected argument(s) data/b.parquet")
    assert "quote it: --source 'data/*.parquet'" in line


@pytest.mark.parametrize(
    "argv",
    [
        ["--source", "a", "--source", "b", "--output", "o", "--num_shards", "2", "--deterministic"],
        ["--source=a", "--output=o", "--if_changed=false", "--splits", "train=8,eval=2"],
        # Beam's own options, as a Dataflow launch passes them.
        ["--runner", "DataflowRunner", "--project", "p", "--region", "europe-west1"],
        ["--temp_location=gs://b/tmp", "--experiments=use_runner_v2", "--no_pipeline_type_check"],
        ["--direct_num_workers", "2", "--direct_running_mode", "multi_processing"],
        [],
    ],
)
def test_check_flags_accepts_ours_and_beams(argv: list[str]) -> None:
    assert check_flags(argv) is None
    assert check_flags(argv) is None  # idempotent: convert.run may check the same argv again


def test_check_flags_raises_usage_error() -> None:
    with pytest.raises(UsageError, match="did you mean --max_rejected"):
        check_flags(["--max-rejected", "3"])
    assert issubclass(UsageError, RecordForgeError)


def test_relative_glob_in_the_current_folder_matches(tmp_path: Any, monkeypatch: Any) -> None:
    from recordforge.transforms.source_types import expand_patterns

    for name in ("part-a.parquet", "part-b.parquet"):
        pq.write_table(pa.table({"x": [1]}), tmp_path / name)
    monkeypatch.chdir(tmp_path)
    expected = [str(tmp_path / "part-a.parquet"), str(tmp_path / "part-b.parquet")]
    assert [f.path for f in expand_patterns(["part-*.parquet"])] == expected
    assert [f.path for f in expand_patterns(["./part-*.parquet", "*.parquet"])] == expected


# --- errors from the library, unwrapped -----------------------------------------------------


def test_every_error_pickles_with_type_and_message() -> None:
    cases: list[BaseException] = [
        RecordForgeError("r"),
        SchemaError("s"),
        SourceError("src"),
        UsageError("u"),
        DataError(file="f.csv", row=3, column="c", reason="bad", value=b"\xff"),
        CorruptRecord("f.tfrecord", 12, "truncated record"),
        CorruptFile("f.tfindex", "line 3: offset over int64"),
        Interrupted(signal.SIGTERM),
        TypesChanged(f"f.csv, row 9, column 'x': {TypesChanged.MARKER}"),
    ]
    public = {getattr(rf_errors, n) for n in rf_errors.__all__}
    assert public <= {type(e) for e in cases}
    for exn in cases:
        back = pickle.loads(pickle.dumps(exn))
        assert type(back) is type(exn)
        assert str(back) == str(exn)
    assert str(cases[4]) == "f.csv, row 3, column 'c': bad (value: b'\\xff')"


@pytest.mark.parametrize(
    ("exn", "line", "code"),
    [
        (
            # What the DirectRunner raises when a worker's DoFn raised a DataError.
            RuntimeError(
                'Traceback (most recent call last):\n  File "x.py", line 1, in f\n'
                "recordforge.errors.DataError: d/a.parquet, row 6, column 'user_id': null in a "
                "feature with `nulls: required` [rule: null] [while running 'ToExamples/Encode']"
            ),
            "d/a.parquet, row 6, column 'user_id': null in a feature with `nulls: required` [rule: null]",
            1,
        ),
        (RuntimeError("x\nrecordforge.errors.UsageError: bad flag"), "bad flag", 2),
        (
            SourceError("a.csv: bad [while running 'Read/ParDo(_ReadCsvFn)']"),
            "a.csv: bad",
            1,
        ),
        (
            SchemaError("invalid schema:\n  s.yaml:2: one\n  s.yaml:5: two"),
            "invalid schema: s.yaml:2: one; s.yaml:5: two",
            1,
        ),
        (PermissionError(13, "Permission denied", "/out/x"), "/out/x: Permission denied", 1),
        (
            pa.ArrowKeyError("Column 'zz' in include_columns does not exist in CSV file"),
            "Column 'zz' in include_columns does not exist in CSV file",
            1,
        ),
        (
            ZeroDivisionError("division by zero"),
            "internal error: ZeroDivisionError: division by zero (run with --debug for the traceback)",
            1,
        ),
    ],
)
def test_describe_turns_any_failure_into_one_line(exn: BaseException, line: str, code: int) -> None:
    assert cli_errors.describe(exn) == (line, code)


def test_describe_finds_the_cause_in_a_chain() -> None:
    try:
        try:
            raise SourceError("in.csv: unreadable")
        except SourceError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as outer:
        assert cli_errors.describe(outer) == ("in.csv: unreadable", 1)


def _boom(argv: list[str]) -> int:
    raise KeyError("no such thing")


def test_internal_error_is_one_line_unless_debug(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(cli, "_head", _boom)
    monkeypatch.delenv("RECORDFORGE_DEBUG", raising=False)
    code, _, err = _main(capsys, "head", "x")
    assert code == 1
    assert _one_line(err) == (
        "recordforge head: error: internal error: KeyError: 'no such thing' "
        "(run with --debug for the traceback)"
    )
    for argv, env in (
        (["head", "x", "--debug"], None),
        (["--debug", "head", "x"], None),
        (["head", "x"], "1"),
    ):
        if env:
            monkeypatch.setenv("RECORDFORGE_DEBUG", env)
        code, _, err = _main(capsys, *argv)
        assert code == 1
        assert err.startswith("Traceback (most recent call last):")
        assert err.splitlines()[-1].startswith("recordforge head: error: internal error: KeyError")


@pytest.fixture
def not_tfrecords(tmp_path: Any) -> list[str]:
    text = tmp_path / "notes.txt"
    text.write_text("features:\n  - name: a\n")
    bad_gzip = tmp_path / "broken.tfrecord.gz"
    bad_gzip.write_bytes(b"\x1f\x8b" + b"not really gzip" * 10)
    truncated = tmp_path / "cut.tfrecord.gz"
    truncated.write_bytes(gzip.compress(b"\x05" * 40)[:-12])
    return [str(text), str(bad_gzip), str(truncated)]


@pytest.mark.parametrize("command", ["head", "inspect", "stats"])
def test_reading_a_file_that_is_not_a_tfrecord(capsys: Any, not_tfrecords: list[str], command: str) -> None:
    for path in not_tfrecords:
        code, _, err = _main(capsys, command, path)
        assert code == 1
        line = _one_line(err)
        if "cut" in path:  # gzip framing intact, its stream cut short
            assert line.startswith(f"recordforge {command}: error: {path}: the gzip stream is truncated")
        else:
            assert line.startswith(f"recordforge {command}: error: {path}: not a TFRecord file ("), line


def test_a_file_that_is_not_a_tfrecord_is_named_for_what_it_is(capsys: Any, tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1]}), tmp_path / "t.parquet")
    (tmp_path / "rows.csv.gz").write_bytes(gzip.compress(b"id,name\n1,a\n"))
    (tmp_path / "notes.txt").write_text("features:\n  - name: a\n")
    found = {
        "t.parquet": "(a Parquet file; ",
        "rows.csv.gz": "(gzip of text, starting 'id,name'; ",
        "notes.txt": "(text, starting 'features:'; ",
    }
    for name, what in found.items():
        code, _, err = _main(capsys, "head", str(tmp_path / name))
        assert code == 1
        assert f"{tmp_path / name}: not a TFRecord file {what}" in _one_line(err)


def test_pattern_matching_nothing_is_named_as_given(capsys: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = _main(capsys, "infer-schema", "nothing-*.csv")
    assert code == 1
    assert _one_line(err) == "recordforge infer-schema: error: input pattern 'nothing-*.csv' matched no files"


def test_missing_file_names_it(capsys: Any, tmp_path: Any) -> None:
    missing = str(tmp_path / "nope.tfrecord")
    code, _, err = _main(capsys, "head", missing)
    assert code == 1
    assert _one_line(err) == f"recordforge head: error: {missing}: No such file or directory"


# --- interruption ---------------------------------------------------------------------------


def _terminated(argv: list[str]) -> int:
    """A command that is sent SIGTERM, then runs on as a conversion does: the handler only
    records the signal, and the command's next safe point raises (recordforge/interrupts.py)."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        interrupts.check()
        time.sleep(0.01)
    return 0


def _ctrl_c(argv: list[str]) -> int:
    raise KeyboardInterrupt


@pytest.mark.parametrize(("fake", "code"), [(_terminated, 143), (_ctrl_c, 130)])
def test_interrupted_convert_says_nothing_was_published(
    capsys: Any, monkeypatch: Any, fake: Any, code: int
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "_convert", fake)
    got, _, err = _main(capsys, "convert", "--source", "x")
    assert got == code
    assert _one_line(err) == (
        "recordforge convert: interrupted: nothing published; the last published bundle is intact"
    )
    assert signal.getsignal(signal.SIGTERM) == before


# --- end to end, as a user runs it -----------------------------------------------------------


def _cli(*args: str, cwd: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RECORDFORGE_DEBUG"}
    return subprocess.run(
        [sys.executable, "-m", "recordforge", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env=env,
    )


def test_bad_row_in_strict_mode_is_one_line(tmp_path: Any) -> None:
    pq.write_table(pa.table({"user_id": [1, 2, 3, None, 5], "x": [1.0] * 5}), tmp_path / "a.parquet")
    schema = tmp_path / "s.yaml"
    schema.write_text(
        yaml.safe_dump(
            {
                "features": [
                    {"name": "user_id", "type": "int64", "nulls": "required"},
                    {"name": "x", "type": "float64", "narrow": True},
                ]
            }
        )
    )
    proc = _cli(
        "convert", "--source", "a.parquet", "--schema", str(schema), "--output", "out", cwd=str(tmp_path)
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert _one_line(proc.stderr) == (
        f"recordforge convert: error: {tmp_path / 'a.parquet'}, row 4, column 'user_id': "
        "null in a feature with `nulls: required` [rule: null]"
    )


def test_relative_glob_converts_from_the_current_folder(tmp_path: Any) -> None:
    for i in range(2):
        pq.write_table(pa.table({"x": [i, i + 10]}), tmp_path / f"part-{i}.parquet")
    proc = _cli("convert", "--source", "part-*.parquet", "--output", "out", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "wrote 4 records in 1 shard to out" in proc.stdout


def test_sigterm_in_a_real_process_is_one_line() -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from recordforge import interrupts
        from recordforge.cli import main as cli

        def convert(argv):  # a safe point every 10 ms, as a conversion's batches are
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(3000):
                interrupts.check()
                time.sleep(0.01)

        cli._convert = convert
        sys.exit(cli.main(["convert", "--source", "x"]))
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 143
    assert _one_line(proc.stderr).startswith("recordforge convert: interrupted: nothing published")


# --- schema mistakes, refused at load time with the YAML line ---------------------------------


@pytest.mark.parametrize(
    ("lines", "problem"),
    [
        (["type: string", "null: required"], "unknown key `null` (did you mean `nulls`?)"),
        (
            ["type: string", "max_length: 1e23"],
            "`max_length` must be an integer from 0 to 2^63-1, not '1e23'",
        ),
        (
            ["type: string", "max_length: 100000000000000000000000"],
            "`max_length` must be an integer from 0 to 2^63-1",
        ),
        (["type: int64", "ops: [{clip: [10, 1]}]"], "op `clip`: low 10 is above high 1"),
        (["type: int64", "ops: [{clip: [0, high]}]"], "op `clip` takes [low, high] (two numbers)"),
        (["type: int64", "min: .nan"], "`min` must be a finite number"),
        (["type: int64", "nulls: default", "default: x"], "default value 'x' is not a valid int64"),
        (
            ["type: string", "regex: '(a)\\1'"],
            "`regex` is not valid RE2 syntax: invalid escape sequence: \\1",
        ),
        (["type: string", "regex: '(?=a)b'"], "`regex` is not valid RE2 syntax: invalid perl operator: (?="),
    ],
)
def test_schema_mistakes_are_refused_with_their_line(tmp_path: Any, lines: list[str], problem: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "features:\n  - name: ok\n    type: int64\n  - name: a\n" + "".join(f"    {x}\n" for x in lines)
    )
    with pytest.raises(SchemaError) as err:
        load_schema(str(path))
    assert f"{path}:4: feature #2 'a': {problem}" in str(err.value)


def test_feature_name_with_a_newline_is_refused() -> None:
    from recordforge.schemas import schema_from_dict

    with pytest.raises(SchemaError, match="'a\\\\nb' is not a valid feature name"):
        schema_from_dict({"features": [{"name": "a\nb", "type": "int64"}]})


def test_yaml_alias_bomb_fails_fast(tmp_path: Any) -> None:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    lines.append("features: [*a8]")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    start = time.perf_counter()
    with pytest.raises(SchemaError, match="expands to more than 100,000 values"):
        load_schema(str(path))
    # Expanded, the aliases are 9**9 values: minutes and gigabytes; refused, well under a second.
    assert time.perf_counter() - start < 10.0


def test_recursive_alias_and_modest_aliases(tmp_path: Any) -> None:
    path = tmp_path / "rec.yaml"
    path.write_text("features: &x [*x]\n")
    with pytest.raises(SchemaError, match="recursive alias"):
        load_schema(str(path))
    # Anchors used as intended still load.
    path.write_text(
        "base: &base {type: int64, nulls: required}\n"
        "features:\n  - {name: a, <<: *base}\n  - {name: b, <<: *base}\n"
    )
    schema = load_schema(str(path))
    assert [(f.name, f.nulls.value) for f in schema.features] == [("a", "required"), ("b", "required")]
