"""CEL ``google.protobuf.Timestamp`` and ``google.protobuf.Duration`` values.

Both are exact integers of nanoseconds, as in cel-go. Invariants: a :class:`Duration` fits a
signed 64-bit count of nanoseconds (Go's ``time.Duration``); a :class:`Timestamp` lies between
``0001-01-01T00:00:00Z`` and ``9999-12-31T23:59:59.999999999Z`` and remembers the UTC offset
it was written with, which only its printed form uses (equality and order are by instant).
Parsing and printing follow Go: ``time.ParseDuration`` (``1h30m``, ``-1.5s``, ``300ms``) and
RFC 3339 for timestamps; a duration prints as seconds (``5400s``, ``1.5s``).
"""

from __future__ import annotations

import datetime as dt
import re
import zoneinfo
from decimal import Decimal

from .errors import CelEvalError

NANOS = 1_000_000_000
_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_MIN_UNIX = -62135596800
_MAX_UNIX = 253402300799
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

_UNITS = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,
    "\u03bcs": 1_000,
    "ms": 1_000_000,
    "s": NANOS,
    "m": 60 * NANOS,
    "h": 3600 * NANOS,
}
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:(Z)|([+-])(\d{2}):(\d{2}))"
)


def _conversion_error(target: str) -> CelEvalError:
    return CelEvalError(f"type conversion error from 'string' to '{target}'")


class Duration:
    """A span of time in nanoseconds."""

    __slots__ = ("nanos",)
    cel_type_name = "google.protobuf.Duration"

    def __init__(self, nanos: int) -> None:
        if not _INT64_MIN <= nanos <= _INT64_MAX:
            raise CelEvalError("duration out of range")
        self.nanos = nanos

    @classmethod
    def parse(cls, text: str) -> Duration:
        """``duration('1h30m')``: Go's ``time.ParseDuration`` grammar."""
        nanos = _parse_go_duration(text)
        if nanos is None:
            raise _conversion_error(cls.cel_type_name)
        return cls(nanos)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"duration({str(self)!r})"

    def __str__(self) -> str:
        seconds = Decimal(self.nanos) / NANOS
        text = format(seconds.normalize(), "f") if self.nanos % NANOS else str(self.nanos // NANOS)
        return text + "s"

    def _trunc(self, unit: int) -> int:
        q = abs(self.nanos) // unit
        return q if self.nanos >= 0 else -q

    def hours(self) -> int:
        """Whole hours (truncated toward zero)."""
        return self._trunc(3600 * NANOS)

    def minutes(self) -> int:
        """Whole minutes."""
        return self._trunc(60 * NANOS)

    def seconds(self) -> int:
        """Whole seconds."""
        return self._trunc(NANOS)

    def milliseconds(self) -> int:
        """Whole milliseconds."""
        return self._trunc(1_000_000)


def _parse_go_duration(text: str) -> int | None:
    s = text
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = Decimal(0)
    while s:
        m = re.match(r"(\d*)(?:\.(\d*))?", s)
        assert m is not None
        whole, frac = m.group(1), m.group(2)
        if not whole and not frac:
            return None
        s = s[m.end() :]
        unit_end = 0
        while unit_end < len(s) and not (s[unit_end] == "." or "0" <= s[unit_end] <= "9"):
            unit_end += 1
        unit = s[:unit_end]
        s = s[unit_end:]
        if unit not in _UNITS:
            return None
        total += Decimal(f"{whole or '0'}.{frac or '0'}") * _UNITS[unit]
    nanos = int(total)
    if nanos > _INT64_MAX + (1 if negative else 0):
        return None
    return -nanos if negative else nanos


class Timestamp:
    """An instant, in nanoseconds since the Unix epoch, with the offset it was written in."""

    __slots__ = ("nanos", "offset")
    cel_type_name = "google.protobuf.Timestamp"

    def __init__(self, nanos: int, offset: int = 0) -> None:
        if not _MIN_UNIX * NANOS <= nanos < (_MAX_UNIX + 1) * NANOS:
            raise CelEvalError("timestamp out of range")
        self.nanos = nanos
        self.offset = offset

    @classmethod
    def parse(cls, text: str) -> Timestamp:
        """``timestamp('2024-01-02T03:04:05Z')``: RFC 3339 with optional fractional seconds."""
        m = _RFC3339.fullmatch(text)
        if m is None:
            raise _conversion_error(cls.cel_type_name)
        year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
        frac = int((m.group(7) or "").ljust(9, "0"))
        offset = 0
        if m.group(9):
            offset = (int(m.group(10)) * 60 + int(m.group(11))) * 60
            offset = -offset if m.group(9) == "-" else offset
        try:
            local = dt.datetime(year, month, day, hour, minute, second, tzinfo=dt.UTC)
        except ValueError:
            raise _conversion_error(cls.cel_type_name) from None
        seconds = (local - _EPOCH) // dt.timedelta(seconds=1) - offset
        if not _MIN_UNIX <= seconds <= _MAX_UNIX:
            raise CelEvalError("timestamp out of range")
        return cls(seconds * NANOS + frac, offset)

    @classmethod
    def from_unix(cls, seconds: int) -> Timestamp:
        """``timestamp(int)``: seconds since the epoch."""
        if not _MIN_UNIX <= seconds <= _MAX_UNIX:
            raise CelEvalError("timestamp out of range")
        return cls(seconds * NANOS)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timestamp) and self.nanos == other.nanos

    def __hash__(self) -> int:
        return hash(self.nanos)

    def __repr__(self) -> str:
        return f"timestamp({str(self)!r})"

    def __str__(self) -> str:
        local = self._datetime(dt.timezone(dt.timedelta(seconds=self.offset)))
        frac = self.nanos % NANOS
        text = local.strftime("%Y-%m-%dT%H:%M:%S")
        if frac:
            text += "." + f"{frac:09d}".rstrip("0")
        if self.offset == 0:
            return text + "Z"
        sign = "+" if self.offset > 0 else "-"
        hours, rest = divmod(abs(self.offset), 3600)
        return f"{text}{sign}{hours:02d}:{rest // 60:02d}"

    def unix_seconds(self) -> int:
        """Whole seconds since the epoch (rounded down, as Go's ``Unix()``)."""
        return self.nanos // NANOS

    def _datetime(self, zone: dt.tzinfo) -> dt.datetime:
        seconds = self.nanos // NANOS
        return (_EPOCH + dt.timedelta(seconds=seconds)).astimezone(zone)

    def in_zone(self, zone_name: str | None = None) -> dt.datetime:
        """The calendar time in UTC or in ``zone_name`` (IANA name or ``[+-]HH:MM``)."""
        return self._datetime(_zone(zone_name))

    def milliseconds(self) -> int:
        """The millisecond within the second."""
        return (self.nanos % NANOS) // 1_000_000


def _zone(name: str | None) -> dt.tzinfo:
    if name is None or name == "UTC":
        return dt.UTC
    m = re.fullmatch(r"([+-]?)(\d{2}):(\d{2})", name)
    if m is not None:
        offset = dt.timedelta(hours=int(m.group(2)), minutes=int(m.group(3)))
        return dt.timezone(-offset if m.group(1) == "-" else offset)
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise CelEvalError(f"unknown time zone {name!r}") from None


def add(a: Timestamp | Duration, b: Timestamp | Duration) -> Timestamp | Duration:
    """``a + b`` for timestamp + duration (either order) and duration + duration."""
    if isinstance(a, Duration) and isinstance(b, Duration):
        return Duration(a.nanos + b.nanos)
    if isinstance(a, Timestamp) and isinstance(b, Duration):
        return Timestamp(a.nanos + b.nanos, a.offset)
    if isinstance(a, Duration) and isinstance(b, Timestamp):
        return Timestamp(a.nanos + b.nanos, b.offset)
    raise TypeError("no timestamp/duration sum")


def subtract(a: Timestamp | Duration, b: Timestamp | Duration) -> Timestamp | Duration:
    """``a - b`` for timestamp - timestamp, timestamp - duration, duration - duration."""
    if isinstance(a, Timestamp) and isinstance(b, Timestamp):
        return Duration(a.nanos - b.nanos)
    if isinstance(a, Timestamp) and isinstance(b, Duration):
        return Timestamp(a.nanos - b.nanos, a.offset)
    if isinstance(a, Duration) and isinstance(b, Duration):
        return Duration(a.nanos - b.nanos)
    raise TypeError("no timestamp/duration difference")
