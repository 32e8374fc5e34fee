"""The IoT alerting job under the test harness: one alert per incident, and its end."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import redis
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.api.results import latest_records
from kappaflow.iot import alerts
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings
from kappaflow.streams.output.backends import read_latest
from kappaflow.waiting import wait_for

START = datetime(2026, 11, 20, tzinfo=UTC)


def scored(device: str, metric: str, minute: int, value: float, score: float) -> dict[str, Any]:
    return {
        "device": device,
        "metric": metric,
        "value": value,
        "time": (START + timedelta(minutes=minute)).isoformat(),
        "id": f"{device}/{minute}/{metric}",
        "score": score,
        "model": "forecast",
        "model_version": 3,
    }


def test_each_rule_raises_once_per_incident_and_resolves(spark: SparkSession) -> None:
    # d1: four high scores in a row (one alert), two more (none), five calm (resolved).
    high = [0.1, 0.2, 0.9, 0.8, 0.95, 0.7, 0.6, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
    d1 = [scored("d1", "cpu_temp", m, 50.0, s) for m, s in enumerate(high)]
    # d2: a reading a minute, then silent from minute 3 while d1 goes on; back at 13.
    d2 = [scored("d2", "room_temp", m, 21.0, 0.0) for m in range(3)]
    # d3: the fan jumps by 1,000 rpm in a minute (limit 4 x 150), then stays there.
    fan = [3000.0, 3010.0, 4010.0, 4005.0, 4000.0]
    d3 = [scored("d3", "fan_rpm", m, v, 0.0) for m, v in enumerate(fan)]
    later = [scored("d1", "cpu_temp", m, 50.0, 0.1) for m in range(14, 22)]
    back = [scored("d2", "room_temp", 22, 21.0, 0.0)]
    batches = [d1 + d2 + d3, later, [*back, scored("d1", "cpu_temp", 23, 50.0, 0.1)]]
    result = kf.testing.run(alerts.build, {"scores": batches}, spark=spark, name="alerts")
    seen = [
        (a["device"], a["rule"], a["status"], a["time"][11:16]) for a in result.records("alerts")
    ]
    assert sorted(seen) == sorted(
        [
            ("d1", "anomaly", "raised", "00:04"),
            ("d1", "anomaly", "resolved", "00:12"),
            ("d3", "rate", "raised", "00:02"),
            ("d3", "rate", "resolved", "00:03"),
            ("d2", "no_data", "raised", "00:07"),
            ("d2", "no_data", "resolved", "00:22"),
            # d3 fell silent too: the watermark passed its last reading (minute 4) + 5.
            ("d3", "no_data", "raised", "00:09"),
        ]
    ), seen
    raised = next(a for a in result.records("alerts") if a["rule"] == "anomaly")
    assert raised["score"] == 0.95 and raised["open"] == ["anomaly"]
    # The serving store: each key's latest alert, with the rules open after it.
    now_open = {key: record["open"] for key, record in result.latest("alerts").items()}
    assert now_open == {
        ("d1", "cpu_temp"): [],
        ("d2", "room_temp"): [],
        ("d3", "fan_rpm"): ["no_data"],
    }
    # Each alert is keyed by its device and metric.
    keys, records = result.keys("alerts"), result.records("alerts")
    assert keys == [[a["device"], a["metric"]] for a in records]
    assert keys[records.index(raised)] == ["d1", "cpu_temp"]


def test_a_reading_scored_again_is_judged_once_even_out_of_order(spark: SparkSession) -> None:
    def again(seq: int, minute: int, score: float) -> dict[str, Any]:
        return {**scored("d4", "cpu_temp", minute, 50.0, score), "run": "d4/0", "seq": seq}

    first = [again(1, 0, 0.9), again(2, 1, 0.9)]
    # A restarted scorer scores 1 and 2 again before 3-5: judged twice, minute 0 would be
    # the third high score in a row.
    restarted = [*first, again(3, 2, 0.1), again(4, 3, 0.9), again(5, 4, 0.9)]
    # The reading of minute 5 came after that of minute 6: both are judged.
    swapped = [again(6, 6, 0.1), again(7, 5, 0.9)]
    calm = [again(seq, seq - 1, 0.1) for seq in range(8, 14)]
    # 15 came before 14, which is still to come: scored again, it is not judged twice (16
    # would be the third high score in a row).
    ahead = [again(15, 14, 0.9)]
    behind = [again(15, 14, 0.9), again(16, 15, 0.9)]
    batches = [first, restarted, swapped, calm, ahead, behind]
    result = kf.testing.run(alerts.build, {"scores": batches}, spark=spark, name="alerts")
    seen = [(a["rule"], a["status"], a["time"][11:16]) for a in result.records("alerts")]
    # Three high scores in a row at minutes 3, 4, 5; five calm ones from minute 6 to 10.
    assert seen == [("anomaly", "raised", "00:05"), ("anomaly", "resolved", "00:10")], seen


def test_open_alerts_are_kept_in_redis_on_the_broker(
    spark: SparkSession, serving: Settings
) -> None:
    name = f"iot-alerts-{uuid.uuid4().hex[:8]}"
    source = f"{name}-scores"
    create_topic(serving.kafka, source, partitions=2)
    high = [scored("d1", "cpu_temp", m, 50.0, s) for m, s in enumerate([0.1, 0.9, 0.8, 0.9])]
    send_json(serving, source, high, key="device")
    params = {"source": source, "dest": f"{name}-alerts"}
    queries = start_app(alerts.build, JobContext(name, params, spark, serving))
    store = redis.Redis.from_url(serving.redis.effective_url)

    def open_rules() -> list[str] | None:
        record = read_latest(store, name, "alerts").get(("d1", "cpu_temp"))
        return None if record is None else list(record["open"])

    def served_open() -> list[Any]:
        """The open alerts as the service answers them (``.../alerts/latest?has=open``)."""
        rows, _ = latest_records(store, name, "alerts", after=None, limit=100, has="open")
        return [(row["key"], row["record"]["open"]) for row in rows]

    try:
        wait_for(
            lambda: True if open_rules() == ["anomaly"] else None,
            timeout=180,
            what="the alert open in Redis",
        )
        assert served_open() == [(["d1", "cpu_temp"], ["anomaly"])]
        calm = [scored("d1", "cpu_temp", m, 50.0, 0.1) for m in range(4, 9)]
        send_json(serving, source, calm, key="device")
        wait_for(
            lambda: True if open_rules() == [] else None,
            timeout=180,
            what="the alert resolved in Redis",
        )
        assert served_open() == []

        def statuses() -> list[tuple[str, str]]:
            return [
                (a["rule"], a["status"])
                for a in topic_values(serving, f"{name}-alerts")
                if a["device"] == "d1" and a["time"].startswith("2026-11-20T00:0")
            ]

        # The store is written before the topic: the resolution reaches the topic a
        # moment later (a query stopped meanwhile writes it again when it restarts).
        wait_for(
            lambda: True if len(statuses()) >= 2 else None,
            timeout=60,
            what="the alert's transitions on the alerts topic",
        )
    finally:
        for query in queries:
            query.stop()
    # Raised once, resolved once: no transition written twice.
    assert statuses() == [("anomaly", "raised"), ("anomaly", "resolved")]


def test_a_long_batch_out_of_order_loses_no_reading_and_judges_each_once() -> None:
    w = alerts.Watch()
    count = alerts.GAPS_KEPT + 500

    def scored_at(seq: int) -> alerts.Scored:
        at = START + timedelta(seconds=seq)
        return alerts.Scored("d1", "cpu_temp", 50.0, at, f"d1/{seq}", 0.1, "d1/1", seq)

    # A key's first reading held back behind more than GAPS_KEPT of those after it.
    events = [scored_at(seq) for seq in range(2, count + 1)] + [scored_at(1)]
    judged = [e.seq for e in events if not alerts._again(w, e, 1)]
    alerts._advance(w, alerts.GAPS_KEPT)
    assert judged == [*range(2, count + 1), 1]
    assert (w.judged, w.above) == (count, [])
    # The same batch scored again: nothing judged twice.
    assert [e.seq for e in events if not alerts._again(w, e, 1)] == []
