"""`make demo`'s command, run for real: devices over HTTP and MQTT, the application's jobs,
the live panel, and a clean stop of everything it started."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXTERNAL_KAFKA, make_settings, run_kappaflow

from kappaflow import services
from kappaflow.api.server import EmbeddedApi
from kappaflow.demos.iot import ALERTS, JOB, MODELS, SCORER
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.mqtt.broker import EmbeddedMqtt
from kappaflow.procs import ProcState
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings

pytestmark = [
    pytest.mark.long,
    pytest.mark.integration,
    pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="starts services of its own"),
]


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(tmp_path / "state")
    yield settings
    services.down(settings)


# Its own wait for the demo's end is 900 s: pytest's timeout must not cut it short.
@pytest.mark.timeout(1100)
def test_the_demo_streams_learns_and_stops_what_it_started(own: Settings) -> None:
    # Kafka runs before the demo and keeps running; Redis and MQTT the demo starts and stops.
    assert EmbeddedBroker(own).start() is True
    # A global option of the command reaches the job's driver.
    result = run_kappaflow(
        own,
        "--spark-master",
        "local[2]",
        "iot",
        "demo",
        "--devices",
        "12",
        "--rate",
        "60",
        "--duration",
        "60s",
        "--port",
        "0",
        timeout=900,
    )
    assert result.code == 0, result.err[-3000:]
    summary = json.loads(result.lines()[-1])
    assert JobManager(own).get(JOB).overrides.spark_master == "local[2]"
    for path in ("http", "mqtt"):
        assert summary[path]["acknowledged"] > 1_000, summary
        assert summary[path]["lost"] == 0, summary
    # Devices' presence came through the device-state part and the serving store.
    assert summary["online"] >= 1, summary
    assert summary["models"] > 0 and summary["model_version"] >= 1, summary
    # The real-time scorer, a job of its own, scored readings as they came.
    assert summary["scored"] > 0, summary
    # The panel was drawn, with its figures.
    assert "devices online" in result.err and "latest model version" in result.err
    assert f"dashboard on {own.api.url}/" in result.err
    # The demo injects anomalies on purpose: the alerting part raised alerts for them,
    # and what the panel showed open last is among the keys raised.
    alerts = [
        json.loads(r.value() or b"{}")
        for r in read_records(own.kafka, ALERTS, start=StartAt(beginning=True))
    ]
    raised = {(a["device"], a["metric"]) for a in alerts if a["status"] == "raised"}
    assert raised, summary
    assert {a["status"] for a in alerts} <= {"raised", "resolved"}
    assert {a["rule"] for a in alerts} <= {"anomaly", "rate", "no_data"}
    assert summary["open_alerts"] <= len(raised), summary
    # Models were published to the demo's compacted topic while it ran.
    assert any(True for _ in read_records(own.kafka, MODELS, start=StartAt(beginning=True)))
    # Everything the demo started is stopped; what ran before runs on.
    assert JobManager(own).get_state(JOB) == JobManager(own).get_state(SCORER) == "stopped"
    assert EmbeddedRedis(own).status().state is ProcState.STOPPED
    assert EmbeddedMqtt(own).status().state is ProcState.STOPPED
    assert EmbeddedApi(own).status().state is ProcState.STOPPED
    assert EmbeddedBroker(own).status().state is ProcState.RUNNING
