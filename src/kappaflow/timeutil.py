"""Durations and points in time as people type them on a command line.

All times are timezone-aware UTC ``datetime`` objects; a timestamp without a zone is
refused, because guessing the zone is how replays end up an hour off.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from kappaflow.errors import InvalidDurationError, InvalidTimeError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> timedelta:
    """Parse ``500ms``, ``10s``, ``5m``, ``1h`` or ``2d``."""
    match = _DURATION.match(text)
    if match is None:
        raise InvalidDurationError(
            f"invalid duration {text!r}: use a number and a unit, e.g. 10s, 5m, 1h"
        )
    amount, unit = match.groups()
    return timedelta(seconds=float(amount) * _UNIT_SECONDS[unit])


def parse_time(text: str, *, now: datetime | None = None) -> datetime:
    """Parse a point in time.

    Accepts an ISO-8601 timestamp with a zone (``2026-11-21T10:00:00Z``), epoch
    milliseconds (``1795297473806``), ``now``, or a duration meaning that long ago
    (``15m`` is fifteen minutes before now).
    """
    value = text.strip()
    current = now if now is not None else datetime.now(UTC)
    if value == "now":
        return current
    if re.fullmatch(r"\d{10,}", value):
        return from_epoch_ms(int(value))
    if _DURATION.match(value):
        return current - parse_duration(value)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise InvalidTimeError(
            f"invalid time {text!r}: use ISO-8601 with a zone (2026-11-21T10:00:00Z), "
            "epoch milliseconds, 'now' or a duration ago (15m)"
        ) from None
    if parsed.tzinfo is None:
        raise InvalidTimeError(f"time {text!r} has no zone: add Z or an offset such as +01:00")
    return parsed.astimezone(UTC)


def to_epoch_ms(moment: datetime) -> int:
    """Milliseconds since the epoch, as Kafka timestamps are counted."""
    if moment.tzinfo is None:
        raise InvalidTimeError("naive datetime: kappaflow only handles timezone-aware times")
    return int(moment.timestamp() * 1000)


def from_epoch_ms(millis: int) -> datetime:
    return datetime.fromtimestamp(millis / 1000, tz=UTC)


def iso(moment: datetime) -> str:
    """ISO-8601 in UTC with millisecond precision and a ``Z``."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
