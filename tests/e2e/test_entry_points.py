"""Every entry point (the CLI, main.py, run(), recordforge.convert(), add_conversion) goes through
one resolve: each refuses a misspelt flag, and each reports a bad row as RecordForge's own error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import recordforge
from recordforge.cli import main as cli
from recordforge.errors import DataError, UsageError
from recordforge.pipelines.convert import run

_ROOT = Path(__file__).resolve().parents[2]


def _table(tmp_path: Path) -> str:
    path = tmp_path / "in" / "t.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"x": pa.array([1, 2, 3, None, 5], pa.int64())}), path)
    return str(path)


def _schema(tmp_path: Path) -> str:
    path = tmp_path / "schema.yaml"
    path.write_text(yaml.safe_dump({"features": [{"name": "x", "type": "int64", "nulls": "required"}]}))
    return str(path)


def test_the_cli_refuses_a_misspelt_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    code = cli.main(["convert", "--source", _table(tmp_path), "--output", str(out), "--num_shard", "2"])
    assert code == 2
    assert "unknown flag --num_shard; did you mean --num_shards?" in capsys.readouterr().err
    assert not out.exists()


def test_the_flex_template_entry_refuses_a_misspelt_flag(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(_ROOT / "main.py"),
            f"--source={_table(tmp_path)}",
            f"--output={out}",
            "--num_shard=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0
    assert "UsageError: unknown flag --num_shard; did you mean --num_shards?" in done.stderr
    assert not out.exists()


def test_run_refuses_a_misspelt_flag(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(UsageError, match="unknown flag --num_shard; did you mean --num_shards"):
        run(["--source", _table(tmp_path), "--output", str(out), "--num_shard", "2"])
    assert not out.exists()


def test_convert_refuses_a_misspelt_flag_and_a_value_of_the_wrong_type(tmp_path: Path) -> None:
    source, out = _table(tmp_path), str(tmp_path / "out")
    with pytest.raises(UsageError, match="unknown option num_shard; did you mean num_shards"):
        recordforge.convert(source, out, num_shard=2)
    with pytest.raises(UsageError, match=r"num_shards='2': expected int"):
        recordforge.convert(source, out, num_shards="2")
    with pytest.raises(UsageError, match=r"deterministic=1: expected bool"):
        recordforge.convert(source, out, deterministic=1)
    with pytest.raises(UsageError, match=r"compression='zip': expected one of"):
        recordforge.convert(source, out, compression="zip")
    assert not Path(out).exists()


def test_add_conversion_refuses_a_misspelt_flag_and_beam_options(tmp_path: Path) -> None:
    source, out = _table(tmp_path), str(tmp_path / "out")
    with pytest.raises(UsageError, match="unknown option num_shard; did you mean num_shards"):
        recordforge.add_conversion(beam.Pipeline(), source, out, num_shard=2)
    with pytest.raises(UsageError, match="direct_num_workers is a Beam pipeline option"):
        recordforge.add_conversion(beam.Pipeline(), source, out, direct_num_workers=2)
    assert not Path(out).exists()


def test_a_bad_row_from_convert_is_a_data_error_with_the_clis_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, schema = _table(tmp_path), _schema(tmp_path)
    with pytest.raises(DataError) as raised:
        recordforge.convert(source, str(tmp_path / "a"), schema)
    error = raised.value
    assert (error.file, error.row, error.column) == (source, 4, "x")
    assert str(error).startswith(f"{source}, row 4, column 'x': ")
    code = cli.main(["convert", "--source", source, "--output", str(tmp_path / "b"), "--schema", schema])
    assert code == 1
    assert capsys.readouterr().err.strip() == f"recordforge convert: error: {error}"
    assert not (tmp_path / "a" / "metadata.json").exists() and not (tmp_path / "b" / "metadata.json").exists()


def test_the_cli_prints_the_folder_a_span_resolved_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for day in ("01", "02"):
        folder = tmp_path / "in" / "2024" / "03" / day
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": [1, 2]}), folder / "a.parquet")
    pattern = str(tmp_path / "in" / "{YYYY}" / "{MM}" / "{DD}" / "*.parquet")
    output = str(tmp_path / "out" / "{YYYY}-{MM}-{DD}")
    assert cli.main(["convert", "--source", pattern, "--output", output]) == 0
    printed = capsys.readouterr().out
    resolved = str(tmp_path / "out" / "2024-03-02")
    assert f"to {resolved}\n" in printed and f"recordforge.read({resolved!r})" in printed
    assert "{YYYY}" not in printed
    assert (Path(resolved) / "metadata.json").exists()
