"""Small shared types and time conversions used by every layer.

Durations in the public API are :class:`datetime.timedelta`; stored and computed values are
integer nanoseconds (``*_ns``). Instants are aware UTC :class:`datetime.datetime`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

NS_PER_SECOND = 1_000_000_000
NS_PER_UNIT = {"s": NS_PER_SECOND, "ms": 1_000_000, "us": 1_000, "ns": 1}

#: Watermark before any row was seen (-∞) and after end of input (+∞), in ns since the epoch.
MIN_WATERMARK_NS = -(2**63)
MAX_WATERMARK_NS = 2**63 - 1


def timedelta_to_ns(value: timedelta) -> int:
    """Return ``value`` as whole nanoseconds (exact: uses days/seconds/microseconds).

    >>> timedelta_to_ns(timedelta(seconds=1, microseconds=5))
    1000005000
    """
    return (value.days * 86_400 + value.seconds) * NS_PER_SECOND + value.microseconds * 1_000


def ns_to_datetime(value_ns: int) -> datetime:
    """Return an aware UTC datetime for ``value_ns`` nanoseconds since the Unix epoch
    (truncated to microseconds, the resolution of :class:`datetime.datetime`).

    >>> ns_to_datetime(1_500_000_000)
    datetime.datetime(1970, 1, 1, 0, 0, 1, 500000, tzinfo=datetime.timezone.utc)
    """
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=value_ns // 1_000)


def datetime_to_ns(value: datetime) -> int:
    """Return nanoseconds since the Unix epoch; a naive datetime is taken as UTC.

    >>> datetime_to_ns(datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC))
    2000000000
    """
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return timedelta_to_ns(value - datetime(1970, 1, 1, tzinfo=UTC))
