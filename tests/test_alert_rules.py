"""Declarative alert rules (``Stream.alerts``): a record's field against a threshold, in
Spark SQL; one alert record per record and rule that holds."""

from __future__ import annotations

from typing import Any

import pytest
import realtime_jobs
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.errors import KappaflowError


def test_each_rule_that_holds_gives_an_alert_record(spark: SparkSession) -> None:
    batches: list[list[Any]] = [
        [
            {"device": "d1", "value": 7.5, "time": "2026-11-29T10:00:00.000Z"},
            {"device": "d2", "value": 4.9, "time": "2026-11-29T10:00:01.000Z"},
            {"device": "d3", "value": -1.0, "time": "2026-11-29T10:00:02.000Z"},
        ],
        [{"device": "d1", "value": 5.0, "time": "2026-11-29T10:00:03.000Z"}],
    ]
    results = kf.testing.run(
        realtime_jobs.alerts, {"t": batches}, params={"topic": "t", "dest": "out"}, spark=spark
    )
    got = sorted(
        (r["device"], r["rule"], r["value"], r["reason"], r["time"]) for r in results.records("out")
    )
    assert got == [
        ("d1", "high", 5.0, "value 5.0 >= 5.0", "2026-11-29T10:00:03.000Z"),
        ("d1", "high", 7.5, "value 7.5 >= 5.0", "2026-11-29T10:00:00.000Z"),
        ("d3", "negative", -1.0, "value -1.0 < 0.0", "2026-11-29T10:00:02.000Z"),
    ]
    record = results.records("out")[0]
    assert {"status": "raised", "field": "value"}.items() <= record.items()
    # Keyed by the stream's key: the serving store keeps each device's latest alert.
    assert sorted(map(str, results.keys("out"))) == ["['d1']", "['d1']", "['d3']"]


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (("value", "~", 1), "op '~'"),
        (("nope", ">", 1), "no column 'nope'"),
        (("value", ">", "high"), "no number"),
        ("value > 1", "give (field, op, threshold)"),
    ],
)
def test_a_malformed_rule_is_refused(spark: SparkSession, rule: Any, message: str) -> None:
    def build(job: kf.Job) -> None:
        readings = job.source("t", realtime_jobs.Reading, key="device")
        readings.alerts(bad=rule).to(kf.topic("out"))

    with pytest.raises(KappaflowError) as refused:
        kf.testing.run(build, {"t": [[]]}, spark=spark)
    assert refused.value.code == "KF731"
    assert message in str(refused.value)


def test_the_iot_score_alert_raises_on_each_reading_scored_high(spark: SparkSession) -> None:
    from kappaflow.iot.alerts import build_realtime, explanation
    from kappaflow.iot.models import ALERT_SCORE

    def scored(device: str, score: float, at: str) -> dict[str, Any]:
        return {
            "device": device,
            "metric": "fan_speed",
            "value": 71.2,
            "time": at,
            "id": at,
            "model": "likelihood",
            "expected_low": 58.4,
            "expected_high": 63.9,
            "likelihood": 0.9999,
        }

    batches: list[list[Any]] = [
        [
            {**scored("d1", 0, "2026-11-29T10:00:00.000Z"), "score": ALERT_SCORE},
            {**scored("d2", 0, "2026-11-29T10:00:01.000Z"), "score": ALERT_SCORE - 0.01},
        ]
    ]
    dest = "bench.run.alerts"
    results = kf.testing.run(
        build_realtime, {"s": batches}, params={"source": "s", "dest": dest}, spark=spark
    )
    [alert] = results.records(dest)
    assert (alert["device"], alert["rule"], alert["status"]) == ("d1", "score", "raised")
    assert alert["time"] == "2026-11-29T10:00:00.000Z"
    # It explains itself as the micro-batch alerts do: the reading, the range expected
    # and the model, beside the score its rule compared.
    assert alert["value"] == ALERT_SCORE
    assert explanation(alert) == "71.2 seen, 58.4 to 63.9 expected (likelihood; 1 in 1e+04)"


def test_what_an_alert_carries_must_be_a_column_and_not_its_own_field(
    spark: SparkSession,
) -> None:
    for carry, message in (("nope", "no column 'nope'"), ("value", "an alert's own field")):

        def build(job: kf.Job, carry: str = carry) -> None:
            readings = job.source("t", realtime_jobs.Reading, key="device")
            readings.alerts(carry=[carry], high=("value", ">", 1)).to(kf.topic("out"))

        with pytest.raises(KappaflowError) as refused:
            kf.testing.run(build, {"t": [[]]}, spark=spark)
        assert refused.value.code == "KF731"
        assert message in str(refused.value)
