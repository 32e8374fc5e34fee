"""The alarm job under the test harness: incidents raised once and resolved, replayed."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from alarm import build


def reading(device: str, temperature: float, at: str) -> dict[str, Any]:
    return {"device": device, "temperature": temperature, "at": f"2026-11-23T{at}Z"}


BATCHES = [
    [
        reading("d1", 81.0, "10:00:00"),
        reading("d2", 90.0, "10:00:00"),
        reading("d1", 82.0, "10:00:20"),
        reading("d2", 70.0, "10:00:30"),
        reading("d1", 85.0, "10:00:40"),  # the third within a minute: raised
    ],
    # The watermark is 10:00:30 now (10 s behind the latest reading).
    [
        reading("d1", 90.0, "10:00:50"),  # still the same incident: no second alert
        reading("d1", 60.0, "10:01:00"),  # cool: resolved
        reading("d1", 81.0, "10:01:10"),
        reading("d1", 82.0, "10:01:20"),
        reading("d1", 83.0, "10:01:30"),  # a new incident
        reading("d1", 99.0, "10:00:10"),  # behind the watermark: late
        reading("d2", 50.0, "10:08:00"),
    ],
    # The watermark moved to 10:07:50, past d1's silence at 10:06:30: Spark runs one more
    # batch, without data, in which d1's timer resolves its incident.
]


def alerts(out: kf.testing.Results) -> list[tuple[str, str, str, str]]:
    return [
        (a["device"], a["kind"], a["at"], a["reason"]) for a in out.records("alarm.overheating")
    ]


def test_an_incident_is_raised_once_and_resolved_by_a_cool_reading_or_silence(
    spark: SparkSession,
) -> None:
    out = kf.testing.run(build, {"readings": BATCHES}, spark=spark, name="alarm")
    assert alerts(out) == [
        ("d1", "raised", "2026-11-23T10:00:40.000Z", "3 readings above 80.0 within a minute"),
        ("d1", "resolved", "2026-11-23T10:01:00.000Z", "reading 60.0 at or below 80.0"),
        ("d1", "raised", "2026-11-23T10:01:30.000Z", "3 readings above 80.0 within a minute"),
        ("d1", "resolved", "2026-11-23T10:06:30.000Z", "no data for five minutes"),
    ]
    [late] = out.late
    assert '"10:00:10' in late["event"] or "10:00:10" in late["event"]
    assert late["reason"].startswith('late: event time 2026-11-23T10:00:10.000Z of key ["d1"]')
    assert late["key"] == {"device": "d1"}
    stats = out.stats("overheating")
    assert (stats["events"], stats["late"]) == (11, 1)  # readings handled, not alerts made
    lake = out.lake("alerts")
    assert sorted((r["device"], r["kind"]) for r in lake) == [
        ("d1", "raised"),
        ("d1", "raised"),
        ("d1", "resolved"),
        ("d1", "resolved"),
    ]

    again = kf.testing.run(build, {"readings": BATCHES}, spark=spark, name="alarm")
    assert alerts(again) == alerts(out)
    assert again.late == out.late
