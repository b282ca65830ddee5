"""Stream and writer names: what the store accepts (a stream name is a directory name)."""

from __future__ import annotations

import re

from flight_serve.errors import InvalidInputError, StreamNameError

__all__ = [
    "STREAM_NAME_PATTERN",
    "WRITER_NAME_PATTERN",
    "validate_stream_name",
    "validate_writer_name",
]

#: Stream names: 1 to 200 characters out of ``[A-Za-z0-9_.-]``, and not ``.`` or ``..``.
STREAM_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,200}")

#: Writer names in the store: up to 200 characters out of ``[A-Za-z0-9_.:@-]`` (``""`` is the
#: unnamed writer: entries appended without a name).
WRITER_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:@\-]{0,200}")


def validate_stream_name(name: str) -> str:
    """Return ``name`` if it is a valid stream name.

    Raises:
        StreamNameError: ``name`` is empty, longer than 200 characters, holds a character outside
            ``[A-Za-z0-9_.-]``, or is ``.`` / ``..`` (which are not directory names).

    >>> validate_stream_name("flights.v2")
    'flights.v2'
    """
    if not isinstance(name, str) or STREAM_NAME_PATTERN.fullmatch(name) is None:
        raise StreamNameError(
            f"invalid stream name {name!r}: use 1 to 200 characters out of [A-Za-z0-9_.-]"
        )
    if name in (".", ".."):
        raise StreamNameError(f"invalid stream name {name!r}: '.' and '..' are reserved")
    return name


def validate_writer_name(name: str) -> str:
    """Return ``name`` if it is a valid writer name for the store (see WRITER_NAME_PATTERN).

    Raises:
        InvalidInputError: it is not.
    """
    if not isinstance(name, str) or WRITER_NAME_PATTERN.fullmatch(name) is None:
        raise InvalidInputError(
            f"invalid writer name {name!r}: use up to 200 characters out of [A-Za-z0-9_.:@-]"
        )
    return name
