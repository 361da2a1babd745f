"""Value-level conforming: casts to the declared type, vectorised (ops and checks: ops.py)."""
# Design notes: docs/architecture.md, "Module notes".

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recordforge.errors import SourceError
from recordforge.schemas.kinds import DType, ExampleKind
from recordforge.schemas.model import Feature
from recordforge.sources.text_cells import empty_text_to_null, is_binary, is_text, timestamp_parser

__all__ = ["Failure", "cast_values"]

_INT64_MAX = 2**63 - 1
_CONVERSION_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError)
# What Arrow's CSV reader ignores around a number or a date (not around a timestamp or a bool):
# text parsed here, from a CSV cell or a string column, is read the same way.
_BLANKS = " \t"


@dataclass(frozen=True)
class Failure:
    """Values (by index into the flat value array) that broke one rule."""

    indices: np.ndarray
    rule: str
    reason: str


def _valid(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    return pc.is_valid(arr).to_numpy(zero_copy_only=False)


def _null_out(arr: pa.Array, indices: np.ndarray) -> pa.Array:
    if not len(indices):
        return arr
    mask = np.zeros(len(arr), dtype=bool)
    mask[indices] = True
    return pc.if_else(pa.array(mask), pa.scalar(None, arr.type), arr)


def _failing_indices(arr: pa.Array, fn: Callable[[pa.Array], pa.Array]) -> list[tuple[int, str]]:
    """Every element `fn` fails on, by bisection: a few vectorised calls per bad value."""
    out: list[tuple[int, str]] = []

    def visit(part: pa.Array, base: int) -> None:
        try:
            fn(part)
        except _CONVERSION_ERRORS as exn:
            if len(part) == 1:
                out.append((base, str(exn)))
                return
            mid = len(part) // 2
            visit(part.slice(0, mid), base)
            visit(part.slice(mid), base + mid)

    visit(arr, 0)
    return out


def _checked_cast(
    arr: pa.Array, fn: Callable[[pa.Array], pa.Array], rule: str, what: str, failures: list[Failure]
) -> pa.Array:
    """Applies a vectorised conversion; values it refuses are recorded and nulled."""
    try:
        return fn(arr)
    except _CONVERSION_ERRORS:
        pass
    bad = _failing_indices(arr, fn)
    if not bad:  # the whole array failed but no single element does: not a value problem
        return fn(arr)
    idx = np.array([i for i, _ in bad], dtype=np.int64)
    failures.append(Failure(idx, rule, f"{what}: {bad[0][1]}"))
    return fn(_null_out(arr, idx))


def _per_value(
    arr: pa.Array,
    convert: Callable[[object], object],
    out_type: pa.DataType,
    rule: str,
    failures: list[Failure],
) -> pa.Array:
    """A Python conversion per value, for the rare types Arrow cannot convert exactly (decimal)."""
    values: list[object] = []
    bad: list[int] = []
    reasons: list[str] = []
    for i, v in enumerate(arr.to_pylist()):
        if v is None:
            values.append(None)
            continue
        try:
            values.append(convert(v))
        except (ValueError, ArithmeticError, TypeError) as exn:
            values.append(None)
            bad.append(i)
            reasons.append(str(exn))
    if bad:
        failures.append(Failure(np.array(bad, dtype=np.int64), rule, reasons[0]))
    return pa.array(values, out_type)


def _decimal(v: object) -> decimal.Decimal:
    if isinstance(v, decimal.Decimal):
        return v
    if isinstance(v, bytes):
        v = v.decode("utf-8")  # not UTF-8: a UnicodeDecodeError, which is a ValueError
    try:
        return decimal.Decimal(str(v).strip())
    except decimal.InvalidOperation:
        raise ValueError(f"{v!r} is not a decimal number") from None


def _scaled_int(scale: int) -> Callable[[object], int]:
    def convert(v: object) -> int:
        d = _decimal(v)
        if not d.is_finite():
            raise ValueError(f"{v!r} is not a finite decimal")
        scaled = d.scaleb(scale)
        if scaled != scaled.to_integral_value():
            raise ValueError(f"{v} has more than {scale} digits after the point")
        n = int(scaled)
        if not -_INT64_MAX - 1 <= n <= _INT64_MAX:
            raise ValueError(f"{v} scaled by 10^{scale} does not fit int64")
        return n

    return convert


def _decimal_text(v: object) -> bytes:
    d = _decimal(v)
    if not d.is_finite():
        raise ValueError(f"{v!r} is not a finite decimal")
    return str(d).encode()


def _is_inf_word(text: object) -> bool:
    """Whether a text that parsed as infinite says so (`inf`, `-Infinity`), rather than being a
    number beyond the type's range, which Arrow's parser also turns into an infinity."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return str(text).strip(_BLANKS).lstrip("+-").lower() in ("inf", "infinity")


def _narrowed(wide: pa.Array, failures: list[Failure]) -> pa.Array:
    """float64 values as float32; a finite value beyond float32's range fails (rule `range`)."""
    narrow = pc.cast(wide, pa.float32(), safe=False)
    overflow = np.isfinite(wide.to_numpy(zero_copy_only=False)) & ~np.isfinite(
        narrow.to_numpy(zero_copy_only=False)
    )
    if overflow.any():
        idx = np.flatnonzero(overflow)
        failures.append(Failure(idx, "range", "float64 value is outside float32 range"))
        narrow = _null_out(narrow, idx)
    return narrow


def _overflows(arr: pa.Array, out: pa.Array, failures: list[Failure], what: str) -> pa.Array:
    """Nulls and records the values that became infinite without being written as infinite."""
    infinite = np.flatnonzero(np.isinf(out.to_numpy(zero_copy_only=False)))  # a null reads as NaN
    if infinite.size:
        if is_text(arr.type) or is_binary(arr.type):
            texts = arr.take(pa.array(infinite)).to_pylist()
            infinite = infinite[[not _is_inf_word(t) for t in texts]]
        elif pa.types.is_floating(arr.type):  # an infinite source value stays infinite
            infinite = infinite[np.isfinite(arr.take(pa.array(infinite)).to_numpy(zero_copy_only=False))]
        if infinite.size:
            failures.append(Failure(infinite, "range", f"value is outside {what} range"))
            out = _null_out(out, infinite)
    return out


def _times(arr: pa.Array, f: Feature, file: str, failures: list[Failure]) -> pa.Array:
    """Times of day as int64 counts of `unit` since midnight. Text (a CSV cell the typed parse
    did not read) is parsed as the time of 1970-01-01, which reads HH:MM[:SS[.fff]] as Arrow's
    CSV reader does."""
    unit, src = f.unit or "s", arr.type
    what = f"not a time of day in unit {unit}"
    if pa.types.is_integer(src):
        return _checked_cast(arr, lambda a: pc.cast(a, pa.int64()), "type", what, failures)
    if is_text(src):
        # The prefix and separator take the column's own string type (large_string from Polars).
        day = pc.binary_join_element_wise(pa.scalar("1970-01-01 ", src), arr, pa.scalar("", src))
        found: list[Failure] = []
        ts = _checked_cast(day, lambda a: pc.cast(a, pa.timestamp(unit)), "type", what, found)
        failures.extend(Failure(x.indices, x.rule, x.reason.replace("'1970-01-01 ", "'")) for x in found)
        return pc.cast(ts, pa.int64())
    if not pa.types.is_time(src):
        raise SourceError(
            f"{file}: column {f.source_column!r} of type {src} cannot hold feature {f.name!r} (time)"
        )
    target = pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit)
    times = _checked_cast(arr, lambda a: pc.cast(a, target), "type", what, failures)
    return pc.cast(pc.cast(times, pa.int32() if unit in ("s", "ms") else pa.int64()), pa.int64())


def cast_values(arr: pa.Array, f: Feature, file: str) -> tuple[pa.Array, list[Failure]]:
    """Casts source values to the feature's value type (float64 stays float64 for `encode:
    bytes`). A column whose type can never hold the feature raises SourceError.

    Numbers and dates in text (a CSV cell, a string column) are parsed as Arrow's CSV reader
    parses them, blanks around them included, so that a CSV value reads the same whichever way
    its block was read; a number beyond its type's range fails (rule `range`) rather than
    becoming infinite."""
    failures: list[Failure] = []
    src = arr.type
    column = f.source_column
    text = is_text(src)
    dated = pa.types.is_date(src) or pa.types.is_timestamp(src)

    def cast(target: pa.DataType, trim: bool) -> Callable[[pa.Array], pa.Array]:
        def fn(a: pa.Array) -> pa.Array:
            try:
                try:
                    return pc.cast(a, target)
                except pa.ArrowInvalid:
                    if not trim:
                        raise
                    return pc.cast(pc.utf8_trim(a, _BLANKS), target)
            except pa.ArrowNotImplementedError as exn:
                raise SourceError(
                    f"{file}: column {column!r} of type {src} cannot hold feature {f.name!r} "
                    f"({f.dtype.value}): {exn}"
                ) from exn

        return fn

    def conv(a: pa.Array, target: pa.DataType, what: str, rule: str = "type", trim: bool = False) -> pa.Array:
        return _checked_cast(a, cast(target, trim and is_text(a.type)), rule, what, failures)

    def floats(target: pa.DataType, what: str) -> pa.Array:
        return _overflows(arr, conv(arr, target, f"not a valid {what}", trim=True), failures, what)

    dt = f.dtype
    if dated and f.value_kind is ExampleKind.FLOAT:
        raise SourceError(
            f"{file}: column {column!r} holds {src} values but feature {f.name!r} is {dt.value}; "
            "declare it `type: date` or `type: timestamp` (written as int64), or `type: int64`"
        )
    if dt is DType.FLOAT32 and pa.types.is_float64(src):
        if not f.narrow:
            raise SourceError(
                f"{file}: column {column!r} is float64 but feature {f.name!r} is float32; add "
                "`narrow: true` (float32, a value beyond its range is a bad row), or declare "
                "`type: float64` with `encode: bytes` (exact)"
            )
        return _narrowed(arr, failures), failures
    if dt is DType.FLOAT64:
        wide = floats(pa.float64(), "float64") if text else conv(arr, pa.float64(), "not a float64")
        return (wide if f.float64_bytes else _narrowed(wide, failures)), failures
    if dt is DType.BOOL:
        if pa.types.is_integer(src):
            ok = pc.is_in(arr, pa.array([0, 1], src)).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(~ok & _valid(arr))
            if bad.size:
                failures.append(Failure(bad, "type", "a bool must be 0 or 1"))
                arr = _null_out(arr, bad)
        elif not pa.types.is_boolean(src):
            arr = conv(arr, pa.bool_(), "not a bool")
        return pc.cast(arr, pa.int64()), failures
    if dt in (DType.STRING, DType.BYTES) and dated:
        arr = pc.cast(arr, pa.large_string())  # ISO 8601, as Arrow writes it
    if dt is DType.STRING:
        if not (pa.types.is_string(src) or pa.types.is_large_string(src)):
            if pa.types.is_fixed_size_binary(src):
                arr = pc.cast(arr, pa.binary())
            arr = conv(arr, pa.large_string(), "not valid UTF-8", rule="utf8")
        return pc.cast(arr, pa.large_binary()), failures
    if dt is DType.BYTES:
        if pa.types.is_fixed_size_binary(src):
            arr = pc.cast(arr, pa.binary())
        return conv(arr, pa.large_binary(), "not bytes"), failures
    if dt is DType.TIMESTAMP:
        if pa.types.is_integer(src):
            return conv(arr, pa.int64(), "not an int64 epoch"), failures
        if pa.types.is_date(src):
            arr = pc.cast(arr, pa.timestamp("s"))
        unit = f.unit or "s"  # as in _times: feature_checks gives every timestamp a unit
        what = f"not a timestamp in unit {unit}"
        if text:
            ts = _checked_cast(arr, timestamp_parser(unit), "type", what, failures)
        else:
            ts = conv(arr, pa.timestamp(unit), what)
        return pc.cast(ts, pa.int64()), failures
    if dt is DType.TIME:
        return _times(arr, f, file, failures), failures
    if dt is DType.DATE or (dt is DType.INT64 and pa.types.is_date(src)):
        # An int64 feature of a date column holds what `type: date` writes: days since 1970-01-01.
        if pa.types.is_integer(src):
            return conv(arr, pa.int64(), "not an int64 day count"), failures
        if pa.types.is_timestamp(src):
            day = pc.cast(pc.cast(pc.floor_temporal(arr, unit="day"), pa.timestamp("s")), pa.int64())
            secs = pc.cast(pc.cast(arr, pa.timestamp("s"), safe=False), pa.int64())
            partial = np.flatnonzero(
                _valid(arr) & (day.to_numpy(zero_copy_only=False) != secs.to_numpy(zero_copy_only=False))
            )
            if partial.size:
                failures.append(Failure(partial, "type", "a timestamp with a time of day is not a date"))
                arr = _null_out(arr, partial)
        days = conv(arr, pa.date32(), "not a date", trim=True)
        return pc.cast(pc.cast(days, pa.int32()), pa.int64()), failures
    if dt is DType.INT64 and pa.types.is_timestamp(src):
        # What `type: timestamp` writes with the column's own unit: its count since the epoch.
        return pc.cast(arr, pa.int64()), failures
    if dt is DType.DECIMAL:
        # An empty text is a null decimal, as an empty CSV cell of any other number is.
        arr = empty_text_to_null(arr)
        if f.decimal_as == "scaled_int":
            return _per_value(arr, _scaled_int(f.scale or 0), pa.int64(), "type", failures), failures
        return _per_value(arr, _decimal_text, pa.large_binary(), "type", failures), failures
    if dt is DType.FLOAT32:
        if text:
            return floats(pa.float32(), "float32"), failures
        return _overflows(arr, conv(arr, pa.float32(), "not a valid float32"), failures, "float32"), failures
    # INT64: safe casts refuse fractions and overflow.
    return conv(arr, pa.int64(), "not a valid int64", trim=True), failures
