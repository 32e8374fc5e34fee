from datetime import UTC, datetime, timedelta

import pytest

from kappaflow.errors import InputError
from kappaflow.timeutil import from_epoch_ms, iso, parse_duration, parse_time, to_epoch_ms

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("500ms", timedelta(milliseconds=500)),
        ("10s", timedelta(seconds=10)),
        ("5m", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("1.5s", timedelta(seconds=1.5)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["10", "s", "10 parsecs", "-5s", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InputError, match="invalid duration"):
        parse_duration(text)


def test_times() -> None:
    assert parse_time("2026-11-21T10:00:00Z") == datetime(2026, 11, 21, 10, tzinfo=UTC)
    assert parse_time("2026-11-21T11:00:00+01:00") == datetime(2026, 11, 21, 10, tzinfo=UTC)
    assert parse_time("1795297473806") == from_epoch_ms(1795297473806)
    assert parse_time("15m", now=NOW) == NOW - timedelta(minutes=15)
    assert parse_time("now", now=NOW) == NOW


def test_time_without_zone_is_refused() -> None:
    with pytest.raises(InputError, match="no zone"):
        parse_time("2026-11-21T10:00:00")


def test_garbage_time() -> None:
    with pytest.raises(InputError, match="invalid time"):
        parse_time("yesterday")


def test_epoch_round_trip_and_iso() -> None:
    millis = 1795297473806
    assert to_epoch_ms(from_epoch_ms(millis)) == millis
    assert iso(from_epoch_ms(millis)) == "2026-11-21T21:44:33.806Z"
    with pytest.raises(InputError):
        to_epoch_ms(datetime(2026, 1, 1))  # noqa: DTZ001 (the naive time is the point)
