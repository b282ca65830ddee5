"""The ``datagen`` connector: a source of generated rows (Flink's and RisingWave's ``datagen``).

It reads nothing: every value is a pure function of the options, the partition and the row's
index, so a run is reproducible and a checkpoint is a row counter per partition.

Rows and partitions
    The source has ``partitions`` watermark partitions, named ``p0`` … ``p{N-1}``. Partition
    ``p`` holds the source's **global rows** ``g = i·N + p`` (``i`` = the row's index in its
    partition, 0, 1, 2, …): the partitions interleave one row sequence, as Flink's and
    RisingWave's parallel sequence generators do. ``number_of_rows`` and the end of a bounded
    sequence count global rows, so partition ``p`` has ``⌈(L - p) / N⌉`` rows of ``L``.

Columns (``fields.<column>.*``)
    * ``sequence`` numbers: ``start + g·step`` (integers, floats, or the integer's decimal text
      for a string column); the source ends at ``end`` (inclusive) or, for integers, where the
      column's type would overflow.
    * ``sequence`` timestamps (event time): ``start + g·interval - jitter(p, i)``, ``jitter``
      uniform in ``[0, max_out_of_orderness]``. Every row of a partition is then at most
      ``max_out_of_orderness`` behind the rows before it, so ``WATERMARK FOR t AS t - B`` with
      ``B ≥ max_out_of_orderness`` makes no row late.
    * ``random`` integers and timestamps (uniform in ``[min, max]``), floats (uniform in
      ``[min, max]``), booleans, strings (``length`` characters of ``[0-9A-Za-z]``).

    Random values, the jitter and the nulls (``null_rate``) of row ``i`` of partition ``p`` are
    words of a counter-based generator (numpy's Philox, its raw 64-bit output) keyed by
    ``(seed, column name, p, purpose)`` at counter ``i``: the same in every run, whatever the
    batch boundaries and wherever a run was restored. (Sequence values depend on ``g`` only, so
    they are also the same for any ``partitions``; random values depend on ``p``.)

Rate
    ``rows_per_second`` is the rate of the whole source: by ``t`` seconds after :meth:`open`, the
    global rows below ``R₀ + ⌊t · rows_per_second⌋`` are due (``R₀`` = rows handed out before a
    restore), so each partition gets ``rows_per_second / N``. A poll hands out the rows due,
    in batches of at most ``batch_rows``, round-robin over the partitions.

Checkpoints
    :meth:`DatagenSource.snapshot` is ``{"next_row": {partition: next row index}}``; a source
    opened with it goes on from there and hands out the same rows a straight run would.

Errors: :class:`~flight_serve.errors.ConnectorOptionError` naming the option for every bad
option value; :class:`~flight_serve.errors.ConnectorError` for a resume state that does not fit.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import sqlglot
from sqlglot import exp

from flight_serve.connectors.flight import SourceEvent
from flight_serve.connectors.options import DATAGEN_OPTION_ALIASES, DATAGEN_SOURCE_OPTIONS
from flight_serve.errors import ConnectorError, ConnectorOptionError
from flight_serve.types import NS_PER_UNIT, datetime_to_ns

__all__ = [
    "COLUMN_OPTIONS",
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_ROWS_PER_SECOND",
    "OPTION_ALIASES",
    "SOURCE_OPTIONS",
    "DatagenColumn",
    "DatagenOptions",
    "DatagenSource",
    "generate_rows",
]

#: Rows per batch without ``batch_rows``.
DEFAULT_BATCH_ROWS: Final = 8192
#: The source's rate without ``rows_per_second`` (Flink's default).
DEFAULT_ROWS_PER_SECOND: Final = 10_000.0
#: Characters of a random string without ``length`` (RisingWave's default).
DEFAULT_STRING_LENGTH: Final = 10
_MAX_PARTITIONS: Final = 4096
_MAX_STRING_LENGTH: Final = 1 << 16

#: The source's options (``fields.<column>.<option>`` aside), with their Flink / RisingWave
#: spellings accepted as aliases; in :mod:`.options`, which the registry reads without this module.
SOURCE_OPTIONS: Final = DATAGEN_SOURCE_OPTIONS
OPTION_ALIASES: Final = DATAGEN_OPTION_ALIASES
_ALIASES: Final = OPTION_ALIASES
#: The options of one column, ``fields.<column>.<option>``.
COLUMN_OPTIONS: Final = (
    "kind",
    "type",
    "start",
    "end",
    "step",
    "interval",
    "max_out_of_orderness",
    "min",
    "max",
    "length",
    "null_rate",
    "seed",
)
_COLUMN_ALIASES: Final = {"null-rate": "null_rate", "max-out-of-orderness": "max_out_of_orderness"}

ColumnKind = Literal["sequence", "random"]
_ColumnClass = Literal["int", "float", "bool", "string", "timestamp"]

_WORDS: Final = {"int": "integer", "float": "float", "string": "string", "timestamp": "timestamp"}
_INT_TYPES: Final[dict[pa.DataType, int]] = {
    pa.int8(): 8,
    pa.int16(): 16,
    pa.int32(): 32,
    pa.int64(): 64,
}
_U64: Final = 1 << 64
_M32: Final = np.uint64(0xFFFFFFFF)
_ALPHABET: Final = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_TRANSLATE: Final = _ALPHABET + bytes(256 - len(_ALPHABET))  # index byte → its character
# what the words of a row's generator are used for (a part of the Philox key)
_VALUES, _NULLS, _JITTER = 0, 1, 2

U64Array = npt.NDArray[np.uint64]
I64Array = npt.NDArray[np.int64]


def _class_of(data_type: pa.DataType) -> _ColumnClass | None:
    if data_type in _INT_TYPES:
        return "int"
    if pa.types.is_floating(data_type) and data_type != pa.float16():
        return "float"
    if pa.types.is_boolean(data_type):
        return "bool"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    if pa.types.is_timestamp(data_type):
        return "timestamp"
    return None


@dataclass(frozen=True)
class DatagenColumn:
    """How one column is generated (parsed from its ``fields.<column>.*`` options).

    Numbers are in the column's own terms: integers and floats as written; a timestamp's
    ``start``, ``end``, ``minimum``, ``maximum``, ``step`` (its ``interval``) and ``jitter`` (its
    ``max_out_of_orderness``) are integers in the column's unit (``s``, ``ms``, ``us``, ``ns``)
    since the Unix epoch.

    Attributes:
        name: the column.
        type: its Arrow type.
        kind: ``sequence`` or ``random``.
        start: a sequence's first value (global row 0).
        end: a sequence's last value, inclusive (``None``: unbounded, integers up to the type's
            limit).
        step: a sequence's difference between global rows ``g`` and ``g + 1`` (never 0).
        minimum: the least random value (inclusive).
        maximum: the greatest random value (inclusive).
        length: a random string's characters.
        jitter: a timestamp sequence's greatest out-of-orderness (subtracted, ≥ 0).
        null_rate: the probability that a value is null, in ``[0, 1]``.
        seed: the seed of its random values (the source's ``seed`` unless set).
    """

    name: str
    type: pa.DataType
    kind: ColumnKind
    start: int | float = 0
    end: int | float | None = None
    step: int | float = 1
    minimum: int | float = 0
    maximum: int | float = 0
    length: int = DEFAULT_STRING_LENGTH
    jitter: int = 0
    null_rate: float = 0.0
    seed: int = 0

    @property
    def rows(self) -> int | None:
        """How many global rows this column allows (a bounded sequence), or ``None``."""
        if self.kind != "sequence":
            return None
        end = self.end
        if end is None:
            if self.type not in _INT_TYPES and not pa.types.is_string(self.type):
                return None
            bits = _INT_TYPES.get(self.type, 64)
            end = (1 << (bits - 1)) - 1 if self.step > 0 else -(1 << (bits - 1))
        if isinstance(self.step, int) and isinstance(self.start, int) and isinstance(end, int):
            return (end - self.start) // self.step + 1
        span = (float(end) - float(self.start)) / float(self.step)
        return math.floor(span + 1e-9 * max(1.0, abs(span))) + 1


def _nearest(name: str, names: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _integer(option: str, text: str, *, least: int | None = None) -> int:
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise ConnectorOptionError(option, f"expected an integer, got {text!r}") from None
    if least is not None and value < least:
        raise ConnectorOptionError(option, f"must be at least {least}, got {value}")
    return value


def _number(option: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ConnectorOptionError(option, f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ConnectorOptionError(option, f"expected a finite number, got {text!r}")
    return value


_DURATION_UNITS: Final = {
    "ns": 1,
    "nanosecond": 1,
    "us": 1_000,
    "microsecond": 1_000,
    "ms": 1_000_000,
    "millisecond": 1_000_000,
    "s": 1_000_000_000,
    "second": 1_000_000_000,
    "m": 60_000_000_000,
    "min": 60_000_000_000,
    "minute": 60_000_000_000,
    "h": 3_600_000_000_000,
    "hour": 3_600_000_000_000,
    "d": 86_400_000_000_000,
    "day": 86_400_000_000_000,
    "w": 604_800_000_000_000,
    "week": 604_800_000_000_000,
}


def _duration_ns(option: str, text: str) -> int:
    """``'250ms'``, ``'2 seconds'`` or ``INTERVAL '2' SECOND`` → nanoseconds (the pipeline
    language's duration syntax, kept to the nanosecond)."""
    stripped = text.strip()
    if stripped.upper().startswith("INTERVAL"):
        try:
            node = sqlglot.parse_one(stripped, dialect="risingwave")
        except sqlglot.errors.ParseError:
            node = None
        if isinstance(node, exp.Interval) and node.this is not None:
            unit = node.args.get("unit")
            stripped = f"{node.this.name} {unit.name if unit is not None else ''}"
    digits = len(stripped) - len(stripped.lstrip("0123456789"))
    number, unit_text = stripped[:digits], stripped[digits:].strip().lower()
    unit_ns = _DURATION_UNITS.get(unit_text)
    if unit_ns is None and unit_text.endswith("s"):
        unit_ns = _DURATION_UNITS.get(unit_text[:-1])
    if not number or unit_ns is None:
        raise ConnectorOptionError(
            option, f"cannot read duration {text!r}: write an integer and a unit, such as '30s'"
        )
    return int(number) * unit_ns


def _instant_ns(option: str, text: str) -> int:
    """An ISO 8601 instant (naive = UTC) → nanoseconds since the epoch (to the microsecond)."""
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ConnectorOptionError(
            option, f"cannot read instant {text!r}: write ISO 8601, such as '2026-01-01T00:00:00Z'"
        ) from None
    return datetime_to_ns(value if value.tzinfo is not None else value.replace(tzinfo=UTC))


def _in_unit(option: str, value_ns: int, data_type: pa.TimestampType) -> int:
    per = NS_PER_UNIT[data_type.unit]
    if value_ns % per:
        raise ConnectorOptionError(
            option, f"{value_ns} ns is finer than the column's unit ({data_type.unit})"
        )
    return value_ns // per


_SQL_TYPES: Final[dict[Any, pa.DataType]] = {
    exp.DataType.Type.BOOLEAN: pa.bool_(),
    exp.DataType.Type.TINYINT: pa.int8(),
    exp.DataType.Type.SMALLINT: pa.int16(),
    exp.DataType.Type.INT: pa.int32(),
    exp.DataType.Type.BIGINT: pa.int64(),
    exp.DataType.Type.FLOAT: pa.float32(),
    exp.DataType.Type.DOUBLE: pa.float64(),
    exp.DataType.Type.VARCHAR: pa.string(),
    exp.DataType.Type.TEXT: pa.string(),
    exp.DataType.Type.CHAR: pa.string(),
}


def _sql_type(option: str, text: str) -> pa.DataType:
    """A SQL type name of ``fields.<column>.type`` (BIGINT, DOUBLE, VARCHAR, BOOLEAN,
    TIMESTAMP(3), TIMESTAMPTZ …) → its Arrow type, as in a pipeline's column list."""
    try:
        node = exp.DataType.build(text.strip(), dialect="risingwave")
    except (sqlglot.errors.ParseError, ValueError):
        node = None
    known = "BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, REAL, DOUBLE, VARCHAR, TIMESTAMP(p), TIMESTAMPTZ(p)"
    if node is None:
        raise ConnectorOptionError(option, f"unknown type {text!r}; datagen types: {known}")
    if node.this in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ):
        params = node.expressions
        precision = int(params[0].name) if params else 6
        if not 0 <= precision <= 9:
            raise ConnectorOptionError(
                option, f"timestamp precision must be 0 to 9, got {precision}"
            )
        unit: Literal["s", "ms", "us", "ns"] = (
            "s" if precision == 0 else "ms" if precision <= 3 else "us" if precision <= 6 else "ns"
        )
        if node.this == exp.DataType.Type.TIMESTAMPTZ:
            return pa.timestamp(unit, "UTC")
        return pa.timestamp(unit)
    arrow = _SQL_TYPES.get(node.this)
    if arrow is None:
        raise ConnectorOptionError(option, f"unknown type {text!r}; datagen types: {known}")
    return arrow


def _column(
    name: str,
    data_type: pa.DataType,
    given: dict[str, str],
    seed: int,
    written: Mapping[str, str] | None = None,
) -> DatagenColumn:
    """One column's generator from its ``fields.<name>.*`` options (``given``: by option;
    ``written``: the key each was given as, for errors)."""

    def key(option: str) -> str:
        return (written or {}).get(option, f"fields.{name}.{option}")

    cls = _class_of(data_type)
    if cls is None:
        raise ConnectorOptionError(
            key("kind"),
            f"column {name} has type {data_type}, which datagen cannot generate (it generates "
            "integers, floats, booleans, strings and timestamps)",
        )
    default_kind: ColumnKind = "sequence" if cls == "timestamp" else "random"
    kind_text = given.get("kind", default_kind).strip().lower()
    if kind_text not in ("sequence", "random"):
        raise ConnectorOptionError(
            key("kind"), f"expected 'sequence' or 'random', got {given['kind']!r}"
        )
    kind: ColumnKind = "sequence" if kind_text == "sequence" else "random"
    if kind == "sequence" and cls == "bool":
        raise ConnectorOptionError(key("kind"), f"column {name} is boolean: only 'random'")
    allowed = {"kind", "type", "null_rate", "seed"}
    if kind == "sequence":
        allowed |= {"start", "end"} | (
            {"interval", "max_out_of_orderness"} if cls == "timestamp" else {"step"}
        )
    elif cls == "string":
        allowed |= {"length"}
    elif cls != "bool":
        allowed |= {"min", "max"}
    for option in given:
        if option not in allowed:
            what = "boolean" if cls == "bool" else f"{kind} {_WORDS[cls]}"
            raise ConnectorOptionError(
                key(option),
                f"does not apply to a {what} column; its options: {', '.join(sorted(allowed))}",
            )
    null_rate = 0.0
    if "null_rate" in given:
        null_rate = _number(key("null_rate"), given["null_rate"])
        if not 0.0 <= null_rate <= 1.0:
            raise ConnectorOptionError(
                key("null_rate"), f"must be between 0 and 1, got {null_rate}"
            )
    column_seed = _integer(key("seed"), given["seed"], least=0) if "seed" in given else seed
    base = DatagenColumn(name, data_type, kind, null_rate=null_rate, seed=column_seed)

    if cls == "timestamp":
        assert isinstance(data_type, pa.TimestampType)
        return _timestamp_column(base, data_type, given, key)
    if cls == "bool":
        return base
    if kind == "random":
        if cls == "string":
            length = DEFAULT_STRING_LENGTH
            if "length" in given:
                length = _integer(key("length"), given["length"], least=0)
                if length > _MAX_STRING_LENGTH:
                    raise ConnectorOptionError(
                        key("length"), f"must be at most {_MAX_STRING_LENGTH}, got {length}"
                    )
            return _replace(base, length=length)
        if cls == "int":
            bits = _INT_TYPES[data_type]
            low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
            lo = _integer(key("min"), given["min"]) if "min" in given else low
            hi = _integer(key("max"), given["max"]) if "max" in given else high
            for option, value in (("min", lo), ("max", hi)):
                if not low <= value <= high:
                    raise ConnectorOptionError(
                        key(option),
                        f"{value} is outside the range of {data_type} ({low} to {high})",
                    )
            flo: int | float = lo
            fhi: int | float = hi
        else:
            flo = _number(key("min"), given["min"]) if "min" in given else 0.0
            fhi = _number(key("max"), given["max"]) if "max" in given else 1.0
        if flo > fhi:
            raise ConnectorOptionError(key("min"), f"min ({flo}) is greater than max ({fhi})")
        return _replace(base, minimum=flo, maximum=fhi)

    # a numeric (or numeric-text) sequence
    integral = cls in ("int", "string")
    read: Callable[[str, str], int | float] = _integer if integral else _number
    start = read(key("start"), given["start"]) if "start" in given else 0
    step = read(key("step"), given["step"]) if "step" in given else 1
    end = read(key("end"), given["end"]) if "end" in given else None
    if step == 0:
        raise ConnectorOptionError(key("step"), "must not be 0")
    if cls in ("int", "string"):  # a string sequence counts in int64
        bits = _INT_TYPES.get(data_type, 64)
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        counted = data_type if cls == "int" else pa.int64()
        for option, bound in (("start", start), ("end", end)):
            if bound is not None and not low <= bound <= high:
                raise ConnectorOptionError(
                    key(option), f"{bound} is outside the range of {counted} ({low} to {high})"
                )
    if end is not None and (end - start) * step < 0:
        relation = "greater" if step > 0 else "less"
        raise ConnectorOptionError(
            key("start"), f"start ({start}) is {relation} than end ({end}) with step {step}"
        )
    return _replace(base, start=start, end=end, step=step)


def _timestamp_column(
    base: DatagenColumn,
    data_type: pa.TimestampType,
    given: dict[str, str],
    key: Callable[[str], str],
) -> DatagenColumn:
    if base.kind == "random":
        for option in ("min", "max"):
            if option not in given:
                raise ConnectorOptionError(
                    key(option), "a random timestamp needs min and max (ISO 8601 instants)"
                )
        lo = _in_unit(key("min"), _instant_ns(key("min"), given["min"]), data_type)
        hi = _in_unit(key("max"), _instant_ns(key("max"), given["max"]), data_type)
        if lo > hi:
            raise ConnectorOptionError(
                key("min"), f"min ({given['min']}) is later than max ({given['max']})"
            )
        return _replace(base, minimum=lo, maximum=hi)
    start = (
        _in_unit(key("start"), _instant_ns(key("start"), given["start"]), data_type)
        if "start" in given
        else 0
    )
    interval = 0
    if "interval" in given:
        interval = _in_unit(
            key("interval"), _duration_ns(key("interval"), given["interval"]), data_type
        )
        if interval <= 0:
            raise ConnectorOptionError(key("interval"), "must be longer than 0")
    jitter = 0
    if "max_out_of_orderness" in given:
        option = key("max_out_of_orderness")
        jitter = _in_unit(option, _duration_ns(option, given["max_out_of_orderness"]), data_type)
    end = None
    if "end" in given:
        end = _in_unit(key("end"), _instant_ns(key("end"), given["end"]), data_type)
        if end < start:
            raise ConnectorOptionError(
                key("start"),
                f"start ({given.get('start', '1970-01-01T00:00:00Z')}) is later "
                f"than end ({given['end']})",
            )
    # interval 0: "follow the rate" (set by DatagenOptions, which knows rows_per_second)
    return _replace(base, start=start, end=end, step=interval, jitter=jitter)


def _replace(column: DatagenColumn, **changes: Any) -> DatagenColumn:
    from dataclasses import replace

    return replace(column, **changes)


@dataclass(frozen=True)
class DatagenOptions:
    """The options of a ``datagen`` source (see docs/pipelines.md, "datagen").

    Attributes:
        schema: the generated columns, in order.
        columns: how each column is generated, in ``schema`` order.
        rows_per_second: the source's total rate (all partitions), or ``None`` for no limit.
        number_of_rows: global rows to generate, or ``None`` (unbounded unless a sequence ends).
        partitions: watermark partitions, named ``p0`` … ``p{N-1}``.
        batch_rows: the most rows of one batch.
        seed: the seed of random values (each column's unless it sets its own).
    """

    schema: pa.Schema
    columns: tuple[DatagenColumn, ...]
    rows_per_second: float | None = DEFAULT_ROWS_PER_SECOND
    number_of_rows: int | None = None
    partitions: int = 1
    batch_rows: int = DEFAULT_BATCH_ROWS
    seed: int = 0

    @classmethod
    def from_options(
        cls, options: Mapping[str, str], schema: pa.Schema | None = None
    ) -> DatagenOptions:
        """Parse a ``datagen`` source's ``WITH`` options.

        Args:
            options: option → value text. Keys are matched without regard to case (a SQL
                parser lower-cases them); a column in ``fields.<column>.<option>`` is matched
                exactly first, then without regard to case.
            schema: the declared columns, or ``None`` to take them from
                ``fields.<column>.type`` (in the order they first appear).

        Raises:
            ConnectorOptionError: an unknown option or column, a value that does not parse or is
                out of range (a rate ≤ 0, min > max, an unknown type …); its ``option`` is the
                key as given.
        """
        top: dict[str, tuple[str, str]] = {}  # canonical → (key as given, value)
        per_column: dict[str, dict[str, str]] = {}  # column as given → option → value
        written: dict[tuple[str, str], str] = {}  # (column, option) → key as given
        for raw_key, value in options.items():
            lowered = raw_key.strip().lower()
            if lowered.startswith("fields."):
                column, dot, option = raw_key.strip()[len("fields.") :].rpartition(".")
                option = _COLUMN_ALIASES.get(option.lower(), option.lower())
                if not dot or not column:
                    raise ConnectorOptionError(
                        raw_key, "write fields.<column>.<option>, such as fields.k.kind"
                    )
                if option not in COLUMN_OPTIONS:
                    raise ConnectorOptionError(
                        raw_key,
                        f"unknown column option {option}{_nearest(option, list(COLUMN_OPTIONS))}; "
                        f"column options: {', '.join(COLUMN_OPTIONS)}",
                    )
                if (column, option) in written:
                    raise ConnectorOptionError(
                        raw_key, f"given twice (also as {written[column, option]})"
                    )
                written[column, option] = raw_key
                per_column.setdefault(column, {})[option] = value
                continue
            canonical = _ALIASES.get(lowered, lowered)
            if canonical not in SOURCE_OPTIONS:
                known = [*SOURCE_OPTIONS, "fields.<column>.<option>"]
                raise ConnectorOptionError(
                    raw_key,
                    f"unknown option of the datagen connector{_nearest(lowered, list(SOURCE_OPTIONS))}; "
                    f"its options: {', '.join(known)}",
                )
            if canonical in top:
                raise ConnectorOptionError(raw_key, f"given twice (also as {top[canonical][0]})")
            top[canonical] = (raw_key, value)

        def text(option: str) -> tuple[str, str] | None:
            return top.get(option)

        if (given := text("connector")) is not None and given[1].strip().lower() != "datagen":
            raise ConnectorOptionError(given[0], f"expected 'datagen', got {given[1]!r}")
        rate: float | None = DEFAULT_ROWS_PER_SECOND
        if (given := text("rows_per_second")) is not None:
            if given[1].strip().lower() == "unlimited":
                rate = None
            else:
                rate = _number(given[0], given[1])
                if rate <= 0:
                    raise ConnectorOptionError(
                        given[0], f"must be greater than 0 (or 'unlimited'), got {given[1]}"
                    )
        rows = None
        if (given := text("number_of_rows")) is not None:
            rows = _integer(given[0], given[1], least=0)
        partitions = 1
        if (given := text("partitions")) is not None:
            partitions = _integer(given[0], given[1], least=1)
            if partitions > _MAX_PARTITIONS:
                raise ConnectorOptionError(
                    given[0], f"must be at most {_MAX_PARTITIONS}, got {partitions}"
                )
        batch_rows = DEFAULT_BATCH_ROWS
        if (given := text("batch_rows")) is not None:
            batch_rows = _integer(given[0], given[1], least=1)
        seed = 0
        if (given := text("seed")) is not None:
            seed = _integer(given[0], given[1], least=0)

        # the columns: declared, or from fields.<column>.type
        declared = {f.name: f for f in schema} if schema is not None else {}
        by_column: dict[str, dict[str, str]] = {}
        given_as: dict[str, str] = {}  # column → the name the options gave it
        fields: list[pa.Field[Any]] = list(schema) if schema is not None else []
        for column, given_options in per_column.items():
            name = column
            if schema is not None and column not in declared:
                matches = [n for n in declared if n.lower() == column.lower()]
                if len(matches) != 1:
                    option = written[column, next(iter(given_options))]
                    raise ConnectorOptionError(
                        option,
                        f"no column {column}{_nearest(column, list(declared))}; the columns: "
                        f"{', '.join(declared)}",
                    )
                name = matches[0]
            if name in by_column:
                option = written[column, next(iter(given_options))]
                raise ConnectorOptionError(option, f"column {name} is configured twice")
            by_column[name] = given_options
            given_as[name] = column
            if "type" in given_options:
                option = written[column, "type"]
                if schema is not None:
                    raise ConnectorOptionError(
                        option, f"the column list declares the type of {name}; drop this option"
                    )
                fields.append(pa.field(name, _sql_type(option, given_options["type"])))
        if schema is None:
            untyped = [c for c, o in by_column.items() if "type" not in o]
            if untyped:
                raise ConnectorOptionError(
                    f"fields.{untyped[0]}.type",
                    f"column {untyped[0]} needs a type (no columns are declared)",
                )
        if not fields:
            raise ConnectorOptionError(
                "fields.<column>.type",
                "a datagen source needs columns: declare them, or give fields.<column>.type",
            )
        columns = []
        for field in fields:
            given_options = by_column.get(field.name, {})
            keys = {option: written[given_as[field.name], option] for option in given_options}
            spec = _column(field.name, field.type, given_options, seed, keys)
            if (
                spec.kind == "sequence"
                and isinstance(field.type, pa.TimestampType)
                and spec.step == 0
            ):
                spec = _replace(spec, step=_rate_interval(field.type, rate))
            columns.append(spec)
        return cls(
            schema=pa.schema(fields),
            columns=tuple(columns),
            rows_per_second=rate,
            number_of_rows=rows,
            partitions=partitions,
            batch_rows=batch_rows,
            seed=seed,
        )

    def describe(self) -> list[str]:
        """What ``explain`` shows of the source: its rate, rows and partitions, then one line
        per column (how it is generated; instants and durations in the column's unit as ISO
        8601 / ``<n> <unit>``).

        >>> options = DatagenOptions.from_options(
        ...     {"rows_per_second": "100", "partitions": "2", "fields.id.kind": "sequence"},
        ...     pa.schema([("id", pa.int64()), ("t", pa.timestamp("ms"))]),
        ... )
        >>> for line in options.describe():
        ...     print(line)
        datagen: 100 rows/s in all, unbounded; 2 partitions (p0, p1) interleaving global rows g = i*2 + p; seed 0
          id int64: sequence start 0 step 1
          t timestamp[ms]: sequence start 1970-01-01T00:00:00+00:00 interval 10 ms
        """
        rate = (
            "no rate limit"
            if self.rows_per_second is None
            else f"{self.rows_per_second:g} rows/s in all"
        )
        rows = self.global_rows
        # an int64 sequence's limit is no bound in practice
        bound = "unbounded" if rows is None or rows >= 2**53 else f"{rows:,} rows"
        names = ", ".join(self.partition_names)
        plural = "partition" if self.partitions == 1 else "partitions"
        lines = [
            f"datagen: {rate}, {bound}; {self.partitions} {plural} ({names}) "
            f"interleaving global rows g = i*{self.partitions} + p; seed {self.seed}"
        ]
        for column in self.columns:
            lines.append(f"  {column.name} {column.type}: {_describe(column)}")
        return lines

    @property
    def partition_names(self) -> tuple[str, ...]:
        """``("p0", …, "p{N-1}")``."""
        return tuple(f"p{p}" for p in range(self.partitions))

    @property
    def global_rows(self) -> int | None:
        """Global rows the source generates: ``number_of_rows`` or the end of the shortest
        bounded sequence, whichever comes first; ``None`` when unbounded."""
        bounds = [c.rows for c in self.columns if c.rows is not None]
        if self.number_of_rows is not None:
            bounds.append(self.number_of_rows)
        return max(min(bounds), 0) if bounds else None

    def partition_rows(self, partition: int) -> int | None:
        """Rows of partition ``partition`` (0-based): ``⌈(L - p) / N⌉``; ``None`` if unbounded."""
        total = self.global_rows
        return None if total is None else _rows_below(total, partition, self.partitions)


def _describe(column: DatagenColumn) -> str:
    data_type = column.type
    unit = data_type.unit if isinstance(data_type, pa.TimestampType) else None

    def instant(value: int | float) -> str:
        assert unit is not None
        return str(datetime.fromtimestamp(0, UTC) + _micro(int(value) * NS_PER_UNIT[unit]))

    parts: list[str] = [column.kind]
    if column.kind == "sequence" and unit is not None:
        parts += [
            f"start {instant(column.start).replace(' ', 'T')}",
            f"interval {column.step} {unit}",
        ]
        if column.end is not None:
            parts.append(f"end {instant(column.end).replace(' ', 'T')}")
        if column.jitter:
            parts.append(f"max_out_of_orderness {column.jitter} {unit}")
    elif column.kind == "sequence":
        parts += [f"start {column.start}", f"step {column.step}"]
        if column.end is not None:
            parts.append(f"end {column.end}")
    elif pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        parts.append(f"length {column.length}")
    elif unit is not None:
        parts += [f"min {instant(column.minimum)}", f"max {instant(column.maximum)}"]
    elif not pa.types.is_boolean(data_type):
        parts += [f"min {column.minimum}", f"max {column.maximum}"]
    if column.null_rate:
        parts.append(f"null_rate {column.null_rate:g}")
    return " ".join(parts)


def _micro(ns: int) -> timedelta:
    return timedelta(microseconds=ns // 1_000)


def _rate_interval(data_type: pa.TimestampType, rate: float | None) -> int:
    """The default ``interval`` of a timestamp sequence, in the column's unit: one second per
    ``rows_per_second`` global rows (so event time advances as fast as processing time),
    rounded down, at least one unit; 1 ms without a rate limit."""
    per = NS_PER_UNIT[data_type.unit]
    interval_ns = 1_000_000 if rate is None else int(1e9 / rate)
    return max(interval_ns // per, 1)


def _rows_below(bound: int, partition: int, partitions: int) -> int:
    """How many rows ``i`` of partition ``partition`` have global row ``i·N + p < bound``."""
    return max(0, (bound - partition + partitions - 1) // partitions)


# --- generation -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _key(seed: int, column: str, partition: int, purpose: int) -> U64Array:
    """The Philox key of a column's words of one purpose in one partition (cached; never
    written to: Philox copies it)."""
    name = int.from_bytes(hashlib.blake2b(column.encode(), digest_size=8).digest(), "little")
    state = np.random.SeedSequence([seed, name, partition, purpose]).generate_state(2, np.uint64)
    return np.asarray(state, dtype=np.uint64)


def _words(key: U64Array, first: int, count: int) -> U64Array:
    """Words ``first`` … ``first + count - 1`` of the Philox4x64 stream of ``key`` (each
    counter value gives 4 words): a pure function of its arguments."""
    counter, skip = divmod(first, 4)
    raw: U64Array = np.random.Philox(key=key, counter=counter).random_raw(count + skip)
    return raw[skip:]


def _below(words: U64Array, width: int) -> U64Array:
    """``⌊word · width / 2⁶⁴⌋`` for each word: uniform in ``[0, width)`` for ``1 ≤ width ≤ 2⁶⁴``
    (Lemire's multiply-shift: the high word of the 128-bit product, from 32-bit halves)."""
    if width >= _U64:
        return words
    ul, uh = words & _M32, words >> np.uint64(32)
    if width <= 0xFFFFFFFF:
        w = np.uint64(width)
        short: U64Array = (uh * w + ((ul * w) >> np.uint64(32))) >> np.uint64(32)
        return short
    wl, wh = np.uint64(width & 0xFFFFFFFF), np.uint64(width >> 32)
    low = ul * wl
    mid1 = uh * wl + (low >> np.uint64(32))
    mid2 = ul * wh + (mid1 & _M32)
    high: U64Array = uh * wh + (mid1 >> np.uint64(32)) + (mid2 >> np.uint64(32))
    return high


def _ints_between(words: U64Array, low: int, high: int) -> I64Array:
    """Uniform integers in ``[low, high]`` (int64 range), one per word."""
    offset = _below(words, high - low + 1)
    shifted: I64Array = (np.uint64(low % _U64) + offset).view(np.int64)
    return shifted


def _unit_floats(words: U64Array) -> npt.NDArray[np.float64]:
    """Uniform floats in ``[0, 1)``: the top 53 bits of each word."""
    out: npt.NDArray[np.float64] = (words >> np.uint64(11)).astype(np.float64) * (2.0**-53)
    return out


def _random_strings(
    key: U64Array, first_row: int, count: int, length: int, large: bool
) -> pa.Array[Any]:
    """``count`` strings of ``length`` characters of ``[0-9A-Za-z]``, rows from ``first_row``:
    16 bits of the row's words per character (``⌊h · 62 / 2¹⁶⌋``), 4 characters a word."""
    offsets_type = np.int64 if large else np.int32
    offsets = np.arange(0, (count + 1) * length, length, dtype=offsets_type)
    if length == 0 or count == 0:
        chars = b""
    else:
        per_row = (length + 3) // 4
        words = _words(key, first_row * per_row, count * per_row)
        quarters = words.view(np.uint16).reshape(count, 4 * per_row)[:, :length]
        index = ((quarters.astype(np.uint32) * np.uint32(62)) >> np.uint32(16)).astype(np.uint8)
        chars = index.tobytes().translate(_TRANSLATE)
    array_type = pa.large_string() if large else pa.string()
    return pa.Array.from_buffers(
        array_type, count, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(chars)]
    )


def _column_values(
    column: DatagenColumn, partition: int, partitions: int, first: int, count: int
) -> pa.Array[Any]:
    """Rows ``first`` … ``first + count - 1`` of ``partition`` of one column."""
    data_type = column.type
    cls = _class_of(data_type)
    index = np.arange(first, first + count, dtype=np.int64)
    global_row = index * partitions + partition
    array: pa.Array[Any]
    if column.kind == "sequence":
        if cls == "float":
            values: Any = float(column.start) + global_row.astype(np.float64) * float(column.step)
            array = pa.array(values, type=pa.float64()).cast(data_type)
        else:
            start = int(column.start)
            step = int(column.step)
            ints = (
                np.uint64(start % _U64) + global_row.astype(np.uint64) * np.uint64(step % _U64)
            ).view(np.int64)
            if cls == "timestamp" and column.jitter:
                key = _key(column.seed, column.name, partition, _JITTER)
                ints = ints - _ints_between(_words(key, first, count), 0, column.jitter)
            if cls == "string":
                array = pa.array(ints, type=pa.int64()).cast(data_type)
            elif cls == "timestamp":
                array = pa.array(ints, type=pa.int64()).view(data_type)
            else:
                array = pa.array(ints.astype(data_type.to_pandas_dtype()), type=data_type)
    else:
        key = _key(column.seed, column.name, partition, _VALUES)
        if cls == "string":
            array = _random_strings(
                key, first, count, column.length, pa.types.is_large_string(data_type)
            )
        else:
            words = _words(key, first, count)
            if cls == "bool":
                array = pa.array((words >> np.uint64(63)).astype(np.bool_), type=pa.bool_())
            elif cls == "float":
                lo, hi = float(column.minimum), float(column.maximum)
                floats = lo + _unit_floats(words) * (hi - lo)
                array = pa.array(np.minimum(floats, hi), type=pa.float64()).cast(data_type)
            else:
                ints = _ints_between(words, int(column.minimum), int(column.maximum))
                if cls == "timestamp":
                    array = pa.array(ints, type=pa.int64()).view(data_type)
                else:
                    array = pa.array(ints.astype(data_type.to_pandas_dtype()), type=data_type)
    if column.null_rate > 0.0:
        key = _key(column.seed, column.name, partition, _NULLS)
        nulls = _unit_floats(_words(key, first, count)) < column.null_rate
        array = pc.if_else(pa.array(nulls), pa.scalar(None, data_type), array)
    return array


def generate_rows(
    options: DatagenOptions, partition: int, first: int, count: int
) -> pa.RecordBatch:
    """Rows ``first`` … ``first + count - 1`` of partition ``partition`` (0-based), in
    ``options.schema``: a pure function of its arguments (what :class:`DatagenSource` hands
    out, batch by batch). Rows past the partition's end are not checked for here.

    Raises:
        ValueError: ``partition`` is not in ``[0, partitions)``, or ``first`` or ``count`` < 0.

    >>> options = DatagenOptions.from_options(
    ...     {"partitions": "2", "fields.id.kind": "sequence", "fields.id.start": "10"},
    ...     pa.schema([("id", pa.int64())]),
    ... )
    >>> generate_rows(options, 1, 0, 3).column("id").to_pylist()  # g = 1, 3, 5
    [11, 13, 15]
    """
    if not 0 <= partition < options.partitions:
        raise ValueError(f"partition {partition} is not in [0, {options.partitions})")
    if first < 0 or count < 0:
        raise ValueError(f"first ({first}) and count ({count}) must be >= 0")
    arrays = [
        _column_values(column, partition, options.partitions, first, count)
        for column in options.columns
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=options.schema)


# --- the source -------------------------------------------------------------------------------


class DatagenSource:
    """A ``datagen`` source (see the module docstring).

    Args:
        options: the parsed options.
        name: the source's name in the pipeline (for messages).
        clock: seconds of a monotonic clock (the rate's time).
        sleep: waits that many seconds (a poll with nothing due waits for the next due row,
            at most its ``timeout_s``).

    The constructor does no I/O and generates nothing; :meth:`open` starts the rate's clock.
    """

    #: polls may wait (for the rate's next row): the run loop treats it as a live source
    live: Final = True

    def __init__(
        self,
        options: DatagenOptions,
        *,
        name: str = "datagen",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.options = options
        self.name = name
        self.partitions: tuple[str, ...] = options.partition_names
        self.schema: pa.Schema = options.schema
        self.initial_watermarks: dict[str, int] = {}
        self._clock = clock
        self._sleep = sleep
        count = options.partitions
        self._limits = [options.partition_rows(p) for p in range(count)]
        self._next = [0] * count
        self._ended = [False] * count
        self._pending: deque[SourceEvent] = deque()
        self._opened_at: float | None = None
        self._base = 0  # rows handed out before open (a restore)
        self._behind = False
        self._turn = self._next_turn = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self, resume: Mapping[str, Any] | None = None) -> None:
        """Start the clock, from the beginning or from ``resume`` (a :meth:`snapshot`).

        Raises:
            ConnectorError: ``resume`` does not name exactly this source's partitions, or a row
                index is not an integer in ``[0, the partition's rows]``.
        """
        count = self.options.partitions
        self._next = [0] * count
        if resume is not None:
            rows = resume.get("next_row")
            if not isinstance(rows, Mapping) or set(rows) != set(self.partitions):
                raise ConnectorError(
                    f"datagen source {self.name}: the checkpoint's partitions "
                    f"({', '.join(sorted(rows)) if isinstance(rows, Mapping) else 'none'}) are not "
                    f"this source's ({', '.join(self.partitions)}): was 'partitions' changed?"
                )
            for p, partition in enumerate(self.partitions):
                value = rows[partition]
                limit = self._limits[p]
                if (
                    not isinstance(value, int)
                    or isinstance(value, bool)
                    or value < 0
                    or (limit is not None and value > limit)
                ):
                    raise ConnectorError(
                        f"datagen source {self.name}: the checkpoint's next row of {partition} "
                        f"({value!r}) is not in [0, {limit if limit is not None else '∞'}]"
                    )
                self._next[p] = value
        self._ended = [False] * count
        self._pending = deque(SourceEvent("partition", partition) for partition in self.partitions)
        self._base = sum(self._next)
        self._behind = False
        self._turn = self._next_turn = 0  # the partition the next round starts at
        self._opened_at = self._clock()

    def close(self) -> None:
        """Nothing to release. Idempotent."""

    @property
    def rows(self) -> int:
        """Rows handed out so far, those before a restore included."""
        return sum(self._next)

    def snapshot(self) -> dict[str, Any]:
        """The offsets as checkpoint JSON: ``{"next_row": {partition: next row index}}``."""
        return {"next_row": dict(zip(self.partitions, self._next, strict=True))}

    @property
    def done(self) -> bool:
        """Whether every partition has ended (its ``end`` event handed out)."""
        return all(self._ended) and not self._pending

    @property
    def backlog(self) -> bool:
        """Whether rows are due that were not handed out: the last poll stopped at
        ``max_events`` with rows due; without a rate limit, until the source is done."""
        if self.options.rows_per_second is None:
            return not self.done
        return self._behind

    # -- reading -----------------------------------------------------------------------------

    def _due(self, now: float) -> int | None:
        """The global row bound due at ``now`` (``None``: no rate limit)."""
        rate = self.options.rows_per_second
        if rate is None or self._opened_at is None:
            return None
        return self._base + math.floor((now - self._opened_at) * rate + 1e-9)

    def _available(self, p: int, due: int | None) -> int:
        """Rows partition ``p`` may hand out now."""
        bounds = [
            b
            for b in (
                self._limits[p],
                None if due is None else _rows_below(due, p, self.options.partitions),
            )
            if b is not None
        ]
        if not bounds:
            return self.options.batch_rows
        return max(min(bounds) - self._next[p], 0)

    def _exhausted(self, p: int) -> bool:
        limit = self._limits[p]
        return limit is not None and self._next[p] >= limit

    def _seconds_to_next_row(self, now: float) -> float:
        """Seconds until the next global row a partition still needs becomes due."""
        rate = self.options.rows_per_second
        assert rate is not None
        assert self._opened_at is not None
        count = self.options.partitions
        needed = min(self._next[p] * count + p for p in range(count) if not self._exhausted(p))
        at = self._opened_at + (needed - self._base + 1) / rate
        return max(at - now, 0.0)

    def poll(self, timeout_s: float, max_events: int = 64) -> list[SourceEvent]:
        """The next events, at most ``max_events``: first (after every :meth:`open`, a restore
        too) one ``partition`` event per partition,
        then ``batch`` events (``offset`` = the partition's row index of the batch's first row)
        of the rows due, round-robin over the partitions, and an ``end`` event for each
        partition whose rows are all handed out. With nothing due it waits (``sleep``) up to
        ``timeout_s`` for the next row; ``[]`` once done.

        Raises:
            ConnectorError: the source was not opened.
        """
        if self._opened_at is None:
            raise ConnectorError(f"datagen source {self.name}: poll before open")
        events: list[SourceEvent] = []
        while self._pending and len(events) < max_events:
            events.append(self._pending.popleft())
        if self.done:
            return events
        count = self.options.partitions
        due = self._due(self._clock())
        if (
            not events
            and due is not None
            and timeout_s > 0
            and not any(self._available(p, due) for p in range(count))
            and not any(self._exhausted(p) and not self._ended[p] for p in range(count))
        ):
            self._sleep(min(timeout_s, self._seconds_to_next_row(self._clock())))
            due = self._due(self._clock())
        batch_rows = self.options.batch_rows
        progress = True
        while progress and len(events) < max_events:
            progress = False
            for step in range(count):  # round-robin from where the last poll stopped
                if len(events) >= max_events:
                    break
                p = (self._turn + step) % count
                partition = self.partitions[p]
                if self._ended[p]:
                    continue
                rows = min(self._available(p, due), batch_rows)
                if rows > 0:
                    first = self._next[p]
                    batch = generate_rows(self.options, p, first, rows)
                    self._next[p] = first + rows
                    events.append(SourceEvent("batch", partition, batch, offset=first))
                    progress = True
                    self._next_turn = (p + 1) % count
                elif self._exhausted(p):
                    self._ended[p] = True
                    events.append(SourceEvent("end", partition, offset=self._next[p]))
                    progress = True
                    self._next_turn = (p + 1) % count
            self._turn = self._next_turn
        self._behind = len(events) >= max_events and any(
            not self._ended[p] and (self._available(p, due) > 0 or self._exhausted(p))
            for p in range(count)
        )
        return events
