"""The pipeline side of the ``flight`` connector: its sources and sinks built from ``WITH (…)``.

* a **source** with ``ticket`` / ``ticket_base64`` is one DoGet of another server
  (:class:`~flight_serve.connectors.flight.FlightTicketSource`); else it tails a stream: another
  server's (``server`` given, or a run in this process: :class:`~flight_serve.connectors.flight.FlightSource`)
  or, in a server pipeline, the server's own (:class:`~flight_serve.pipelines.store_io.StoreSource`).
  A checkpointed run resumes it from its checkpoint's offsets, and checks that they still name
  the rows they named (the stream was not re-created, retention kept them);
* a **sink** writes a stream of another server (``server`` given) or, in a server pipeline, the
  server's own; a run in this process must name its server.

Errors: :class:`~flight_serve.errors.PipelineSQLError` at the option or statement at fault;
:class:`~flight_serve.errors.ExternalError` (UNAVAILABLE) when the server fails;
:class:`~flight_serve.errors.CheckpointError` when a checkpoint's offset cannot be resumed.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from flight_serve.connectors.base import Source
from flight_serve.connectors.flight import (
    DEFAULT_SERVER,
    FlightClientAuth,
    FlightSource,
    FlightTicketSource,
    server_uri_problem,
)
from flight_serve.connectors.options import FLIGHT_AUTH_OPTIONS
from flight_serve.errors import CheckpointError, ConnectorError, ExternalError
from flight_serve.pipelines.dialect import sql_error
from flight_serve.pipelines.pipeline import Option, RelationDef, SinkDef
from flight_serve.pipelines.slots import ConnectorHost, SinkSlot
from flight_serve.pipelines.store_io import StoreSource

__all__ = ["FLIGHT_AUTH_OPTIONS", "flight_auth", "flight_sink_slot", "flight_source"]

# FLIGHT_AUTH_OPTIONS: the options of a ``flight`` connector with a ``server`` (TLS trust and
# identity, bearer token), in connectors.options, which the connector registry reads alone


def _schema_of(text: str) -> pa.Schema | None:
    """A schema a checkpoint recorded (Arrow IPC, base64), or ``None`` if it does not read."""
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except (ValueError, pa.ArrowException):
        return None


def flight_auth(options: dict[str, Option], base_dir: Path) -> FlightClientAuth | None:
    """The ``tls_ca``, ``tls_cert`` / ``tls_key`` (PEM files; relative paths start at the
    pipeline's directory, ``base_dir``) and ``token_env`` (the name of an environment variable
    of the process running the pipeline that holds a bearer token) options of a ``flight``
    connector; ``None`` if none is given.

    Raises:
        PipelineSQLError: such an option without ``server``, ``tls_cert`` without
            ``tls_key`` (or the reverse), a file that cannot be read, an unset variable.
    """
    given = [key for key in FLIGHT_AUTH_OPTIONS if key in options]
    if not given:
        return None
    if "server" not in options:
        raise options[given[0]].error(
            f"{given[0]} is for another server: give its server = 'grpc+tls://host:port' too"
        )
    if ("tls_cert" in options) != ("tls_key" in options):
        key = "tls_cert" if "tls_cert" in options else "tls_key"
        raise options[key].error("tls_cert and tls_key go together (mutual TLS)")
    pem: dict[str, str] = {}
    for key in ("tls_ca", "tls_cert", "tls_key"):
        if key in options:
            path = Path(options[key].text).expanduser()
            path = path if path.is_absolute() else base_dir / path
            try:
                pem[key] = path.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise options[key].error(f"cannot read {path}: {exc}") from None
    token = None
    if "token_env" in options:
        name = options["token_env"].text
        token = os.environ.get(name)
        if not token:
            raise options["token_env"].error(
                f"the environment variable {name} (the bearer token) is not set or empty"
            )
    return FlightClientAuth(pem.get("tls_ca"), pem.get("tls_cert"), pem.get("tls_key"), token)


def _auth(options: dict[str, Option], host: ConnectorHost) -> FlightClientAuth | None:
    """:func:`flight_auth` of a connector's options; without a ``server`` option, a server's
    job on Ray authenticates to that server with the token it was given."""
    if "server" not in options and host.stream_server is not None:
        token = host.stream_server[1]
        return FlightClientAuth(token=token) if token else None
    return flight_auth(options, host.plan.base_dir)


def _server(options: dict[str, Option], host: ConnectorHost | None = None) -> str:
    """The ``server`` option of a flight connector (default: the host's ``stream_server``, a
    server's job on Ray; else :data:`DEFAULT_SERVER`).

    Raises:
        PipelineSQLError: not a Flight URI (``http://…``), pointing at the value.
    """
    if "server" not in options:
        if host is not None and host.stream_server is not None:
            return host.stream_server[0]
        return DEFAULT_SERVER
    problem = server_uri_problem(options["server"].text)
    if problem is not None:
        raise options["server"].error(problem)
    return options["server"].text


def _ticket(relation: RelationDef) -> bytes | None:
    """The ``ticket`` (UTF-8 text) or ``ticket_base64`` option of a flight source."""
    options = relation.connector
    if "ticket" in options and "ticket_base64" in options:
        raise options["ticket_base64"].error("give ticket or ticket_base64, not both")
    for key in ("stream", "start_offset", "stop_at_end"):
        if key in options and ("ticket" in options or "ticket_base64" in options):
            raise options[key].error(f"a ticket source takes no {key} (it reads one DoGet)")
    if "ticket" in options:
        return options["ticket"].text.encode()
    if "ticket_base64" in options:
        option = options["ticket_base64"]
        try:
            return base64.b64decode(option.text, validate=True)
        except binascii.Error as exc:
            raise option.error(f"not base64: {exc}") from None
    return None


def _ticket_source(
    host: ConnectorHost, relation: RelationDef, ticket: bytes, rows: int
) -> FlightTicketSource:
    options = relation.connector
    server = _server(options, host)
    try:
        source = FlightTicketSource(
            server,
            ticket,
            name=relation.name,
            schema=relation.columns,
            start_rows=rows,
            auth=_auth(options, host),
        )
    except ConnectorError as exc:
        raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
    except ExternalError as exc:  # the server failed, not the SQL: it stays UNAVAILABLE
        raise exc.within(f"SOURCE {relation.name}") from exc.__cause__
    source.on_retry = host.connector_wait  # its retries show in the pipeline's status
    if (
        relation.time_column is not None
        and source.schema.get_field_index(relation.time_column) < 0
    ):
        source.close()
        raise relation.no_time_column(source.schema.names, "the DoGet")
    return source


def _run_source(
    host: ConnectorHost, relation: RelationDef, start_offset: int | None = None
) -> Source:
    """A ``flight`` source of another server: a ticket's DoGet, or a stream's tail from
    ``start_offset`` (default: the ``start_offset`` option, else 0)."""
    options = relation.connector
    ticket = _ticket(relation)
    if ticket is not None:
        return _ticket_source(host, relation, ticket, 0)
    resume_at = start_offset
    server = _server(options, host)
    stream = options["stream"].text if "stream" in options else relation.name
    start_offset = 0
    if "start_offset" in options:
        option = options["start_offset"]
        try:
            start_offset = int(option.text)
        except ValueError:
            raise option.error(f"expected a whole number, got {option.text!r}") from None
        if start_offset < 0:
            raise option.error(f"must be at least 0, got {start_offset}")
    stop_at_end = False
    if "stop_at_end" in options:
        option = options["stop_at_end"]
        if option.text.lower() not in ("true", "false"):
            raise option.error(f"expected 'true' or 'false', got {option.text!r}")
        stop_at_end = option.text.lower() == "true"
    try:
        source = FlightSource(
            server,
            stream,
            schema=relation.columns,
            start_offset=start_offset if resume_at is None else resume_at,
            stop_at_end=stop_at_end,
            auth=_auth(options, host),
        )
    except ConnectorError as exc:
        raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
    except ExternalError as exc:  # the server failed, not the SQL: it stays UNAVAILABLE
        raise exc.within(f"SOURCE {relation.name}") from exc.__cause__
    source.on_retry = host.connector_wait  # its wait for its server shows in the status
    if (
        relation.time_column is not None
        and source.schema.get_field_index(relation.time_column) < 0
    ):
        source.close()
        raise relation.no_time_column(source.schema.names, f"stream {stream}")
    return source


def flight_source(host: ConnectorHost, relation: RelationDef) -> Source:
    """The ``flight`` source ``relation`` declares (see the module docstring): in a
    checkpointed run resumed from its checkpoint's offsets; in a server pipeline without a
    ``server`` option, the server's own stream.

    Raises:
        PipelineSQLError: a bad option, a ``WATERMARK FOR`` column the stream lacks.
        ExternalError: the server failed.
        CheckpointError: the checkpoint's offset cannot be resumed (see :func:`_check_resume`).
    """
    coordinator = host.coordinator
    if coordinator is None:
        return _run_source(host, relation)
    options = relation.connector
    state = dict(coordinator.source_state(relation.name) or {})
    store = host.store
    if "server" in options or store is None:  # another server (checked for runs)
        return _remote_source(host, relation, state)
    stream = options["stream"].text if "stream" in options else relation.name
    try:
        source = StoreSource(
            store,
            stream,
            name=relation.name,
            schema=relation.columns,
            start_offset=int(state.get("offset", 0)),
            incarnation=state.get("incarnation"),
            offset_reset=coordinator.options.offset_reset,
            on_gap=host.report_gap,
            rows=int(state.get("rows", 0)),
            stream_rows=int(state["stream_rows"]) if "stream_rows" in state else None,
        )
    except ConnectorError as exc:
        raise sql_error(f"SOURCE {relation.name}: {exc}", relation.node.this) from exc
    except ExternalError as exc:  # the server failed, not the SQL: it stays UNAVAILABLE
        raise exc.within(f"SOURCE {relation.name}") from exc.__cause__
    if (
        relation.time_column is not None
        and source.schema.get_field_index(relation.time_column) < 0
    ):
        raise sql_error(
            f"WATERMARK FOR {relation.time_column}: stream {stream} has no such column "
            f"(columns: {', '.join(source.schema.names)})",
            relation.node.this,
        )
    return source


def _remote_source(host: ConnectorHost, relation: RelationDef, state: dict[str, Any]) -> Source:
    """A source on another Flight server: a ticket's DoGet, or a stream's tail, resumed from
    the checkpoint's offset (rows of the ticket, or the stream offset)."""
    if relation.columns is None and isinstance(state.get("schema"), str):
        # the columns the checkpointed run read: enough to wait for a server that is down
        relation = replace(relation, columns=_schema_of(state["schema"]))
    ticket = _ticket(relation)
    if ticket is not None:
        return _ticket_source(host, relation, ticket, int(state.get("rows", 0)))
    start = int(state["offset"]) if "offset" in state else None
    source = _run_source(host, relation, start_offset=start)
    assert isinstance(source, FlightSource)
    if source.waiting_to_open:
        # its server is unreachable now: the checks run once the source has reached it
        source.check_open = lambda opened: _check_resume(host, relation, state, opened)
        known = state.get("incarnation")  # what a checkpoint taken while it waits records
        source.incarnation = known if isinstance(known, str) else None
    else:
        try:
            first = _check_resume(host, relation, state, source)
        except CheckpointError:
            source.close()
            raise
        if first is not None:
            source.close()
            source = _run_source(host, relation, start_offset=first)
            assert isinstance(source, FlightSource)
    source.rows = int(state.get("rows", 0))
    source.reconnect_s = host.reconnect_s  # a server restarting is waited for
    return source


def _check_resume(
    host: ConnectorHost, relation: RelationDef, state: dict[str, Any], source: FlightSource
) -> int | None:
    """Whether a remote tail source can resume from the checkpoint's offset: ``None`` if it
    can; the oldest offset there is when the stream was re-created or the offset is gone and
    ``offset_reset = 'earliest'`` (the gap is reported).

    Raises:
        CheckpointError: the stream was dropped or re-created since the checkpoint, or the
            checkpoint's offset is gone (retention), without ``offset_reset = 'earliest'``.
    """
    assert host.coordinator is not None
    start = int(state["offset"]) if "offset" in state else None
    known = state.get("incarnation")
    what = f"source {relation.name} (stream {source.stream!r} on {source.server})"
    message = None
    if known is not None and source.incarnation != known:
        message = (
            f"{what}: the stream was dropped or re-created since the checkpoint "
            f"(incarnation {known}, now {source.incarnation or 'none'}); the offset {start} "
            "names nothing"
        )
        fix = "start over (cancel and submit again, or --fresh), or SET offset_reset = "
        fix += "'earliest' to read the new stream from its start"
    elif start is not None and start < source.first_offset:
        message = (
            f"{what}: the checkpoint's offset {start} is gone (retention kept offsets "
            f"{source.first_offset} and up): {source.first_offset - start} entries were "
            "never read"
        )
        fix = f"SET offset_reset = 'earliest' to go on from {source.first_offset} (the gap "
        fix += "is reported), or start over"
    if message is None:
        return None
    if host.coordinator.options.offset_reset != "earliest":
        raise CheckpointError(f"{message}. {fix}")
    first = source.first_offset
    host.report_gap(f"{message}; resuming at {first} (offset_reset = 'earliest')")
    return first


def flight_sink_slot(host: ConnectorHost, sink: SinkDef) -> SinkSlot:
    """The slot of a ``flight`` sink: another server's stream, or (a server pipeline without
    ``server``) the server's own.

    Raises:
        PipelineSQLError: a run in this process without ``server``; a bad option.
    """
    what = f"SINK {sink.name}"
    options = sink.connector
    if (
        "server" not in options
        and host.writes
        and host.store is None
        and host.stream_server is None
    ):
        raise options["connector"].error(
            f"{what}: a run in this process writes only into a server the pipeline "
            f"names: add server = '{DEFAULT_SERVER}' (the server's Flight URI) to the "
            "sink. Submitted to a server (flight-serve submit), a flight sink without "
            "a server option writes that server's own stream"
        )
    server = _server(options, host)
    stream = options["stream"].text if "stream" in options else sink.name
    writer = options["writer"].text if "writer" in options else sink.name
    own = "server" not in options and host.store is not None
    return SinkSlot(
        sink,
        "flight",
        "arrow",
        None,
        flight=(server, stream, writer),
        flight_auth=_auth(options, host),
        store_writer=(stream, writer) if own else None,
    )
