"""The ``falkordb`` sink: rows become nodes or edges of a FalkorDB property graph (upserts).

A sink is either a **node** sink (``node_label``, ``node_key``) or an **edge** sink
(``edge_type``, ``source_label`` / ``source_column`` / ``source_key``, ``target_label`` /
``target_column`` / ``target_key``, optional ``edge_key``). Every other column (or the columns
listed in ``properties``) is a property, named exactly as the column. Per row, in effect::

    node:  MERGE (n:`Label` {`key`: row.key})                        SET n.`p` = row.p, …
    edge:  MERGE (s:`SourceLabel` {`source_key`: row.source_column})
           MERGE (t:`TargetLabel` {`target_key`: row.target_column})
           MERGE (s)-[r:`TYPE` {`edge_key`: row.edge_key}]->(t)    SET r.`p` = row.p, …

(:attr:`FalkorDBSink.merge_query`). Columns named in ``accumulate`` are added instead of set
(``coalesce(r.p, 0) + row.p``): counters that many epochs add to. Writing:

* **indexes first**: when the sink opens it creates a range index on every merge key
  (``(Label).key``, ``(SourceLabel).source_key``, ``(TargetLabel).target_key``, and
  ``[TYPE].edge_key``), so every node MERGE is a ``Node By Index Scan``, never a label scan;
* **batches of two queries**: per ``batch_rows`` rows (default 2,000; 1,000 to 5,000 is the
  useful range) the distinct node keys are merged through the index and their node ids returned
  (ids this sink resolved before are only verified, by id seeks); then one
  ``UNWIND $rows AS row … MERGE … SET …`` query reaches each row's nodes by id
  (``NodeByIdSeek``), checks their label and key, and merges the edge and sets the properties
  (:attr:`FalkorDBSink.upsert_query`). An index lookup costs FalkorDB ~20 µs and an id seek
  ~0.5 µs, so each distinct node is looked up once per batch, not once per row. The rows go as a
  Cypher list parameter built column by column with Arrow kernels;
* **dedupe**: within one write, rows with the same node key (node sink) or the same
  ``(source, target, edge_key)`` (edge sink) collapse to the last one; ``accumulate`` columns are
  summed over the collapsed rows instead;
* **values** are converted before Cypher sees them (:func:`cypher_columns`): integers, floats,
  booleans and strings as they are; timestamps as ISO 8601 UTC text ``YYYY-MM-DDTHH:MM:SS.ffffffZ``
  (microseconds; naive timestamps are taken as UTC) or, with ``timestamps = 'epoch_ms'``,
  integer milliseconds since the Unix epoch; dates and times as ISO text; NaN and ±inf become
  null (the property is removed) or, with ``non_finite = 'reject'``, fail the write naming the
  column; ``uint64`` values above 2^63 - 1 fail naming the column; a struct column ``a`` becomes
  one property per field, ``a.b``; lists of scalars become array properties. Decimal, binary
  and duration columns are refused when the sink opens (CAST them in the query), as are column,
  label and key names containing a backtick or strings containing NUL (FalkorDB cannot hold
  them). Any other name (``user-id``, ``@type``, ``a.b``) is written backquoted, so it
  round-trips: ``r.`user-id```. A null in a merge key fails the write naming the column (MERGE
  cannot match on null); a null property value removes the property (Cypher ``SET x = null``;
  at most one removal per entity per update operation, around FalkorDB #1787:
  :meth:`FalkorDBSink._set_clauses`);
* **exactly once** (checkpointed pipelines, :meth:`FalkorDBSink.write` with an ``epoch``): each
  query also merges the marker node ``(:_FlightServeSink {pipeline, sink})`` and, in the same
  query (FalkorDB runs a query atomically), writes the rows only if the marker's
  ``(epoch, seq)`` is below this batch's, then moves the marker to it. A replayed batch of an
  already committed epoch therefore changes nothing. Without an epoch (unchecked embedded runs)
  writes are plain upserts: at least once, which MERGE + SET makes idempotent except for
  ``accumulate`` columns;
* **connection loss** (a dropped socket, a timeout, the server restarting): the query is retried
  after 0.1 s, 0.2 s, 0.4 s … (at most 5 s apart) up to ``max_retries`` times; the marker makes a
  retry of a query whose reply was lost harmless.

Errors: :class:`FalkorDBOptionError` (a :class:`~flight_serve.errors.ConnectorError` naming the
option) for a bad option; :class:`~flight_serve.errors.ConnectorError` for a column that cannot
be converted (named), a server that stays unreachable after the retries, or a query FalkorDB
refuses.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.compute as pc

from flight_serve.connectors.columns import floor_timestamps
from flight_serve.connectors.options import FALKORDB_OPTIONS as _OPTIONS
from flight_serve.errors import ConnectorError, GraphStoreError

__all__ = [
    "DEFAULT_BATCH_ROWS",
    "DEFAULT_URL",
    "FALKORDB_OPTIONS",
    "MARKER_LABEL",
    "FalkorDBOptionError",
    "FalkorDBSink",
    "GraphMapping",
    "WriteResult",
    "backquote",
    "cypher_columns",
]

log = logging.getLogger("flight_serve.connectors.falkordb")

#: Rows per ``UNWIND`` query unless ``batch_rows`` says otherwise.
DEFAULT_BATCH_ROWS: Final = 2000
#: The server a sink without ``url`` writes to (unless ``FLIGHT_SERVE_FALKORDB_URL`` is set).
DEFAULT_URL: Final = "falkor://127.0.0.1:6379"
#: The label of the exactly-once marker nodes.
MARKER_LABEL: Final = "_FlightServeSink"
#: Every option of the sink (``connector`` included); in :mod:`.options`, which the registry
#: reads without this module.
FALKORDB_OPTIONS: Final = _OPTIONS
_MAX_BATCH_ROWS: Final = 100_000
_INT64_MAX: Final = 2**63 - 1
#: Node ids a sink remembers per (label, key property) before it forgets the older ones.
_MAX_CACHED_IDS: Final = 1_000_000
#: Upsert texts a sink keeps, one per set of columns a batch has nulls in.
_MAX_CACHED_QUERIES: Final = 256
#: The Cypher literal of a null (:func:`cypher_columns`).
_NULL: Final = pa.scalar("null", pa.string())


class FalkorDBOptionError(ConnectorError):
    """A ``falkordb`` sink option is missing or invalid; :attr:`option` names it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def backquote(name: str, what: str) -> str:
    """``name`` as a backquoted Cypher identifier (label, type or property name).

    Raises:
        ConnectorError: ``name`` is empty or holds a backtick (FalkorDB's parser cannot escape
            one); the message names ``what`` (e.g. ``column 'a`b'``).
    """
    if not name:
        raise ConnectorError(f"{what}: an empty name cannot be a Cypher identifier")
    if "`" in name:
        raise ConnectorError(
            f"{what}: FalkorDB cannot hold a backtick in a label, type or property name; "
            "rename it (AS …) in the query"
        )
    return f"`{name}`"


def _columns_list(text: str) -> tuple[str, ...]:
    return tuple(c.strip() for c in text.split(",") if c.strip())


@dataclass(frozen=True)
class GraphMapping:
    """How a sink's rows map onto the graph (built from the options by :meth:`from_options`).

    Attributes:
        kind: ``node`` or ``edge``.
        label: the node label (node sink) or the edge type (edge sink).
        key: node sink: the key column (also the key property's name); edge sink: the
            ``edge_key`` columns (may be empty: one edge of this type per node pair).
        source / target: edge sink: ``(label, column, key property)`` of each endpoint.
        properties: the property columns (``None``: every column not used as a key).
        accumulate: property columns added to the stored value instead of replacing it.
    """

    kind: Literal["node", "edge"]
    label: str
    key: tuple[str, ...]
    source: tuple[str, str, str] | None = None
    target: tuple[str, str, str] | None = None
    properties: tuple[str, ...] | None = None
    accumulate: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> GraphMapping:
        """The mapping of a sink's ``WITH`` options.

        Raises:
            FalkorDBOptionError: a missing or contradictory option (named).
        """

        def need(key: str, why: str) -> str:
            value = options.get(key, "").strip()
            if not value:
                raise FalkorDBOptionError(key, f"the falkordb sink needs {key} = '…' ({why})")
            return value

        props = _columns_list(options["properties"]) if "properties" in options else None
        acc = _columns_list(options.get("accumulate", ""))
        if "node_label" in options and "edge_type" in options:
            raise FalkorDBOptionError(
                "edge_type",
                "a falkordb sink writes nodes (node_label) or edges (edge_type), not both",
            )
        if "node_label" in options:
            for extra in ("source_label", "source_column", "source_key", "target_label",
                          "target_column", "target_key", "edge_key"):  # fmt: skip
                if extra in options:
                    raise FalkorDBOptionError(
                        extra, f"{extra} is an option of edge sinks (edge_type)"
                    )
            label = need("node_label", "the label of the nodes")
            key = need("node_key", "the column whose value identifies a node")
            return cls("node", label, (key,), properties=props, accumulate=acc)
        if "edge_type" not in options:
            raise FalkorDBOptionError(
                "connector",
                "the falkordb sink needs node_label = '…' and node_key = '…' (nodes) or "
                "edge_type = '…' with source_label/source_column and target_label/"
                "target_column (edges)",
            )
        if "node_key" in options:
            raise FalkorDBOptionError(
                "node_key", "node_key is an option of node sinks (node_label)"
            )
        edge_type = need("edge_type", "the type of the edges")
        ends = []
        for end in ("source", "target"):
            label = need(f"{end}_label", f"the label of each edge's {end} node")
            column = need(f"{end}_column", f"the column holding the {end} node's key")
            key = options.get(f"{end}_key", "").strip() or column
            ends.append((label, column, key))
        (source_label, _, source_key), (target_label, _, target_key) = ends
        defaulted = not options.get("source_key", "").strip() or not options.get(
            "target_key", ""
        ).strip()
        if source_label == target_label and source_key != target_key and defaulted:
            raise FalkorDBOptionError(
                "target_label",
                f"both ends of the edges are {source_label} nodes, but keyed by two properties "
                f"({source_key}, {target_key}: a key not given defaults to its column), so one "
                f"{source_label} would become two nodes; set source_key and target_key (e.g. "
                "both 'id')",
            )
        return cls(
            "edge",
            edge_type,
            _columns_list(options.get("edge_key", "")),
            source=ends[0],
            target=ends[1],
            properties=props,
            accumulate=acc,
        )

    @property
    def key_columns(self) -> tuple[str, ...]:
        """The columns identifying one node (node sink) or one edge (edge sink), in order."""
        if self.kind == "node":
            return self.key
        assert self.source is not None
        assert self.target is not None
        return (self.source[1], self.target[1], *self.key)

    def property_columns(self, schema: pa.Schema) -> tuple[str, ...]:
        """The property columns of ``schema`` (``properties``, else every non-key column)."""
        if self.properties is not None:
            return self.properties
        keys = set(self.key_columns)
        return tuple(n for n in schema.names if n not in keys)


@dataclass(frozen=True)
class WriteResult:
    """What one :meth:`FalkorDBSink.write` did.

    Attributes:
        rows_in: rows handed in.
        rows_written: rows sent after deduplication (in applied batches).
        queries: queries run (one per batch of ``batch_rows``).
        skipped: queries whose batch the epoch marker had already (a replay): nothing written.
        retries: queries retried after a lost connection.
    """

    rows_in: int
    rows_written: int
    queries: int
    skipped: int
    retries: int


# --- values -------------------------------------------------------------------------------------

#: An Arrow array in the value conversion (pyarrow-stubs type the compute kernels narrower than
#: the arrays they accept, so arrays are untyped here).
_Arr = Any


def _quote_strings(arr: _Arr, column: str) -> _Arr:
    arr = arr.cast(pa.string()) if not pa.types.is_string(arr.type) else arr
    if pc.any(pc.match_substring(arr, "\x00")).as_py():
        raise ConnectorError(
            f"column {column!r}: a string holds a NUL character, which FalkorDB cannot store"
        )
    escaped = pc.replace_substring(arr, "\\", "\\\\")
    escaped = pc.replace_substring(escaped, '"', '\\"')
    return pc.binary_join_element_wise('"', escaped, '"', "")


def _float_literals(arr: _Arr, column: str, non_finite: str) -> _Arr:
    finite = pc.is_finite(arr)
    bad = pc.and_(pc.invert(finite), pc.is_valid(arr))
    if pc.any(bad).as_py():
        if non_finite == "reject":
            raise ConnectorError(
                f"column {column!r}: NaN or infinity cannot be stored in FalkorDB "
                "(non_finite = 'reject'); filter the row or use non_finite = 'null'"
            )
        arr = pc.if_else(finite, arr, pa.scalar(None, arr.type))
    text = arr.cast(pa.float64()).cast(pa.string())
    # "1" would come back as an integer: keep floats floats ("1.0")
    whole = pc.invert(pc.match_substring_regex(text, "[.e]"))
    return pc.if_else(whole, pc.binary_join_element_wise(text, ".0", ""), text)


def _timestamp_literals(arr: _Arr, timestamps: str) -> _Arr:
    tz = "UTC" if arr.type.tz is not None else None  # naive timestamps are taken as UTC
    arr = arr.cast(pa.timestamp(arr.type.unit, tz))
    if timestamps == "epoch_ms":
        return floor_timestamps(arr, "ms").cast(pa.int64()).cast(pa.string())
    us = floor_timestamps(arr, "us")  # nanoseconds are floored toward the past
    text = pc.strftime(us, format="%Y-%m-%dT%H:%M:%S", locale="C")  # with .ffffff
    return pc.binary_join_element_wise('"', text, 'Z"', "")


def _scalar_literal(value: Any, column: str, non_finite: str) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value > _INT64_MAX:
            raise ConnectorError(
                f"column {column!r}: {value} is above the int64 range FalkorDB holds"
            )
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            if non_finite == "reject":
                raise ConnectorError(
                    f"column {column!r}: NaN or infinity cannot be stored in FalkorDB"
                )
            return "null"
        return repr(value)
    if isinstance(value, str):
        if "\x00" in value:
            raise ConnectorError(f"column {column!r}: a string holds a NUL character")
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise ConnectorError(f"column {column!r}: cannot store a {type(value).__name__} in a list")


def _list_literals(arr: _Arr, column: str, non_finite: str) -> _Arr:
    out: list[str | None] = []
    for item in arr.to_pylist():
        if item is None:
            out.append(None)
        else:
            out.append("[" + ",".join(_scalar_literal(v, column, non_finite) for v in item) + "]")
    return pa.array(out, pa.string())


def _check_type(kind: pa.DataType, column: str) -> None:
    if pa.types.is_dictionary(kind):
        _check_type(kind.value_type, column)
        return
    if pa.types.is_struct(kind):
        for child in kind:
            _check_type(child.type, f"{column}.{child.name}")
        return
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        value = kind.value_type
        if not (
            pa.types.is_integer(value) or pa.types.is_floating(value) or pa.types.is_boolean(value)
            or pa.types.is_string(value) or pa.types.is_large_string(value) or pa.types.is_null(value)
        ):  # fmt: skip
            raise ConnectorError(
                f"column {column!r}: a list of {value} cannot be a FalkorDB property; lists of "
                "integers, floats, booleans or strings can"
            )
        return
    if (
        pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
        or pa.types.is_string(kind) or pa.types.is_large_string(kind)
        or pa.types.is_string_view(kind) or pa.types.is_timestamp(kind)
        or pa.types.is_date(kind) or pa.types.is_time(kind) or pa.types.is_null(kind)
    ):  # fmt: skip
        return
    raise ConnectorError(
        f"column {column!r}: {kind} cannot be a FalkorDB property; CAST it to DOUBLE, BIGINT or "
        "VARCHAR in the query"
    )


def _flatten(name: str, arr: _Arr) -> Iterator[tuple[str, _Arr]]:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_struct(arr.type):
        for i, child in enumerate(arr.type):
            yield from _flatten(f"{name}.{child.name}", pc.struct_field(arr, [i]))
        return
    yield name, arr


def cypher_columns(
    table: pa.Table, *, timestamps: str = "iso", non_finite: str = "null"
) -> list[tuple[str, _Arr]]:
    """Every column of ``table`` (struct fields flattened to ``parent.field``) as an array of
    Cypher literal text (``null`` for null), in column order.

    Args:
        table: the rows.
        timestamps: ``iso`` or ``epoch_ms`` (see the module docstring).
        non_finite: ``null`` or ``reject``.

    Raises:
        ConnectorError: a value that cannot be stored, naming the column (see the module
            docstring).
    """
    out: list[tuple[str, _Arr]] = []
    for column_name, column in zip(table.column_names, table.columns, strict=True):
        for name, arr in _flatten(column_name, column):
            kind = arr.type
            text: _Arr
            if pa.types.is_null(kind):
                text = pa.nulls(len(arr), pa.string())
            elif pa.types.is_boolean(kind):
                text = arr.cast(pa.string())
            elif pa.types.is_integer(kind):
                if kind == pa.uint64():
                    top = pc.max(arr).as_py()
                    if top is not None and top > _INT64_MAX:
                        raise ConnectorError(
                            f"column {name!r}: uint64 value {top} is above the int64 range "
                            "FalkorDB holds (2^63 - 1); CAST or filter it in the query"
                        )
                text = arr.cast(pa.string())
            elif pa.types.is_floating(kind):
                text = _float_literals(arr, name, non_finite)
            elif pa.types.is_timestamp(kind):
                text = _timestamp_literals(arr, timestamps)
            elif pa.types.is_date(kind) or pa.types.is_time(kind):
                text = _quote_strings(arr.cast(pa.string()), name)
            elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
                text = _list_literals(arr, name, non_finite)
            else:
                _check_type(kind, name)
                text = _quote_strings(arr, name)
            out.append((name, pc.fill_null(text, "null")))
    return out


def _flat_names(schema: pa.Schema, columns: tuple[str, ...]) -> list[str]:
    names: list[str] = []

    def walk(name: str, kind: pa.DataType) -> None:
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if pa.types.is_struct(kind):
            for child in kind:
                walk(f"{name}.{child.name}", child.type)
        else:
            names.append(name)

    for column in columns:
        walk(column, schema.field(column).type)
    return names


# --- the sink -----------------------------------------------------------------------------------


def _is_connection_error(exc: BaseException) -> bool:
    import redis

    return isinstance(
        exc, redis.exceptions.ConnectionError | redis.exceptions.TimeoutError | OSError
    )


#: FalkorDB's url schemes and the redis ones they stand for (as ``FalkorDB.from_url`` maps them)
_REDIS_SCHEME = {"falkor": "redis", "falkors": "rediss"}


def _is_refused_login(exc: BaseException) -> bool:
    """A wrong user or password (``WRONGPASS``, or ``AUTH`` to a server without one): redis
    raises it as a subclass of ``ConnectionError``, but it is the url's, not the network's."""
    import redis

    return isinstance(
        exc,
        redis.exceptions.AuthenticationError | redis.exceptions.AuthenticationWrongNumberOfArgsError,
    )


@dataclass
class _Stats:
    """A sink's totals: queries run, queries skipped by the marker, retries, rows written."""

    queries: int = 0
    skipped: int = 0
    retries: int = 0
    rows: int = 0


class FalkorDBSink:
    """Upserts rows into a FalkorDB graph (see the module docstring).

    Args:
        name: the sink's name (its marker's ``sink`` property, and messages).
        options: the ``WITH`` options (:data:`FALKORDB_OPTIONS`), values as text.
        schema: the Arrow schema of every batch written (any columns; the mapping's key columns
            must be present).
        pipeline: the pipeline's name (its marker's ``pipeline`` property).
        connect: open the connection and create the indexes now (``False``: at the first
            write; used to check options without a server).

    Raises:
        FalkorDBOptionError: an option is missing or invalid (named).
        ConnectorError: a mapped column is missing or of a type FalkorDB cannot hold (named);
            the server is unreachable after the retries.
    """

    def __init__(
        self,
        name: str,
        options: Mapping[str, str],
        schema: pa.Schema,
        *,
        pipeline: str = "",
        connect: bool = True,
    ) -> None:
        for key in options:
            if key not in FALKORDB_OPTIONS:
                raise FalkorDBOptionError(
                    key,
                    f"unknown option of the falkordb sink; its options: {', '.join(FALKORDB_OPTIONS)}",
                )
        self.name = name
        self.pipeline = pipeline
        self.schema = schema
        self.url = options.get("url") or os.environ.get("FLIGHT_SERVE_FALKORDB_URL") or DEFAULT_URL
        self.graph_name = options.get("graph") or name
        self.mapping = GraphMapping.from_options(options)
        self.batch_rows = self._int_option(
            options, "batch_rows", DEFAULT_BATCH_ROWS, 1, _MAX_BATCH_ROWS
        )
        self.max_retries = self._int_option(options, "max_retries", 5, 0, 100)
        self.timestamps = self._choice(options, "timestamps", ("iso", "epoch_ms"))
        self.non_finite = self._choice(options, "non_finite", ("null", "reject"))
        m = self.mapping
        for column in (*m.key_columns, *(m.properties or ()), *m.accumulate):
            if schema.get_field_index(column) < 0:
                raise ConnectorError(
                    f"sink {name}: no column {column!r} in its input (columns: {', '.join(schema.names)})"
                )
        for column in m.key_columns:
            kind = schema.field(column).type
            if pa.types.is_struct(kind) or pa.types.is_list(kind) or pa.types.is_large_list(kind):
                raise ConnectorError(
                    f"sink {name}: key column {column!r} is {kind}; a key must be a scalar"
                )
        self.property_columns = m.property_columns(schema)
        for column in (*m.key_columns, *self.property_columns):
            _check_type(schema.field(column).type, column)
        for column in m.accumulate:
            if column not in self.property_columns:
                raise FalkorDBOptionError(
                    "accumulate", f"accumulate column {column!r} is not a property column"
                )
            kind = schema.field(column).type
            if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
                raise FalkorDBOptionError(
                    "accumulate", f"accumulate column {column!r} is {kind}, not a number"
                )
        self._columns = (*m.key_columns, *self.property_columns)
        self._resolve: list[tuple[tuple[str, str], str, str]] = []
        self._query = self._merge_query = self._head = self._merge_head = self._var = ""
        self._sets: list[tuple[str | None, str]] = []
        self._upserts: dict[frozenset[str], str] = {}
        self._nullable = frozenset(
            n for n in _flat_names(self.schema, self.property_columns)
            if n not in _flat_names(self.schema, m.accumulate)
        )  # fmt: skip
        self._build_queries()
        self._ids: dict[tuple[str, str], dict[str, int]] = {}
        self._graph: Any = None
        self._db: Any = None
        self._seq: dict[int, int] = {}
        self.stats = _Stats()
        if connect:
            self.connect()

    # --- options --------------------------------------------------------------------------------

    @staticmethod
    def _int_option(options: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
        if key not in options:
            return default
        try:
            value = int(options[key])
        except ValueError:
            raise FalkorDBOptionError(
                key, f"{key}: expected a whole number, got {options[key]!r}"
            ) from None
        if not low <= value <= high:
            raise FalkorDBOptionError(key, f"{key}: must be between {low} and {high}, got {value}")
        return value

    @staticmethod
    def _choice(options: Mapping[str, str], key: str, allowed: tuple[str, ...]) -> str:
        value = options.get(key, allowed[0]).lower()
        if value not in allowed:
            raise FalkorDBOptionError(
                key,
                f"{key}: expected {' or '.join(repr(a) for a in allowed)}, got {options[key]!r}",
            )
        return value

    # --- the queries ----------------------------------------------------------------------------

    def _endpoints(self) -> list[tuple[str, str, str]]:
        """``(label, key property, column)`` of the nodes each row resolves: the node itself,
        or an edge's source and target."""
        m = self.mapping
        if m.kind == "node":
            return [(m.label, m.key[0], m.key[0])]
        assert m.source is not None
        assert m.target is not None
        return [(m.source[0], m.source[2], m.source[1]), (m.target[0], m.target[2], m.target[1])]

    def _build_queries(self) -> None:
        m = self.mapping
        what = f"sink {self.name}"
        names = _flat_names(self.schema, self._columns)
        ends = self._endpoints()
        # $rows of the upsert: the endpoints' node ids, then the key columns, then properties
        index = {n: i + len(ends) for i, n in enumerate(names)}

        def prop(name: str) -> str:
            return backquote(name, f"{what}: column {name!r}")

        def ref(column: str) -> str:
            return f"row[{index[column]}]"

        variables = ["n"] if m.kind == "node" else ["s", "t"]
        self._resolve = []
        checks = []
        seeks = []
        for i, ((label, key, column), var) in enumerate(zip(ends, variables, strict=True)):
            lab = backquote(label, f"{what}: label {label!r}")
            kp = backquote(key, f"{what}: key property {key!r}")
            self._resolve.append(
                (
                    (label, key),
                    # MERGE emits matched rows before created ones: return each key's index
                    "UNWIND range(0, size($keys) - 1) AS i WITH i, $keys[i] AS k "
                    f"MERGE (n:{lab} {{{kp}: k}}) RETURN i, id(n)",
                    "UNWIND $pairs AS p WITH p, p[0] AS nid MATCH (n) WHERE id(n) = nid "
                    f"AND n:{lab} AND n.{kp} = p[1] RETURN count(n)",
                )
            )
            seeks.append(f"MATCH ({var}) WHERE id({var}) = id{i}")
            checks.append(f"{var}:{lab} AND {var}.{kp} = {ref(column)}")
        ids = ", ".join(f"row[{i}] AS id{i}" for i in range(len(ends)))
        # {carry}: the marker node ``m`` in the marked form of the query (see _marked)
        head = f"UNWIND $rows AS row WITH {{carry}}row, {ids} {' '.join(seeks)} "
        head += f"WITH {{carry}}row, {', '.join(variables)} WHERE {' AND '.join(checks)}"
        if m.kind == "node":
            var = "n"
            key = m.key[0]
            merge = (
                f"MERGE (n:{backquote(m.label, what + ': node_label')} {{{prop(key)}: {ref(key)}}})"
            )
        else:
            var = "r"
            edge_props = ", ".join(f"{prop(k)}: {ref(k)}" for k in m.key)
            edge = (
                f"[r:{backquote(m.label, what + ': edge_type')}"
                f"{' {' + edge_props + '}' if edge_props else ''}]"
            )
            head += f" MERGE (s)-{edge}->(t)"
            assert m.source is not None
            assert m.target is not None
            (sl, sc, sk), (tl, tc, tk) = m.source, m.target
            merge = (
                f"MERGE (s:{backquote(sl, what)} {{{backquote(sk, what)}: {ref(sc)}}}) "
                f"MERGE (t:{backquote(tl, what)} {{{backquote(tk, what)}: {ref(tc)}}}) "
                f"MERGE (s)-{edge}->(t)"
            )
        self._sets = []
        accumulate = set(_flat_names(self.schema, m.accumulate))
        for name in _flat_names(self.schema, self.property_columns):
            target = f"{var}.{prop(name)}"
            if name in accumulate:  # never null: never a removal
                item = f"{target} = coalesce({target}, 0) + coalesce({ref(name)}, 0)"
                self._sets.append((None, item))
            else:
                self._sets.append((name, f"{target} = {ref(name)}"))
        self._var = var
        self._head = head
        # the same upsert for rows without node ids (each MERGE an index scan): the one-query-
        # per-row way, kept as the benchmark's baseline and for readers of the plan
        self._merge_head = f"UNWIND $rows AS row {merge}"
        self._query = self._upsert_text(self._nullable)
        self._merge_query = self._merge_text(self._nullable)

    def _set_clauses(self, nulls: frozenset[str]) -> str:
        """The ``SET`` of the property columns, for rows whose columns ``nulls`` may hold nulls
        (the others hold none).

        Works around FalkorDB #1787 (4.16, fixed in 4.20): one update operation that removes
        two or more properties of one entity (``SET x.a = null, x.b = null``, ``REMOVE x.a,
        x.b``, or two ``SET`` clauses in a row) removes the wrong ones and drops other values
        it sets. So the columns without nulls and at most one column with nulls share the first
        ``SET``; every other column with nulls gets its own ``SET`` behind a ``WITH`` (each a
        separate operation): no operation removes more than one property of an entity (the
        batch holds each entity once: :meth:`_dedupe`)."""
        first = [item for name, item in self._sets if name not in nulls]
        alone = [item for name, item in self._sets if name in nulls]
        first += alone[:1]
        clauses = [f"SET {', '.join(first)}"] if first else []
        clauses += [f"SET {item}" for item in alone[1:]]
        return "".join(
            f" WITH {{carry}}row, {self._var} {c}" if i else f" {c}" for i, c in enumerate(clauses)
        )

    def _upsert_text(self, nulls: frozenset[str]) -> str:
        """The upsert (``{carry}`` left in) for rows with nulls only in columns ``nulls``."""
        text = self._upserts.get(nulls)
        if text is None:
            if len(self._upserts) >= _MAX_CACHED_QUERIES:
                self._upserts.clear()
            text = self._upserts[nulls] = self._head + self._set_clauses(nulls)
        return text

    def _merge_text(self, nulls: frozenset[str]) -> str:
        """:attr:`merge_query` for rows with nulls only in columns ``nulls``."""
        return (self._merge_head + self._set_clauses(nulls)).replace("{carry}", "")

    def _nulls(self, part: list[_Arr]) -> frozenset[str]:
        """The property columns of a batch (literal text, :meth:`literal_columns`) holding a
        null."""
        flat = _flat_names(self.schema, self._columns)
        return frozenset(
            name
            for name, text in zip(flat, part, strict=True)
            if name in self._nullable and pc.any(pc.equal(text, _NULL)).as_py()
        )

    @property
    def upsert_query(self) -> str:
        """The Cypher text of one batch's upsert. ``$rows``: a list of rows, each a list of the
        endpoints' node ids (from the resolve step), the key columns' values, then the property
        columns' values (struct fields flattened). This form is right for nulls in any column;
        :meth:`write` uses the shorter one for the columns a batch has nulls in
        (:meth:`_set_clauses`)."""
        return self._query.replace("{carry}", "")

    @property
    def merge_query(self) -> str:
        """The classic single-step upsert (every MERGE by key through the index). ``$rows``
        as for :attr:`upsert_query` (the node ids are ignored)."""
        return self._merge_query

    def _marked(self, nulls: frozenset[str] | None = None) -> str:
        """The upsert under the marker: rows pass only if the marker is below ``($epoch,
        $seq)``; the marker moves there after the rows are written, in the same query. No
        result row: the batch was applied before (or every row lost its nodes). ``nulls``: the
        columns the batch has nulls in (``None``: any)."""
        upsert = self._upsert_text(self._nullable if nulls is None else nulls)
        return (
            f"MERGE (m:{MARKER_LABEL} {{pipeline: $pipeline, sink: $sink}}) "
            "WITH m WHERE m.epoch IS NULL OR m.epoch < $epoch "
            "OR (m.epoch = $epoch AND m.seq < $seq) "
            f"{upsert.replace('{carry}', 'm, ')} "
            "WITH m, count(*) AS applied SET m.epoch = $epoch, m.seq = $seq RETURN applied"
        )

    # --- connection -----------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection (if not open) and create the merge-key indexes.

        Raises:
            GraphStoreError: the server is unreachable after the retries.
            ConnectorError: the server refused the url's user or password (not retried).
        """
        if self._graph is not None:
            return

        def open_graph() -> None:
            import falkordb
            import redis

            # FalkorDB.from_url's own steps (falkor:// is redis://), with the pool in hand: a
            # refused login leaves its socket open in the pool otherwise (until collected)
            scheme, sep, rest = self.url.partition("://")
            url = f"{_REDIS_SCHEME.get(scheme, scheme)}{sep}{rest}"
            client = redis.from_url(url, decode_responses=True)
            try:
                self._db = falkordb.FalkorDB(connection_pool=client.connection_pool)
            except BaseException:
                client.connection_pool.disconnect()
                raise
            self._graph = self._db.select_graph(self.graph_name)

        self._retry(open_graph, "connect")
        for statement in self.index_statements():
            self._run(statement, None, ignore=("already indexed",))

    def index_statements(self) -> list[str]:
        """``CREATE INDEX`` statements for every merge key (and the marker)."""
        m = self.mapping
        out = []
        if m.kind == "node":
            out.append(
                f"CREATE INDEX FOR (n:{backquote(m.label, 'node_label')}) ON (n.{backquote(m.key[0], 'node_key')})"
            )
        else:
            assert m.source is not None
            assert m.target is not None
            ends = {(m.source[0], m.source[2]), (m.target[0], m.target[2])}
            for label, key in sorted(ends):
                out.append(
                    f"CREATE INDEX FOR (n:{backquote(label, 'label')}) ON (n.{backquote(key, 'key')})"
                )
            if m.key:
                keys = ", ".join(f"r.{backquote(k, 'edge_key')}" for k in m.key)
                out.append(
                    f"CREATE INDEX FOR ()-[r:{backquote(m.label, 'edge_type')}]-() ON ({keys})"
                )
        out.append(f"CREATE INDEX FOR (m:{MARKER_LABEL}) ON (m.pipeline)")
        return out

    def _retry(self, call: Callable[[], Any], what: str) -> Any:
        delay = 0.1
        for attempt in range(self.max_retries + 1):
            try:
                return call()
            except Exception as exc:
                if _is_refused_login(exc):  # the url's user or password: retrying cannot help
                    raise ConnectorError(
                        f"sink {self.name}: FalkorDB at {_masked(self.url)} refused the login "
                        f"({what}): {exc}; check the user and password in the sink's url option"
                    ) from exc
                if not _is_connection_error(exc) or attempt == self.max_retries:
                    if _is_connection_error(exc):
                        raise GraphStoreError(
                            f"sink {self.name}: FalkorDB at {_masked(self.url)} unreachable after "
                            f"{self.max_retries} retries ({what}): {exc}"
                        ) from exc
                    raise
                self.stats.retries += 1
                log.warning(
                    "falkordb sink %s: %s failed (%s); retry %d in %.1f s",
                    self.name, what, exc, attempt + 1, delay,
                )  # fmt: skip
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def _run(self, query: str, header: str | None, *, ignore: tuple[str, ...] = ()) -> Any:
        import redis

        text = query if header is None else f"CYPHER {header} {query}"

        def call() -> Any:
            return self._graph.query(text)

        try:
            return self._retry(call, "query")
        except redis.exceptions.ResponseError as exc:
            if any(s in str(exc) for s in ignore):
                return None
            raise ConnectorError(f"sink {self.name}: FalkorDB refused the query: {exc}") from exc

    # --- writing --------------------------------------------------------------------------------

    def _dedupe(self, table: pa.Table) -> pa.Table:
        keys = list(self.mapping.key_columns)
        for column in keys:
            nulls = table.column(column).null_count
            if nulls:
                raise ConnectorError(
                    f"sink {self.name}: key column {column!r} is null in {nulls} row(s); MERGE "
                    "cannot match on null: filter them (WHERE … IS NOT NULL) in the query"
                )
            values = table.column(column)
            if pa.types.is_floating(values.type):
                bad = int(pc.sum(pc.cast(pc.invert(pc.is_finite(values)), pa.int64())).as_py() or 0)
                if bad:  # converted to null (non_finite) they would fail the MERGE
                    raise ConnectorError(
                        f"sink {self.name}: key column {column!r} is NaN or infinite in {bad} "
                        "row(s); MERGE cannot match on them: filter them in the query"
                    )
        if table.num_rows < 2:
            return table
        indexed = table.append_column("__row", pa.array(range(table.num_rows), pa.int64()))
        aggs: list[Any] = [("__row", "max")]
        aggs += [(c, "sum") for c in self.mapping.accumulate]
        grouped = indexed.group_by(keys, use_threads=False).aggregate(aggs)
        if grouped.num_rows == table.num_rows:
            return table
        grouped = grouped.sort_by("__row_max")
        last = table.take(grouped.column("__row_max"))
        for column in self.mapping.accumulate:
            i = last.schema.get_field_index(column)
            summed = grouped.column(f"{column}_sum").cast(last.schema.field(column).type)
            last = last.set_column(i, last.schema.field(column), summed)
        return last

    def literal_columns(self, table: pa.Table) -> list[_Arr]:
        """The key columns, then the property columns, of ``table`` (deduplicated first; struct
        fields flattened) as arrays of Cypher literal text. Raises what :func:`cypher_columns`
        raises."""
        table = self._dedupe(table.select(list(self._columns)))
        return [
            text
            for _, text in cypher_columns(
                table, timestamps=self.timestamps, non_finite=self.non_finite
            )
        ]

    def _node_ids(self, columns: list[_Arr]) -> list[_Arr]:
        """Resolve every endpoint key of the batch to its node id (creating missing nodes):
        cached ids are verified in one query (id seeks), unknown keys are merged through the
        index; returns one id-literal array per endpoint."""
        flat = _flat_names(self.schema, self._columns)
        out: list[_Arr] = []
        for (label, _key, column), (group, resolve, verify) in zip(
            self._endpoints(), self._resolve, strict=True
        ):
            keys: list[str] = columns[flat.index(column)].to_pylist()
            cache = self._ids.setdefault(group, {})
            distinct = list(dict.fromkeys(keys))
            known = [k for k in distinct if k in cache]
            if known:
                pairs = "[" + ",".join(f"[{cache[k]},{k}]" for k in known) + "]"
                result = self._run(verify, f"pairs={pairs}")
                if result is None or result.result_set[0][0] != len(known):
                    log.info("falkordb sink %s: cached node ids of %s are stale", self.name, label)
                    cache.clear()
            unknown = [k for k in distinct if k not in cache]
            for start in range(0, len(unknown), self.batch_rows):
                part = unknown[start : start + self.batch_rows]
                result = self._run(resolve, "keys=[" + ",".join(part) + "]")
                found = {int(i): int(node) for i, node in result.result_set}
                if len(found) != len(part):
                    raise ConnectorError(
                        f"sink {self.name}: resolving {len(part)} {label} nodes returned "
                        f"{len(found)} ids"
                    )
                cache.update((k, found[i]) for i, k in enumerate(part))
            if len(cache) > _MAX_CACHED_IDS:
                self._ids[group] = {k: cache[k] for k in distinct}
                cache = self._ids[group]
            out.append(pa.array([str(cache[k]) for k in keys], pa.string()))
        return out

    def write(self, data: pa.RecordBatch | pa.Table, *, epoch: int | None = None) -> WriteResult:
        """Upsert ``data``: deduplicated, converted, endpoints resolved, then one query per
        ``batch_rows`` rows.

        Each batch is two steps: (1) the nodes the rows touch are merged by key through the
        index (``UNWIND … MERGE (n:Label {key: k}) RETURN i, id(n)``, idempotent, outside
        the marker; ids already seen by this sink are only verified, by id seeks); (2) one
        ``UNWIND $rows`` query finds each row's nodes by id, checks their label and key, and
        merges and sets the row (with ``epoch``: under the marker, atomically).

        Args:
            data: rows with the sink's schema.
            epoch: the checkpoint epoch these rows belong to; with it every query is guarded by
                the marker (a batch already applied is skipped). Batches of one epoch are
                numbered 0, 1, … across the writes of that epoch, so an epoch must be written
                again exactly as before (the same rows, in the same writes) to be recognised.

        Raises:
            ConnectorError: a value that cannot be stored (named column), a query refused, the
                server unreachable after the retries, or nodes deleted while being written.
        """
        table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
        if self._graph is None:
            self.connect()
        queries = skipped = written = 0
        retries = self.stats.retries
        columns = self.literal_columns(table) if table.num_rows else []
        total = len(columns[0]) if columns else 0
        for start in range(0, total, self.batch_rows):
            part = [c.slice(start, self.batch_rows) for c in columns]
            joined = pc.binary_join_element_wise(*self._node_ids(part), *part, ",")
            chunk = joined.to_pylist()
            payload = "[[" + "],[".join(chunk) + "]]"
            nulls = self._nulls(part)
            if epoch is None:
                upsert = self._upsert_text(nulls).replace("{carry}", "")
                result = self._run(
                    f"{upsert} WITH count(*) AS applied RETURN applied",
                    f"rows={payload}",
                )
            else:
                seq = self._seq.get(epoch, 0)
                self._seq = {epoch: seq + 1}
                header = (
                    f"pipeline={_string(self.pipeline)} sink={_string(self.name)} "
                    f"epoch={epoch} seq={seq} rows={payload}"
                )
                result = self._run(self._marked(nulls), header)
            applied = result.result_set[0][0] if result is not None and result.result_set else 0
            if applied == len(chunk):
                written += len(chunk)
            elif applied == 0 and epoch is not None and (self.marker() or (0, -1)) >= (epoch, seq):
                skipped += 1  # a replay of a batch the marker has
            else:
                raise ConnectorError(
                    f"sink {self.name}: {len(chunk) - applied} of {len(chunk)} rows found their "
                    "nodes gone (deleted while the sink wrote them); the batch is partly written"
                )
            queries += 1
        self.stats.queries += queries
        self.stats.skipped += skipped
        self.stats.rows += written
        return WriteResult(table.num_rows, written, queries, skipped, self.stats.retries - retries)

    def marker(self) -> tuple[int, int] | None:
        """The ``(epoch, seq)`` of the last batch applied with an epoch, or ``None``."""
        if self._graph is None:
            self.connect()
        result = self._run(
            f"MATCH (m:{MARKER_LABEL} {{pipeline: $pipeline, sink: $sink}}) RETURN m.epoch, m.seq",
            f"pipeline={_string(self.pipeline)} sink={_string(self.name)}",
        )
        if result is None or not result.result_set or result.result_set[0][0] is None:
            return None
        epoch, seq = result.result_set[0]
        return int(epoch), int(seq)

    def reset_marker(self, epoch: int) -> None:
        """Set the marker to the end of ``epoch`` (``0``: before every epoch), so that epochs
        after it are written again: a fresh run, or a resume from an older checkpoint."""
        if self._graph is None:
            self.connect()
        self._run(
            f"MERGE (m:{MARKER_LABEL} {{pipeline: $pipeline, sink: $sink}}) "
            "SET m.epoch = $epoch, m.seq = $seq",
            f"pipeline={_string(self.pipeline)} sink={_string(self.name)} epoch={epoch} "
            f"seq={_INT64_MAX if epoch else -1}",
        )
        self._seq = {}

    def explain(self, which: Literal["resolve", "upsert", "merge"] = "resolve") -> list[str]:
        """``GRAPH.EXPLAIN`` of one of the sink's queries, as plan lines: ``resolve`` (the
        first endpoint's key merge, e.g. ``Node By Index Scan | (n:Airport)``), ``upsert``
        (the batch upsert by node id) or ``merge`` (:attr:`merge_query`)."""
        if self._graph is None:
            self.connect()
        width = len(self._endpoints()) + len(_flat_names(self.schema, self._columns))
        row = "[" + ",".join(["0"] * width) + "]"
        query = {
            "resolve": f"CYPHER keys=[0] {self._resolve[0][1]}",
            "upsert": f"CYPHER rows=[{row}] {self.upsert_query}",
            "merge": f"CYPHER rows=[{row}] {self._merge_query}",
        }[which]
        plan = self._retry(
            lambda: self._db.connection.execute_command("GRAPH.EXPLAIN", self.graph_name, query),
            "explain",
        )
        return [str(line) for line in plan]

    def end_input(self) -> None:
        """Nothing to mark at the end of input (:class:`~flight_serve.connectors.base.Sink`)."""

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._db is not None:
            try:
                self._db.connection.close()
            except Exception as exc:
                log.debug("falkordb sink %s: close: %s", self.name, exc)
        self._db = self._graph = None


def _masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages and logs.

    >>> _masked("falkor://ops:pw@127.0.0.1:6379")
    'falkor://ops:***@127.0.0.1:6379'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
