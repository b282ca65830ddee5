"""The ``WITH (…)`` option names of the connectors whose modules a run loads only when a pipeline
names them (``falkordb``, ``datagen``, ``iceberg``, ``flight``).

The connector registry (:mod:`flight_serve.pipelines.connect`) checks every relation's options
against these names before any connector is built, so they live here, importable without the
connector (its module pulls in ``pyarrow.flight``, numpy, the store or pyiceberg glue):
``flight-serve run`` of a file → stdout pipeline loads none of those (cold start, DESIGN §11).
Each connector module re-exports its own names (``connectors.falkordb.FALKORDB_OPTIONS``,
``connectors.datagen.SOURCE_OPTIONS`` …); docs/pipelines.md documents them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DATAGEN_OPTION_ALIASES",
    "DATAGEN_SOURCE_OPTIONS",
    "FALKORDB_OPTIONS",
    "FLIGHT_AUTH_OPTIONS",
    "ICEBERG_CATALOG_OPTIONS",
    "ICEBERG_SINK_OPTIONS",
    "ICEBERG_SOURCE_OPTIONS",
    "is_iceberg_catalog_option",
]

#: Every option of the falkordb sink (``connector`` included).
FALKORDB_OPTIONS: Final = (
    "connector",
    "url",
    "graph",
    "node_label",
    "node_key",
    "edge_type",
    "source_label",
    "source_column",
    "source_key",
    "target_label",
    "target_column",
    "target_key",
    "edge_key",
    "properties",
    "accumulate",
    "batch_rows",
    "timestamps",
    "non_finite",
    "max_retries",
)

#: The datagen source's options (``fields.<column>.<option>`` aside), with their Flink /
#: RisingWave spellings accepted as aliases (:data:`DATAGEN_OPTION_ALIASES`).
DATAGEN_SOURCE_OPTIONS: Final = (
    "connector",
    "rows_per_second",
    "number_of_rows",
    "partitions",
    "batch_rows",
    "seed",
)
DATAGEN_OPTION_ALIASES: Final = {
    "rows-per-second": "rows_per_second",  # Flink
    "number-of-rows": "number_of_rows",  # Flink
    "datagen.rows.per.second": "rows_per_second",  # RisingWave
    "datagen.split.num": "partitions",  # RisingWave
}

#: The TLS and token options of a flight source or sink (``pipelines.flight_io.flight_auth``).
FLIGHT_AUTH_OPTIONS: Final[tuple[str, ...]] = ("tls_ca", "tls_cert", "tls_key", "token_env")

#: The catalog options of an iceberg source or sink (``pipelines.iceberg_io.catalog_of``).
ICEBERG_CATALOG_OPTIONS: Final = ("catalog_name", "catalog_uri", "catalog_type", "warehouse")
ICEBERG_SOURCE_OPTIONS: Final = (
    "connector",
    "table",
    *ICEBERG_CATALOG_OPTIONS,
    "starting_strategy",
    "start_snapshot_id",
    "start_snapshot_timestamp",
    "monitor_interval",
    "max_snapshots_per_poll",
    "max_rows_per_poll",
    "skip_overwrite_snapshots",
    "skip_delete_snapshots",
    "expired_snapshot",
    "stop_at",
    "batch_rows",
)
ICEBERG_SINK_OPTIONS: Final = (
    "connector",
    "table",
    *ICEBERG_CATALOG_OPTIONS,
    "partition_by",
    "allow_schema_evolution",
    "upsert_keys",
    "max_retries",
)
#: The prefix of a pyiceberg catalog property passed through (``'catalog.<property>' = '…'``).
ICEBERG_PASSTHROUGH: Final = "catalog."


def is_iceberg_catalog_option(key: str) -> bool:
    """Whether ``key`` is a pyiceberg catalog property passed through (``catalog.<property>``).

    >>> is_iceberg_catalog_option("catalog.s3.region"), is_iceberg_catalog_option("catalog.")
    (True, False)
    """
    return key.startswith(ICEBERG_PASSTHROUGH) and len(key) > len(ICEBERG_PASSTHROUGH)
