"""Authentication the Flight SQL drivers actually send: a Basic handshake that returns a bearer
token, then that bearer token on every call.

- **Handshake with Basic**: the client calls Handshake with the header
  ``authorization: Basic base64(user:password)`` (the Go driver behind ``adbc-driver-flightsql``
  encodes without ``=`` padding; both forms are accepted). The server checks the password and
  answers with the header ``authorization: Bearer <token>``; the token is 32 random bytes,
  URL-safe base64, valid for :data:`TOKEN_TTL_S` seconds (24 h) from the handshake.
- **Bearer on every call**: ``authorization: Bearer <token>``. A Basic header on an ordinary call
  is accepted too (and answered with a fresh token), which is what the JDBC driver does on its
  first call.
- Without credentials, an unknown or expired token, or a wrong password: UNAUTHENTICATED.

With ``users=None`` (the default) the server is open: every call is accepted, and a Basic
handshake (with any user and password) still returns a token, so clients configured with
credentials work unchanged. Run an open server on loopback only; ``flight-serve serve`` warns when
it listens elsewhere without ``--users-file``. Roles, TLS and per-stream permissions are
issue 8's.

Usage: ``FlightServeService(..., users={"alice": "secret"})`` or ``flight-serve serve
--users-file users.txt`` (see :func:`load_users_file`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow.flight as flight

from flight_serve.errors import InvalidInputError

__all__ = [
    "TOKEN_TTL_S",
    "BasicBearerAuth",
    "auth_server_options",
    "decode_basic",
    "load_users_file",
]

#: How long a bearer token stays valid after the handshake that issued it (seconds).
TOKEN_TTL_S: Final = 24 * 3600

_HEADER: Final = "authorization"


def decode_basic(value: str) -> tuple[str, str]:
    """Decode the credentials of a ``Basic`` authorization value, with or without base64
    padding.

    >>> decode_basic("Basic dXNlcjpwYXNz")
    ('user', 'pass')

    Raises:
        ValueError: not ``Basic <base64 of user:password>``.
    """
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise ValueError("not a Basic authorization header")
    encoded = encoded.strip()
    try:
        raw = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError("the Basic credentials are not base64 of UTF-8 text") from None
    user, sep, password = text.partition(":")
    if not sep:
        raise ValueError("the Basic credentials have no ':' between user and password")
    return user, password


def load_users_file(path: Path) -> dict[str, str]:
    """Read ``user:password`` lines (blank lines and ``#`` comments ignored; the password is
    everything after the first ``:``).

    Raises:
        InvalidInputError: a line without ``:`` or with an empty user (the message names the
            line), or the file cannot be read.
    """
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # a leading BOM is not a user
    except OSError as exc:
        raise InvalidInputError(f"cannot read the users file {path}: {exc}") from None
    users: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user:
            raise InvalidInputError(f"{path}:{number}: expected user:password")
        users[user] = password
    return users


class _Tokens:
    """Issued bearer tokens and their expiry (monotonic seconds)."""

    def __init__(self, ttl_s: float) -> None:
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}

    def issue(self, user: str) -> str:
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._tokens = {t: v for t, v in self._tokens.items() if v[1] > now}
            self._tokens[token] = (user, now + self._ttl_s)
        return token

    def user_of(self, token: str) -> str | None:
        with self._lock:
            entry = self._tokens.get(token)
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]


class _IssueToken(flight.ServerMiddleware):
    """Sends the freshly issued bearer token back in the response headers."""

    def __init__(self, token: str) -> None:
        self.token = token

    def sending_headers(self) -> dict[str, list[str] | list[bytes]]:
        return {_HEADER: [f"Bearer {self.token}"]}


class BasicBearerAuth(flight.ServerMiddlewareFactory):
    """The server middleware that checks every call (see the module docstring).

    Args:
        users: user name -> password; ``None`` leaves the server open.
        token_ttl_s: bearer token lifetime in seconds.
    """

    def __init__(self, users: Mapping[str, str] | None, token_ttl_s: float = TOKEN_TTL_S):
        self._users = dict(users) if users is not None else None
        self._tokens = _Tokens(token_ttl_s)

    def user_of(self, token: str) -> str | None:
        """The user a live bearer token was issued to by a handshake, else None."""
        return self._tokens.user_of(token)

    def start_call(
        self, info: flight.CallInfo, headers: dict[str, list[str] | list[bytes]]
    ) -> flight.ServerMiddleware | None:
        values = [v for k, vs in headers.items() if k.lower() == _HEADER for v in vs]
        first = values[0] if values else ""
        value = first.decode("latin-1") if isinstance(first, bytes) else first
        if value[:6].lower() == "basic ":
            return _IssueToken(self._tokens.issue(self._check_password(value)))
        if value[:7].lower() == "bearer ":
            token = value[7:].strip()
            if self._users is not None and self._tokens.user_of(token) is None:
                raise flight.FlightUnauthenticatedError(
                    "unknown or expired bearer token; authenticate again (Basic handshake)"
                )
            return None
        if self._users is not None:
            raise flight.FlightUnauthenticatedError(
                "authentication required: send a Basic handshake (user and password), then the "
                "bearer token it returns"
            )
        return None

    def _check_password(self, value: str) -> str:
        try:
            user, password = decode_basic(value)
        except ValueError as exc:
            raise flight.FlightUnauthenticatedError(f"bad Basic credentials: {exc}") from None
        if self._users is None:
            return user
        expected = self._users.get(user)
        # Compare even for an unknown user, so timing does not reveal which users exist.
        ok = hmac.compare_digest(
            (expected if expected is not None else secrets.token_hex(16)).encode(),
            password.encode(),
        )
        if expected is None or not ok:
            raise flight.FlightUnauthenticatedError("wrong user name or password")
        return user


class _AcceptHandshake(flight.ServerAuthHandler):
    """Lets the Handshake RPC succeed; :class:`BasicBearerAuth` checks its headers."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: str) -> str:  # type: ignore[override]  # the peer identity
        return ""


def auth_server_options(users: Mapping[str, str] | None, options: dict[str, Any]) -> dict[str, Any]:
    """Return ``options`` (``FlightServerBase`` keyword arguments) with the Basic/Bearer
    middleware and a Handshake handler added; a caller's own ``auth_handler`` and other
    middleware are kept."""
    merged = dict(options)
    middleware = dict(merged.get("middleware") or {})
    middleware.setdefault("flight_serve_auth", BasicBearerAuth(users))
    merged["middleware"] = middleware
    merged.setdefault("auth_handler", _AcceptHandshake())
    return merged
