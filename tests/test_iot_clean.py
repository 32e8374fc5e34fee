"""The IoT cleaning job under the test harness: the simulator's readings checked, in
canonical units, each once, to Kafka and the lake; what it refuses to the dead letters."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import RunCli
from live_jobs import topic_values
from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.iot.clean import CLEAN_TOPIC, build
from kappaflow.iot.simulator import FleetConfig, Simulation
from kappaflow.iot.telemetry import READINGS_TOPIC, to_canonical
from kappaflow.jobs.pipeline import JobContext
from kappaflow.settings import Settings
from kappaflow.streams.app import start_app
from kappaflow.waiting import wait_for

START = datetime(2026, 11, 20, tzinfo=UTC).timestamp()


def sent_readings() -> list[list[Any]]:
    """Three minutes of eight devices, half of them imperial, with many duplicates, in
    three batches."""
    config = replace(
        FleetConfig(devices=8, rate=8.0, seed=3),
        imperial_share=0.5,
        duplicate_share=0.1,
        anomalies_per_day=0.0,
        silences_per_day=0.0,
    )
    simulation = Simulation(config, START)
    batches = []
    for minute in range(1, 4):
        records, _ = simulation.advance(START + 60.0 * minute)
        batches.append([json.loads(r.value) for r in records if r.topic == READINGS_TOPIC])
    batches[-1] += [json.loads(r.value) for r in simulation.drain() if r.topic == READINGS_TOPIC]
    return batches


BAD = [
    {"device": "dev-9", "metric": "humidity", "value": 40.0, "unit": "percent",
     "time": "2026-11-20T00:01:00Z", "seq": 1, "id": "dev-9/1/humidity"},
    {"device": "dev-9", "metric": "room_temp", "value": 294.0, "unit": "kelvin",
     "time": "2026-11-20T00:01:00Z", "seq": 1, "id": "dev-9/1/room_temp"},
    {"device": "dev-9", "metric": "cpu_util", "value": 1.7, "unit": "ratio",
     "time": "2026-11-20T00:01:00Z", "seq": 1, "id": "dev-9/1/cpu_util"},
]  # fmt: skip


@pytest.fixture(scope="module")
def cleaned(spark: SparkSession) -> tuple[list[list[Any]], kf.testing.Results]:
    batches = sent_readings()
    inputs: list[list[Any]] = [
        batches[0] + BAD,
        [*batches[1], b'{"device": "dev-9", "metric": '],
        batches[2],
    ]
    return batches, kf.testing.run(build, {READINGS_TOPIC: inputs}, spark=spark, name="clean")


def test_each_reading_passes_once_in_canonical_units(
    cleaned: tuple[list[list[Any]], kf.testing.Results],
) -> None:
    batches, out = cleaned
    sent = [r for batch in batches for r in batch]
    by_id = {r["id"]: r for r in sent}
    assert len(by_id) < len(sent), "no duplicate sent: the test would not cover dedup"
    clean = out.records(CLEAN_TOPIC)
    assert Counter(r["id"] for r in clean) == Counter(by_id.keys())
    units: Counter[str] = Counter()
    for record in clean:
        original = by_id[record["id"]]
        units[original["unit"]] += 1
        assert record["value"] == pytest.approx(
            to_canonical(original["unit"], original["value"]), abs=1e-3
        )
        assert record["unit"] in {"celsius", "percent", "rpm"}
    assert units["fahrenheit"] > 0 and units["ratio"] > 0
    assert {tuple(k) for k in out.keys(CLEAN_TOPIC)} == {(r["device"],) for r in clean}


def test_what_a_reading_breaks_is_said_in_the_dead_letters(
    cleaned: tuple[list[list[Any]], kf.testing.Results],
) -> None:
    _, out = cleaned
    reasons = {d["source_offset"]: d["error"] for d in out.dead_letters}
    first = len(cleaned[0][0])
    assert reasons == {
        first: "unknown metric 'humidity'",
        first + 1: "unit 'kelvin' is not one of metric 'room_temp'",
        first + 2: "value 1.7 is outside the range of metric 'cpu_util'",
        first + 3 + len(cleaned[0][1]): "not valid JSON",
    }


def test_the_lake_holds_the_clean_readings_by_metric_and_date(
    cleaned: tuple[list[list[Any]], kf.testing.Results],
) -> None:
    _, out = cleaned
    rows = out.lake("telemetry")
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in out.records(CLEAN_TOPIC))
    table = out.lake_root / "clean" / "telemetry"
    # date=YYYY-MM-DD/metric=NAME: the readings' UTC dates (a skewed clock may reach
    # into the day before), then their metrics.
    assert {p.name for p in table.glob("date=*")} <= {"date=2026-11-19", "date=2026-11-20"}
    metrics = {p.name for p in table.glob("date=*/metric=*")}
    assert metrics == {
        f"metric={m}"
        for m in ("room_temp", "cpu_temp", "disk_temp", "cpu_util", "mem_util", "fan_rpm")
    }


def test_the_cleaning_job_on_the_broker(
    spark: SparkSession, serving: Settings, cli: RunCli, tmp_path: Path
) -> None:
    name = f"iot-clean-{uuid.uuid4().hex[:8]}"
    raw, dest = f"{name}-raw", f"{name}-clean"
    sent = cli(
        "iot", "simulate", "--devices", "8", "--rate", "8", "--start", "2026-11-20T00:00:00Z",
        "--duration", "3m", "--readings-topic", raw, "--events-topic", f"{name}-events",
        "--labels", str(tmp_path / "labels.jsonl"), "--partitions", "2",
    )  # fmt: skip
    assert sent.code == 0, sent.err
    summary = json.loads(sent.out)
    assert summary["duplicates"] > 0, "no duplicate sent: the test would not cover dedup"
    queries = start_app(build, JobContext(name, {"source": raw, "dest": dest}, spark, serving))
    try:

        def all_passed() -> list[dict[str, Any]] | None:
            values = topic_values(serving, dest)
            return values if len(values) >= summary["readings"] else None

        clean = wait_for(all_passed, timeout=180, interval=1.0, what="every reading cleaned")
    finally:
        for query in queries:
            query.stop()
    # Each reading once, duplicates dropped, nothing refused.
    assert len(clean) == len({v["id"] for v in clean}) == summary["readings"]
    assert topic_values(serving, f"{name}.dlq") == []
