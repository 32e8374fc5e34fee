"""The IoT device state job under the test harness: presence and sessions from events,
each metric's last value, both served from the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.iot import devices

START = datetime(2026, 11, 20, tzinfo=UTC)


def at(seconds: int) -> str:
    return (START + timedelta(seconds=seconds)).isoformat()


def beat(device: str, seconds: int, kind: str = "heartbeat") -> dict[str, Any]:
    return {"device": device, "time": at(seconds), "kind": kind}


def reading(device: str, metric: str, seconds: int, value: float) -> dict[str, Any]:
    return {
        "device": device, "metric": metric, "value": value, "unit": "celsius",
        "time": at(seconds), "seq": seconds, "id": f"{device}/{seconds}/{metric}",
    }  # fmt: skip


def test_devices_come_online_go_offline_and_keep_their_last_values(
    spark: SparkSession,
) -> None:
    events = [
        [beat("d1", 0), beat("d1", 30), beat("d2", 0), beat("d3", 10)],
        # d1 goes on (a user's command is a sign of life too); d2 has been silent since 0.
        [beat("d1", 60), beat("d1", 90, "command"), beat("d1", 120), beat("d1", 200)],
        [beat("d2", 300), beat("d1", 230)],
    ]
    readings = [
        [reading("d1", "cpu_temp", 10, 50.0), reading("d1", "cpu_temp", 20, 51.0)],
        # An older reading of the same metric changes nothing; another metric is kept.
        [reading("d1", "cpu_temp", 15, 49.0), reading("d1", "room_temp", 25, 21.5)],
        [],
    ]
    result = kf.testing.run(
        devices.build,
        {"devices.events": events, "telemetry.clean": readings},
        spark=spark,
        name="devices",
    )
    d2 = [(s["status"], s["sessions"]) for s in result.records("devices.status")
          if s["device"] == "d2"]  # fmt: skip
    assert d2 == [("online", 1), ("offline", 1), ("online", 2)]
    status = result.latest("status")
    assert (status[("d1",)]["status"], status[("d1",)]["sessions"]) == ("online", 1)
    assert status[("d1",)]["last_seen"].startswith(at(230)[:19])
    assert status[("d2",)]["session_start"].startswith(at(300)[:19])
    # d3 sent nothing after 10 s: its timer took it offline once the watermark passed 100 s.
    assert (status[("d3",)]["status"], status[("d3",)]["sessions"]) == ("offline", 1)
    values = {k: v["value"] for k, v in result.latest("last_values").items()}
    assert values == {("d1", "cpu_temp"): 51.0, ("d1", "room_temp"): 21.5}
