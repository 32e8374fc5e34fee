"""The IoT cleaning job under the test harness: the simulator's readings checked, in
canonical units, each once, to Kafka and the lake; what it refuses (readings of devices
not registered, from far in the future or the past, breaking a metric's rules) to the
dead letters."""

from __future__ import annotations

import base64
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
from kappaflow.iot.registry import REGISTRY_TOPIC, digest, register
from kappaflow.iot.simulator import FleetConfig, Simulation, device_names
from kappaflow.iot.telemetry import READINGS_TOPIC, to_canonical
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.kafka.clients import producer
from kappaflow.settings import Settings
from kappaflow.timeutil import to_epoch_ms
from kappaflow.waiting import wait_for

START = datetime(2026, 11, 20, tzinfo=UTC).timestamp()
Record = kf.testing.Record


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


def reading(
    device: str, time: str, metric: str = "room_temp", value: float = 21.5, unit: str = "celsius"
) -> dict[str, Any]:
    return {"device": device, "metric": metric, "value": value, "unit": unit, "time": time,
            "seq": 1, "id": f"{device}/{time}/{metric}"}  # fmt: skip


#: Rules broken by a registered device, in the first batch.
BAD = [
    reading("dev-9", "2026-11-20T00:01:00Z", "humidity", 40.0, "percent"),
    reading("dev-9", "2026-11-20T00:01:00Z", "room_temp", 294.0, "kelvin"),
    reading("dev-9", "2026-11-20T00:01:00Z", "cpu_util", 1.7, "ratio"),
]
#: In the second batch, logged at 00:02: a device not registered, a clock years ahead
#: and one weeks behind.
STRANGERS = [
    reading("dev-x", "2026-11-20T00:01:30Z"),
    reading("dev-9", "2031-01-01T00:00:00Z"),
    reading("dev-9", "2026-10-01T00:00:00Z"),
]
#: In the last batch, logged at 00:03: a clock almost a day ahead, which passes.
AHEAD = reading("dev-9", "2026-11-20T23:00:00Z")


def logged(batch: list[Any], minute: int) -> list[Any]:
    """The batch's records as written to Kafka at the end of the simulation's
    ``minute``."""
    at = datetime.fromtimestamp(START + 60.0 * minute, UTC)
    return [Record(r, timestamp=at) for r in batch]


@pytest.fixture(scope="module")
def cleaned(spark: SparkSession) -> tuple[list[list[Any]], kf.testing.Results]:
    batches = sent_readings()
    batches[2].append(AHEAD)
    devices = sorted({r["device"] for batch in batches for r in batch})
    registry = [
        Record({"device": d, "token_sha256": digest(d), "registered": "2026-11-19T00:00:00Z"}, d)
        for d in devices
    ]
    inputs: list[list[Any]] = [
        logged(batches[0] + BAD, 1),
        logged([*batches[1], *STRANGERS, b'{"device": "dev-9", "metric": '], 2),
        logged(batches[2], 3),
    ]
    return batches, kf.testing.run(
        build, {READINGS_TOPIC: inputs, REGISTRY_TOPIC: [registry]}, spark=spark, name="clean"
    )


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
    # The registry's columns stay out.
    assert {tuple(r) for r in clean} == {("device", "metric", "value", "unit", "time", "seq", "id")}


def test_what_a_reading_breaks_is_said_in_the_dead_letters(
    cleaned: tuple[list[list[Any]], kf.testing.Results],
) -> None:
    batches, out = cleaned
    letters = {d["source_offset"]: d for d in out.dead_letters}
    first = len(batches[0])
    second = first + len(BAD) + len(batches[1])
    assert {offset: d["error"] for offset, d in letters.items()} == {
        first: "unknown metric 'humidity'",
        first + 1: "unit 'kelvin' is not one of metric 'room_temp'",
        first + 2: "value 1.7 is outside the range of metric 'cpu_util'",
        second: "unknown device 'dev-x'",
        second + 1: "time 2031-01-01T00:00:00.000Z is 1502 days after the reading was logged "
        "(at most 1d ahead)",
        second + 2: "time 2026-10-01T00:00:00.000Z is 50 days before the reading was logged "
        "(at most 30d behind)",
        second + 3: "not valid JSON",
    }
    refused = [*BAD, *STRANGERS]
    offsets = [first, first + 1, first + 2, second, second + 1, second + 2]
    assert [json.loads(letters[o]["value"]) for o in offsets] == refused


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
    raw, dest, registry = f"{name}-raw", f"{name}-clean", f"{name}-registry"
    register(serving.kafka, {d: f"token-{d}" for d in device_names(8)}, topic=registry)
    # An hour ago, not a fixed date: the records are stamped when sent, and readings a
    # month older than that would be refused.
    sent = cli(
        "iot", "simulate", "--devices", "8", "--rate", "8", "--start", "1h",
        "--duration", "3m", "--anomalies-per-day", "0", "--readings-topic", raw,
        "--events-topic", f"{name}-events", "--labels", str(tmp_path / "labels.jsonl"),
        "--partitions", "2",
    )  # fmt: skip
    assert sent.code == 0, sent.err
    summary = json.loads(sent.out)
    assert summary["duplicates"] > 0, "no duplicate sent: the test would not cover dedup"
    # Stamped by their producer with a time of their own, as a replay's records are:
    # a device nobody registered, and a clock ten days ahead of its sending.
    strangers = [
        (reading("dev-unknown", "2026-11-20T00:01:00Z"), "2026-11-20T00:01:00Z"),
        (reading("dev-000003", "2026-11-20T00:00:00Z"), "2026-11-10T00:00:00Z"),
    ]
    client = producer(serving.kafka, acks="all")
    for value, stamp in strangers:
        at = to_epoch_ms(datetime.fromisoformat(stamp))
        client.produce(raw, json.dumps(value).encode(), value["device"].encode(), timestamp=at)
    assert client.flush(30) == 0
    context = JobContext(name, {"source": raw, "dest": dest, "registry": registry}, spark, serving)
    queries = start_app(build, context)
    try:

        def all_judged() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            values, letters = topic_values(serving, dest), topic_values(serving, f"{name}.dlq")
            done = len(values) >= summary["readings"] and len(letters) >= len(strangers)
            return (values, letters) if done else None

        clean, letters = wait_for(
            all_judged, timeout=180, interval=1.0, what="every reading cleaned or refused"
        )
        # A device removed by a tombstone on the registry: its next reading is unknown.
        removal = producer(serving.kafka, acks="all")
        removal.produce(registry, None, b"dev-000005")
        assert removal.flush(30) == 0
        now = datetime.now(UTC).isoformat()
        removed = reading("dev-000005", now)
        kept = reading("dev-000004", now)
        client.produce(raw, json.dumps(removed).encode(), b"dev-000005")
        client.produce(raw, json.dumps(kept).encode(), b"dev-000004")
        assert client.flush(30) == 0

        def judged_after() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            values, found = topic_values(serving, dest), topic_values(serving, f"{name}.dlq")
            passed = [v for v in values if v["id"] in (removed["id"], kept["id"])]
            refused = [
                d for d in found if removed["id"] in base64.b64decode(d["value_base64"]).decode()
            ]
            judged = len(passed) + len(refused)
            return (passed, refused) if judged >= 2 else None

        passed_after, refused_after = wait_for(
            judged_after, timeout=180, interval=1.0, what="the readings after the removal"
        )
    finally:
        for query in queries:
            query.stop()
    # Each reading once, duplicates dropped; the strangers refused, with their bytes.
    assert len(clean) == len({v["id"] for v in clean}) == summary["readings"]
    assert sorted(
        (d["error"], json.loads(base64.b64decode(d["value_base64"]))) for d in letters
    ) == [
        (
            "time 2026-11-20T00:00:00.000Z is 10 days after the reading was logged "
            "(at most 1d ahead)",
            strangers[1][0],
        ),
        ("unknown device 'dev-unknown'", strangers[0][0]),
    ]
    # After its removal, the device's reading is refused; another device's passes.
    assert [(v["device"], v["id"]) for v in passed_after] == [("dev-000004", kept["id"])]
    assert [
        (d["error"], json.loads(base64.b64decode(d["value_base64"]))) for d in refused_after
    ] == [("unknown device 'dev-000005'", removed)]
