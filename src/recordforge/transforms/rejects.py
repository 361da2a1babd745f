"""The dead-letter output: rejected rows as JSON lines, original values preserved losslessly."""

from __future__ import annotations

import base64
import datetime
import decimal
import functools
import io
import json
import math
from typing import Any

import apache_beam as beam
import pyarrow as pa

from recordforge.conforming.conform import BadRow
from recordforge.files import layout

__all__ = ["decode_value", "encode_value", "rejected_line", "source_record", "WriteRejected"]


def encode_value(value: Any) -> Any:
    """JSON for any Arrow Python value, reversible: bytes as {"base64": ...}, non-finite floats as
    {"float": "nan"}, decimals as {"decimal": "1.50"}, dates and times as ISO 8601 strings."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return {"iso": value.isoformat()}
    if isinstance(value, datetime.timedelta):
        return {"seconds": value.total_seconds()}
    if isinstance(value, list | tuple):
        return [encode_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): encode_value(v) for k, v in value.items()}
    return value


def decode_value(value: Any) -> Any:
    """The inverse of `encode_value` for bytes, floats and decimals (dates stay ISO strings)."""
    if isinstance(value, dict) and len(value) == 1:
        ((tag, raw),) = value.items()
        if tag == "base64":
            return base64.b64decode(raw)
        if tag == "float":
            return float(raw)
        if tag == "decimal":
            return decimal.Decimal(raw)
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: decode_value(v) for k, v in value.items()}
    return value


def source_record(
    batch: pa.RecordBatch, row: int, csv_types: dict[str, pa.DataType] | None
) -> dict[str, Any]:
    """Row `row` of a source batch as a dict. For a CSV batch (`csv_types`: the columns' types),
    a cell of a column Arrow's reader types (integers, dates) that arrives as text
    (read again as text after another cell failed) is typed as Arrow's reader types it where it
    can be, so that a rejected row reads the same whichever pass, range or worker read it."""
    record = batch.slice(row, 1).to_pylist()[0]
    for name, arrow_type in (csv_types or {}).items():
        value = record.get(name)
        # Text, binary, floats, bools and timestamps are text in both passes (all but the first
        # two are parsed later, by the cast): left as they are.
        kinds = (
            pa.types.is_string,
            pa.types.is_binary,
            pa.types.is_floating,
            pa.types.is_boolean,
            pa.types.is_timestamp,
        )
        if isinstance(value, str) and not any(is_kind(arrow_type) for is_kind in kinds):
            record[name] = _csv_cell(value, arrow_type)
    return record


@functools.lru_cache(maxsize=4096)
def _csv_cell(text: str, arrow_type: pa.DataType) -> Any:
    import pyarrow.csv as pacsv

    cell = '"' + text.replace('"', '""') + '"'
    try:
        table = pacsv.read_csv(
            io.BytesIO(f"c\n{cell}\n".encode()),
            convert_options=pacsv.ConvertOptions(column_types={"c": arrow_type}, null_values=[""]),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return text
    return table.column(0)[0].as_py() if table.num_rows == 1 else text


def rejected_line(bad: BadRow, record: dict[str, Any] | None) -> str:
    return json.dumps(
        {
            "file": bad.file,
            "row": bad.row,
            "column": bad.column,
            "rule": bad.rule,
            "reason": bad.reason,
            "value": encode_value(bad.value),
            "record": encode_value(record) if record is not None else None,
        },
        ensure_ascii=False,
        sort_keys=True,
    )


class WriteRejected(beam.PTransform):
    """Writes rejected rows to `{output}/_rejected/rejected-SSSSS-of-NNNNN.jsonl`.

    In: JSON lines from `rejected_line`. Out: the written file names (empty files are removed by
    the bundle step when nothing was rejected)."""

    def __init__(self, output: str) -> None:
        super().__init__()
        self._prefix = layout.rejected_prefix(output)

    def expand(self, lines: beam.PCollection[str]) -> beam.PCollection[str]:
        return lines | "Write" >> beam.io.WriteToText(
            self._prefix, file_name_suffix=layout.REJECTED_SUFFIX, shard_name_template=layout.SHARD_TEMPLATE
        )
