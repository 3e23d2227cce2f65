"""CEL's timestamp and duration functions: conversions and the ``get*`` accessors.

Timestamp accessors take an optional time zone (an IANA name such as ``Europe/Paris`` or an
offset such as ``+05:30``) and default to UTC, as Kubernetes configures CEL. Month, day of
month, day of year are 0-based; ``getDate`` is 1-based; ``getDayOfWeek`` is 0 for Sunday.
Duration accessors return whole units of the total (``duration('90m').getHours() == 1``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .timevalues import Duration, Timestamp
from .values import no_overload


def timestamp(value: Any) -> Timestamp:
    """``timestamp(string)`` (RFC 3339), ``timestamp(int)`` (Unix seconds) or identity."""
    if isinstance(value, Timestamp):
        return value
    if isinstance(value, str):
        return Timestamp.parse(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return Timestamp.from_unix(int(value))
    raise no_overload("timestamp", value)


def duration(value: Any) -> Duration:
    """``duration(string)`` (Go syntax such as ``1h30m``) or identity."""
    if isinstance(value, Duration):
        return value
    if isinstance(value, str):
        return Duration.parse(value)
    raise no_overload("duration", value)


def _calendar(op: str, part: Callable[[datetime], int]) -> Callable[..., int]:
    def accessor(value: Any, zone: Any = None) -> int:
        if not isinstance(value, Timestamp) or not (zone is None or isinstance(zone, str)):
            raise no_overload(op, value, *(() if zone is None else (zone,)))
        return part(value.in_zone(zone))

    accessor.__doc__ = f"``timestamp.{op}([zone])``."
    return accessor


get_full_year = _calendar("getFullYear", lambda t: t.year)
get_month = _calendar("getMonth", lambda t: t.month - 1)
get_date = _calendar("getDate", lambda t: t.day)
get_day_of_month = _calendar("getDayOfMonth", lambda t: t.day - 1)
get_day_of_week = _calendar("getDayOfWeek", lambda t: (t.weekday() + 1) % 7)
get_day_of_year = _calendar("getDayOfYear", lambda t: t.timetuple().tm_yday - 1)


def _time_part(
    op: str, of_timestamp: Callable[[datetime], int], of_duration: Callable[[Duration], int]
) -> Callable[..., int]:
    calendar = _calendar(op, of_timestamp)

    def accessor(value: Any, zone: Any = None) -> int:
        if isinstance(value, Duration) and zone is None:
            return of_duration(value)
        return calendar(value, zone)

    accessor.__doc__ = f"``timestamp.{op}([zone])`` or ``duration.{op}()``."
    return accessor


get_hours = _time_part("getHours", lambda t: t.hour, Duration.hours)
get_minutes = _time_part("getMinutes", lambda t: t.minute, Duration.minutes)
get_seconds = _time_part("getSeconds", lambda t: t.second, Duration.seconds)


def get_milliseconds(value: Any, zone: Any = None) -> int:
    """``timestamp.getMilliseconds([zone])`` (within the second) or ``duration`` total."""
    if isinstance(value, Duration) and zone is None:
        return value.milliseconds()
    if isinstance(value, Timestamp) and (zone is None or isinstance(zone, str)):
        if zone is not None:
            value.in_zone(zone)  # an unknown zone is an error here too
        return value.milliseconds()
    raise no_overload("getMilliseconds", value)
