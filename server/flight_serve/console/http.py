"""The console's HTTP server: the page (``/``, ``/static/...``) and its JSON API (``/api/v1/...``,
described by ``schemas/console-openapi.yaml``), on the standard library's
:class:`~http.server.ThreadingHTTPServer`.

Auth: with a tokens file every API call needs ``Authorization: Bearer <token>`` (with a users
file, ``Basic`` with a user and password works too, with every role); a missing or unknown token
is 401, a known token without the role is 403, naming the role. Reading needs ``read``; the
pipeline actions (checkpoint, cancel) need ``admin``, as their Flight actions do. Without
credentials configured the console is open, like the Flight port. The page and its static
files need no token: the page asks for one when the API answers 401.

TLS: given the server's certificate and key the console speaks HTTPS only.

Errors are ``{"error": message}`` with 400 (bad input, a query DataFusion refuses), 401, 403,
404 (no such pipeline or stream), 405, 413 (a body above 1 MiB), 503 (the memory budget is full).
"""

from __future__ import annotations

import base64
import hmac
import io
import json
import logging
import ssl
import threading
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from flight_serve.console.samples import Sampler
from flight_serve.console.source import ConsoleSource, table_rows
from flight_serve.errors import (
    FlightServeError,
    InvalidInputError,
    NotFoundError,
    OverloadError,
    QueryError,
    StreamNotFoundError,
    TicketError,
)
from flight_serve.flight.ops.roles import TlsFiles, TokenGrant

__all__ = ["STATIC_DIR", "ConsoleServer"]

log = logging.getLogger("flight_serve.console")

STATIC_DIR = Path(__file__).parent / "static"
MAX_BODY_BYTES = 1024 * 1024
#: Rows of a SQL result sent as JSON (the row count is always the whole result's).
MAX_RESULT_ROWS = 1000
MAX_TAIL_ROWS = 1000
#: Newest rows a page of rows may leave out (``skip``: paging back through late rows).
MAX_SKIP_ROWS = 1_000_000
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
_ALL_ROLES = frozenset({"read", "write", "admin"})


class ApiError(Exception):
    """An API answer other than 200: its status and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Server(ThreadingHTTPServer):
    """A threading HTTP server; with ``context``, each connection's TLS handshake runs on its
    own thread (a client that never completes one holds only its thread, for at most
    :data:`HANDSHAKE_TIMEOUT_S`)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, context: ssl.SSLContext | None) -> None:
        super().__init__(address, handler)
        self.context = context

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            wrapped = self.context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # not TLS, a refused certificate, or too slow: drop the connection
        try:
            wrapped.settimeout(None)
            super().finish_request(wrapped, client_address)
        finally:
            self.shutdown_request(wrapped)  # the wrapper owns the connection now


HANDSHAKE_TIMEOUT_S = 10.0


class _Caller:
    def __init__(self, name: str, roles: frozenset[str]) -> None:
        self.name = name
        self.roles = roles


class ConsoleServer:
    """The console on ``host:port`` (0: a free port), serving ``source`` with ``sampler``'s
    plots. Runs on its own threads from :meth:`start` to :meth:`stop`.

    Args:
        tokens: the server's tokens (``None``: no tokens file).
        users: the server's users (``None``: no users file).
        tls: the server's certificate and key: HTTPS.

    Raises:
        OSError: the port cannot be bound. StorageError-free: nothing is opened on disk.
    """

    def __init__(
        self,
        source: ConsoleSource,
        sampler: Sampler,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tokens: Mapping[str, TokenGrant] | None = None,
        users: Mapping[str, str] | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.source = source
        self.sampler = sampler
        self.tokens = tokens
        self.users = users
        self.scheme = "https" if tls is not None else "http"
        handler = _handler_class(self)
        context = None
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls.cert), str(tls.key))
            if tls.client_ca is not None:
                context.load_verify_locations(str(tls.client_ca))
                context.verify_mode = ssl.CERT_REQUIRED
        self._http = _Server((host, port), handler, context)
        self.host = host
        self.port = int(self._http.server_address[1])
        self._thread = threading.Thread(
            target=self._http.serve_forever, name="flight-serve-console", daemon=True
        )

    @property
    def url(self) -> str:
        """``http(s)://host:port/``."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}/"

    def start(self) -> None:
        """Start sampling and serving."""
        self.sampler.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and sampling (waits for both)."""
        self._http.shutdown()
        self._http.server_close()
        self.sampler.stop()

    def __enter__(self) -> ConsoleServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- auth ---------------------------------------------------------------------------------

    def caller(self, authorization: str | None) -> _Caller:
        """Who sends ``authorization`` (401 when the console needs credentials and these are
        missing or unknown)."""
        if self.tokens is None and self.users is None:
            return _Caller("anonymous", _ALL_ROLES)
        if authorization:
            kind, _, value = authorization.partition(" ")
            value = value.strip()
            if kind.lower() == "bearer" and self.tokens is not None:
                for token, grant in self.tokens.items():
                    if hmac.compare_digest(token.encode(), value.encode()):
                        return _Caller(grant.name, grant.roles)
            if kind.lower() == "basic" and self.users is not None:
                try:
                    user, _, password = base64.b64decode(value).decode().partition(":")
                except (ValueError, UnicodeDecodeError):
                    user, password = "", ""
                known = self.users.get(user)
                if known is not None and hmac.compare_digest(known.encode(), password.encode()):
                    return _Caller(user, _ALL_ROLES)
            raise ApiError(401, "unknown token or credentials")
        raise ApiError(401, "this server needs a token: send Authorization: Bearer <token>")

    # --- the API --------------------------------------------------------------------------------

    def api(self, method: str, path: str, query: dict[str, list[str]], body: bytes,
            authorization: str | None) -> tuple[int, str, bytes, dict[str, str]]:  # fmt: skip
        """Answer one API call: ``(status, content type, body, extra headers)``."""
        caller = self.caller(authorization)
        parts = [unquote(p) for p in path.strip("/").split("/")][2:]  # after api/v1
        route = _ROUTES.get((method, _shape(parts)))
        if route is None:
            if any(shape == _shape(parts) for _, shape in _ROUTES):
                raise ApiError(405, f"{method} is not allowed on {path}")
            raise ApiError(404, f"no such API path: {path}")
        need, handler = route
        if need not in caller.roles:
            raise ApiError(403, f"this token lacks the {need} role that {method} {path} needs")
        result = handler(self, parts, query, body, caller)
        if isinstance(result, tuple):
            return result
        return 200, "application/json", json.dumps(result).encode(), {}


def _shape(parts: list[str]) -> tuple[str, ...]:
    """A path's route key: ``pipelines/<id>/logs`` is ``("pipelines", "*", "logs")``."""
    if len(parts) >= 2 and parts[0] in ("pipelines", "streams"):
        return (parts[0], "*", *parts[2:])
    return tuple(parts)


def _int(query: dict[str, list[str]], key: str, default: int, low: int, high: int) -> int:
    values = query.get(key)
    if not values:
        return default
    try:
        value = int(values[0])
    except ValueError:
        raise ApiError(400, f"{key} must be an integer, got {values[0]!r}") from None
    if not low <= value <= high:
        raise ApiError(400, f"{key} must be from {low} to {high}, got {value}")
    return value


def _float(query: dict[str, list[str]], key: str) -> float | None:
    values = query.get(key)
    if not values:
        return None
    try:
        value = float(values[0])
    except ValueError:
        raise ApiError(400, f"{key} must be a number, got {values[0]!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ApiError(400, f"{key} must be a finite number, got {values[0]!r}")
    return value


def _json_body(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    return value


# --- handlers -----------------------------------------------------------------------------------


def _whoami(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    return {
        "name": caller.name,
        "roles": sorted(caller.roles),
        "auth": c.tokens is not None or c.users is not None,
    }


def _lag_row(c: ConsoleServer, entry: dict[str, Any]) -> dict[str, Any]:
    pid = str(entry["id"])
    status = c.source.status(pid)
    checkpoint = status.get("last_checkpoint") or {}
    return {
        "id": pid,
        "name": status["name"],
        "state": status["state"],
        "watermark": status.get("watermark"),
        "watermark_lag_s": status.get("watermark_lag_s"),
        "rows_in": int(status.get("rows_in") or 0),
        "rows_per_s": c.sampler.rate(pid) if status["state"] == "running" else None,
        "late_rows": sum(int(v) for v in (status.get("late_rows") or {}).values()),
        "open_panes": int(status.get("open_panes") or 0),
        "epoch": checkpoint.get("epoch"),
        "last_checkpoint_at": checkpoint.get("taken_at"),
        "waiting": status.get("waiting"),
        "last_error": status.get("last_error") or None,
        "submitted_at": status.get("submitted_at"),
    }


def _pipelines(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    rows = []
    for entry in c.source.pipelines():
        try:
            rows.append(_lag_row(c, entry))
        except NotFoundError:
            continue
    return {"pipelines": rows}


def _pipeline(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    pid = parts[1]
    status = c.source.status(pid)
    return {
        "status": status,
        "summary": _lag_row(c, {"id": pid}),
        "sql": c.source.sql(pid),
        "graph": c.source.graph(pid, status),
        "partitions": c.source.partitions(pid),
        "late_outputs": c.source.late_outputs(pid, status),
    }


def _samples(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    pid = parts[1]
    c.source.status(pid)  # 404 for an unknown id
    return {"interval_s": c.sampler.interval_s, "samples": c.sampler.samples(pid, _float(q, "since"))}


def _checkpoints(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    pid = parts[1]
    status = c.source.status(pid)
    seen = c.sampler.checkpoints(pid)
    last = status.get("last_checkpoint")
    if last and last.get("epoch") is not None and (not seen or seen[0]["epoch"] < last["epoch"]):
        # newer than the sampler's last look: the status has it already
        seen.insert(0, {k: last.get(k) for k in ("epoch", "taken_at", "duration_ms", "bytes")})
    return {"checkpoints": seen}


def _logs(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    after = _int(q, "after", 0, 0, 2**63 - 1)
    return {"lines": c.source.logs(parts[1], after)}


def _late(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    pid = parts[1]
    limit = _int(q, "limit", 100, 1, MAX_TAIL_ROWS)
    skip = _int(q, "skip", 0, 0, MAX_SKIP_ROWS)
    status = c.source.status(pid)
    outputs = []
    for output in c.source.late_outputs(pid, status):
        entry: dict[str, Any] = {**output, "late_rows": (status.get("late_rows") or {}).get(output["of"], 0)}
        stream = output["stream"]
        if stream is not None and c.source.store.exists(stream):
            entry.update(_rows_of(c, stream, limit, skip))
        outputs.append(entry)
    return {"outputs": outputs}


def _rows_of(c: ConsoleServer, stream: str, limit: int, skip: int = 0) -> dict[str, Any]:
    import pyarrow as pa

    total = c.source.store.info(stream).num_rows
    schema, picked = c.source.newest_rows(stream, limit, skip)
    columns = [{"name": f.name, "type": str(f.type)} for f in schema]
    rows: list[list[Any]] = []
    offsets: list[int] = []
    for offset, batch in picked:
        batch_rows = table_rows(pa.Table.from_batches([batch]))
        rows.extend(batch_rows)
        offsets.extend([offset] * len(batch_rows))
    return {"columns": columns, "rows": rows, "offsets": offsets, "total_rows": total,
            "skipped": min(skip, total)}  # fmt: skip


def _checkpoint(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    log.info("console: checkpoint", extra={"pipeline": parts[1], "caller": caller.name})
    return c.source.checkpoint(parts[1])


def _cancel(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    log.info("console: cancel", extra={"pipeline": parts[1], "caller": caller.name})
    return c.source.cancel(parts[1])


def _streams(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    return {"streams": c.source.streams()}


def _stream(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    return c.source.stream(parts[1])


def _stream_rows(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    limit = _int(q, "limit", 20, 1, MAX_TAIL_ROWS)
    skip = _int(q, "skip", 0, 0, MAX_SKIP_ROWS)
    info = c.source.store.info(parts[1])
    return {"next_offset": info.next_offset, **_rows_of(c, parts[1], limit, skip)}


def _sql_of(body: bytes) -> str:
    sql = _json_body(body).get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise ApiError(400, 'the body needs "sql": a non-empty string')
    return sql


def _query(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    result = c.source.query(_sql_of(b))
    table = result.table
    shown = table.slice(0, MAX_RESULT_ROWS)
    return {
        "columns": [{"name": f.name, "type": str(f.type)} for f in table.schema],
        "rows": table_rows(shown),
        "row_count": table.num_rows,
        "truncated": table.num_rows > MAX_RESULT_ROWS,
        "elapsed_ms": round(result.elapsed_ms, 3),
    }


def _download(c: ConsoleServer, parts: list[str], q: Any, b: bytes, caller: _Caller) -> Any:
    body = _json_body(b)
    fmt = body.get("format", "csv")
    if fmt not in ("csv", "parquet"):
        raise ApiError(400, f'"format" must be "csv" or "parquet", got {fmt!r}')
    table = c.source.query(_sql_of(b)).table
    out = io.BytesIO()
    if fmt == "csv":
        import pyarrow.csv as pacsv

        pacsv.write_csv(table, out)
        kind = "text/csv; charset=utf-8"
    else:
        import pyarrow.parquet as pq

        pq.write_table(table, out)
        kind = "application/vnd.apache.parquet"
    headers = {"Content-Disposition": f'attachment; filename="result.{fmt}"'}
    return 200, kind, out.getvalue(), headers


Handler = Callable[[ConsoleServer, list[str], Any, bytes, _Caller], Any]
_ROUTES: dict[tuple[str, tuple[str, ...]], tuple[str, Handler]] = {
    ("GET", ("whoami",)): ("read", _whoami),
    ("GET", ("pipelines",)): ("read", _pipelines),
    ("GET", ("pipelines", "*")): ("read", _pipeline),
    ("GET", ("pipelines", "*", "samples")): ("read", _samples),
    ("GET", ("pipelines", "*", "checkpoints")): ("read", _checkpoints),
    ("GET", ("pipelines", "*", "logs")): ("read", _logs),
    ("GET", ("pipelines", "*", "late")): ("read", _late),
    ("POST", ("pipelines", "*", "checkpoint")): ("admin", _checkpoint),
    ("POST", ("pipelines", "*", "cancel")): ("admin", _cancel),
    ("GET", ("streams",)): ("read", _streams),
    ("GET", ("streams", "*")): ("read", _stream),
    ("GET", ("streams", "*", "rows")): ("read", _stream_rows),
    ("POST", ("query",)): ("read", _query),
    ("POST", ("query", "download")): ("read", _download),
}


def _status_of(exc: BaseException) -> int:
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, NotFoundError | StreamNotFoundError):
        return 404
    if isinstance(exc, OverloadError):
        return 503
    if isinstance(exc, QueryError | TicketError | InvalidInputError | FlightServeError):
        return 400
    return 500


def _handler_class(console: ConsoleServer) -> type[BaseHTTPRequestHandler]:
    class ConsoleHandler(BaseHTTPRequestHandler):
        server_version = "flight-serve-console"
        protocol_version = "HTTP/1.1"
        timeout = 120  # an idle keep-alive connection gives its thread back

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the API polls
            log.debug("console %s", format % args)

        def _send(self, status: int, kind: str, body: bytes,
                  headers: Mapping[str, str] | None = None) -> None:  # fmt: skip
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _error(self, status: int, message: str) -> None:
            extra = {"WWW-Authenticate": 'Bearer realm="flight-serve"'} if status == 401 else {}
            self._send(status, "application/json", json.dumps({"error": message}).encode(), extra)

        def _handle(self, method: str) -> None:
            url = urlsplit(self.path)
            path = url.path
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self._error(400, "Content-Length is not a number")
                return
            if length > MAX_BODY_BYTES:
                self._error(413, f"the body is above {MAX_BODY_BYTES} bytes")
                self.close_connection = True
                return
            body = self.rfile.read(length) if length > 0 else b""
            if path == "/api/v1" or path.startswith("/api/v1/"):
                try:
                    query = parse_qs(url.query, keep_blank_values=True)
                    status, kind, data, headers = console.api(
                        method, path, query, body, self.headers.get("Authorization")
                    )
                except Exception as exc:
                    code = _status_of(exc)
                    if code == 500:
                        log.exception("console API failed", extra={"path": path})
                    self._error(code, str(exc) or type(exc).__name__)
                    return
                self._send(status, kind, data, headers)
                return
            if method not in ("GET", "HEAD"):
                self._error(405, f"{method} is not allowed on {path}")
                return
            self._static(path)

        def _static(self, path: str) -> None:
            name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
            if path not in ("/", "/index.html") and not path.startswith("/static/"):
                self._error(404, f"no such page: {path}")
                return
            target = (STATIC_DIR / name).resolve()
            root = STATIC_DIR.resolve()
            if root not in target.parents or not target.is_file():
                self._error(404, f"no such file: {path}")
                return
            kind = _TYPES.get(target.suffix, "application/octet-stream")
            self._send(HTTPStatus.OK, kind, target.read_bytes())

        def do_GET(self) -> None:
            self._handle("GET")

        def do_HEAD(self) -> None:
            self._handle("HEAD")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

    return ConsoleHandler
