"""Bearer tokens with roles (``flight-serve serve --tokens-file``), and the TLS settings.

A tokens file has one token a line: the token, then its roles separated by commas (``read``,
``write``, ``admin``), then optionally a name for the logs; blank lines and ``#`` comments are
ignored::

    # token                              roles        name
    3f9c1e0c2b7a4d8e9f00112233445566     read         dashboards
    a1b2c3d4e5f60718293a4b5c6d7e8f90     read,write   ingest
    0f1e2d3c4b5a69788796a5b4c3d2e1f0     admin        ops

What each role allows (roles do not imply one another; give a token every role it needs):

- ``read``: queries and tails: ListFlights, GetFlightInfo, GetSchema, DoGet, DoExchange, and the
  actions ``stream.tail``, ``pipeline.list`` / ``status`` / ``logs`` and every other action
  registered with :meth:`~flight_serve.flight.service.FlightServeService.register_action`
  (the Flight SQL actions included: preparing a statement runs nothing). Flight SQL queries
  (``CommandStatementQuery``, binding a prepared query's parameters over DoPut) need ``read``.
- ``write``: DoPut of stream batches; Flight SQL ``INSERT`` and ``CREATE TABLE`` (sent as an
  update, or as a query, which runs it in GetFlightInfo) and bulk ingest.
- ``admin``: ``stream.drop`` and ``pipeline.submit`` / ``cancel`` / ``checkpoint``; Flight SQL
  ``DROP TABLE``, ``CREATE OR REPLACE TABLE`` of a table, and bulk ingest in ``replace`` mode
  into an existing table (each drops a stream).

DoPut itself needs only a known token at the door: the service checks the role of what the
upload does (:func:`require_role`).

A call without credentials, or with a token that is not in the file, fails UNAUTHENTICATED; a
known token without the role the call needs fails UNAUTHORIZED (gRPC PERMISSION_DENIED), naming
the role. Handshake and ListActions need only a known token.

With ``users_auth`` (a :class:`~flight_serve.flight.ops.auth.BasicBearerAuth` over a users file),
the Basic handshake works too, and the users' bearer tokens have every role.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

import pyarrow.flight as flight

from flight_serve.errors import InvalidInputError
from flight_serve.flight.ops.auth import BasicBearerAuth
from flight_serve.flight.ops.metrics import method_name
from flight_serve.flight.status import with_request_id

__all__ = [
    "ACTION_ROLES",
    "ROLES",
    "Role",
    "RoleAuth",
    "TlsFiles",
    "TokenGrant",
    "UsersAndTokensAuth",
    "load_tokens_file",
    "require_action_role",
    "require_role",
]

Role = Literal["read", "write", "admin"]

ROLES: Final[frozenset[str]] = frozenset({"read", "write", "admin"})

#: The key of :class:`RoleAuth` in the server's ``middleware`` mapping.
MIDDLEWARE_KEY: Final = "flight_serve_roles"

#: Roles the Flight methods need (``None``: any known token).
METHOD_ROLES: Final[Mapping[str, Role | None]] = {
    "Handshake": None,
    "ListActions": None,
    "DoAction": None,  # checked per action by require_action_role
    "ListFlights": "read",
    "GetFlightInfo": "read",
    "GetSchema": "read",
    "DoGet": "read",
    "DoExchange": "read",
    "DoPut": None,  # checked per descriptor / Flight SQL command by require_role
}

#: Roles the actions need; an action not listed needs ``read``.
ACTION_ROLES: Final[Mapping[str, Role]] = {
    "stream.drop": "admin",
    "pipeline.submit": "admin",
    "pipeline.cancel": "admin",
    "pipeline.update": "admin",
    "pipeline.checkpoint": "admin",
    "stream.tail": "read",
    "stream.writer_wait": "write",
    "pipeline.list": "read",
    "pipeline.status": "read",
    "pipeline.logs": "read",
}

_ALL: Final = frozenset(ROLES)


@dataclass(frozen=True)
class TokenGrant:
    """One token of a tokens file: its roles and its name (for the logs)."""

    roles: frozenset[str]
    name: str


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS: the server's certificate chain and key, and for mutual TLS the CA
    that client certificates must chain to (``client_ca``: clients without a certificate
    signed by it are refused)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def server_options(self) -> dict[str, Any]:
        """``FlightServerBase`` keyword arguments for these files.

        Raises:
            InvalidInputError: a file cannot be read, the certificate and key are not a PEM
                certificate chain and its (unencrypted) private key, or the client CA file holds
                no PEM certificate (checked here: gRPC only says "Server did not start").
        """
        try:
            options: dict[str, Any] = {
                "tls_certificates": [(self.cert.read_bytes(), self.key.read_bytes())]
            }
            if self.client_ca is not None:
                options["verify_client"] = True
                options["root_certificates"] = self.client_ca.read_bytes()
        except OSError as exc:
            raise InvalidInputError(f"cannot read a TLS file: {exc}") from None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:  # the password callback refuses an encrypted key instead of prompting
            context.load_cert_chain(self.cert, self.key, password=lambda: b"")
        except ssl.SSLError as exc:
            raise InvalidInputError(
                f"--tls-cert {self.cert} / --tls-key {self.key}: not a PEM certificate chain and "
                f"its (unencrypted) private key: {exc.reason or exc}"
            ) from None
        if self.client_ca is not None:
            try:
                context.load_verify_locations(cafile=str(self.client_ca))
            except ssl.SSLError as exc:
                raise InvalidInputError(
                    f"--tls-client-ca {self.client_ca}: no PEM CA certificate: {exc.reason or exc}"
                ) from None
        return options


def load_tokens_file(path: Path) -> dict[str, TokenGrant]:
    """Read a tokens file (see the module docstring): token -> its grant.

    Raises:
        InvalidInputError: the file cannot be read, a line has no roles or an unknown role, or
            a token appears twice (the message names the line, never the token).
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a leading BOM is not a token
    except OSError as exc:
        raise InvalidInputError(f"cannot read the tokens file {path}: {exc}") from None
    tokens: dict[str, TokenGrant] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) < 2:
            raise InvalidInputError(f"{path}:{number}: expected: TOKEN ROLES [NAME]")
        token, roles_text = fields[0], fields[1]
        roles = frozenset(r.strip() for r in roles_text.split(",") if r.strip())
        unknown = sorted(roles - ROLES)
        if not roles or unknown:
            raise InvalidInputError(
                f"{path}:{number}: unknown role(s) {', '.join(unknown) or '(none)'}; "
                "roles are read, write, admin (comma-separated)"
            )
        if token in tokens:
            raise InvalidInputError(f"{path}:{number}: this token is already on an earlier line")
        name = " ".join(fields[2:]) or f"line {number}"
        tokens[token] = TokenGrant(roles, name)
    return tokens


class Caller(flight.ServerMiddleware):
    """The middleware instance of one call: who called, with which roles."""

    def __init__(self, name: str, roles: frozenset[str]) -> None:
        self.name = name
        self.roles = roles


class RoleAuth(flight.ServerMiddlewareFactory):
    """Checks every call's bearer token and the role its method needs (module docstring)."""

    def __init__(
        self, tokens: Mapping[str, TokenGrant], users_auth: BasicBearerAuth | None = None
    ) -> None:
        self._tokens = dict(tokens)
        self._users_auth = users_auth

    def _grant_of(self, token: str) -> TokenGrant | None:
        found = None
        for known, grant in self._tokens.items():  # compare every token: constant time
            if hmac.compare_digest(known.encode(), token.encode()):
                found = grant
        return found

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        values = [v for k, vs in headers.items() if k.lower() == "authorization" for v in vs]
        first = values[0] if values else ""
        value = first.decode("latin-1") if isinstance(first, bytes) else first
        method = method_name(info.method)
        caller: Caller | None = None
        if value[:7].lower() == "bearer ":
            token = value[7:].strip()
            grant = self._grant_of(token)
            if grant is not None:
                caller = Caller(grant.name, grant.roles)
            elif self._users_auth is not None:
                user = self._users_auth.user_of(token)
                if user is not None:
                    caller = Caller(user, _ALL)
            if caller is None:
                raise flight.FlightUnauthenticatedError(
                    with_request_id("unknown or expired bearer token")
                )
        elif value[:6].lower() == "basic " and self._users_auth is not None:
            caller = Caller("basic", _ALL)  # BasicBearerAuth checks the password
        else:
            raise flight.FlightUnauthenticatedError(
                with_request_id("authentication required: send 'authorization: Bearer <token>'")
            )
        need = METHOD_ROLES.get(method, "read")
        if need is not None and need not in caller.roles:
            raise flight.FlightUnauthorizedError(
                with_request_id(
                    f"{method} needs the {need!r} role; this token has "
                    f"{', '.join(sorted(caller.roles))}"
                )
            )
        return caller


class UsersAndTokensAuth(BasicBearerAuth):
    """:class:`~flight_serve.flight.ops.auth.BasicBearerAuth` over a users file that also lets
    through the bearer tokens of a tokens file (their roles are :class:`RoleAuth`'s to check),
    for a server started with both files."""

    def __init__(self, users: Mapping[str, str], tokens: Mapping[str, TokenGrant]) -> None:
        super().__init__(users)
        self._file_tokens = frozenset(tokens)

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        values = [v for k, vs in headers.items() if k.lower() == "authorization" for v in vs]
        first = values[0] if values else ""
        value = first.decode("latin-1") if isinstance(first, bytes) else first
        if value[:7].lower() == "bearer " and value[7:].strip() in self._file_tokens:
            return None
        return super().start_call(info, headers)


def _caller_of(context: flight.ServerCallContext) -> Caller | None:
    middleware = context.get_middleware(MIDDLEWARE_KEY)
    return middleware if isinstance(middleware, Caller) else None


def caller_name(context: flight.ServerCallContext) -> str | None:
    """The user name of the call's token (``None`` without :class:`RoleAuth`)."""
    caller = _caller_of(context)
    return caller.name if caller is not None else None


def require_action_role(context: flight.ServerCallContext, action_type: str) -> None:
    """Check that the caller may run ``action_type``: the role :data:`ACTION_ROLES` gives it
    (``read`` when not listed). Checked when the action is dispatched, so an action registered
    at any time is guarded from its first call. Passes without :class:`RoleAuth`.

    Raises:
        pyarrow.flight.FlightUnauthorizedError: the token lacks the role (PERMISSION_DENIED).
    """
    require_role(context, ACTION_ROLES.get(action_type, "read"), f"action {action_type}")


def require_role(context: flight.ServerCallContext, need: str, what: str) -> None:
    """Check that the caller's token has role ``need`` (``read``, ``write`` or ``admin``) for
    ``what`` (named in the error, e.g. ``"DoPut to a stream"``). Passes when the server has no
    :class:`RoleAuth` (no tokens file) and for Basic-handshake users (every role).

    Raises:
        pyarrow.flight.FlightUnauthorizedError: the token lacks the role (PERMISSION_DENIED).
    """
    caller = _caller_of(context)
    if caller is not None and need not in caller.roles:
        raise flight.FlightUnauthorizedError(
            f"{what} needs the {need!r} role; this token has {', '.join(sorted(caller.roles))}"
        )
