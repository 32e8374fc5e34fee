"""Jobs on the job API in Spark's real-time mode (``jobs start --real-time``): a windowed
job's changes come out as they happen, provisional then final on the executors' clock,
keyed and versioned, with the same final values as the micro-batch path for the same
input; a job with a Python operator is refused, naming it."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import realtime_jobs
from live_jobs import send_json, stop_if_running
from pyspark.sql import SparkSession

from kappaflow.errors import RealTimeModeError
from kappaflow.jobs.from_build import KafkaReader
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.streams.realtime import refuse_python
from kappaflow.streams.runtime import declare
from kappaflow.waiting import wait_for
from test_app_jobs import PATH


def _reading(device: str, value: float, at_ms: int | None = None) -> dict[str, Any]:
    at = at_ms if at_ms is not None else int(time.time() * 1000)
    stamp = datetime.fromtimestamp(at / 1000, UTC).isoformat(timespec="milliseconds")
    return {"device": device, "value": value, "time": stamp.replace("+00:00", "Z")}


def _records(settings: Settings, topic: str) -> list[tuple[bytes, dict[str, Any]]]:
    return [
        (m.key() or b"", json.loads(m.value() or b"{}"))
        for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
    ]


def _finals(
    settings: Settings,
    topic: str,
    windows: set[tuple[str, str]],
    tick: Callable[[], None],
    timeout: float = 120,
) -> dict[tuple[str, str], dict[str, Any]]:
    """The final record of each (device, window_start) of ``windows``, once all are in;
    ``tick`` each poll (a real-time task checks its timers when a record comes)."""

    def probe() -> dict[tuple[str, str], dict[str, Any]] | None:
        tick()
        found = {
            (v["device"], v["window_start"]): v
            for _k, v in _records(settings, topic)
            if v["kind"] == "final"
        }
        return {w: found[w] for w in windows} if windows <= set(found) else None

    return wait_for(probe, timeout=timeout, interval=0.5, what=f"final windows in {topic}")


def test_a_windowed_job_in_real_time_mode_emits_provisional_and_final_values_as_micro_batches_do(
    cli: Any, serving: Settings, new_topic: Any
) -> None:
    topic = new_topic()
    env = {"PYTHONPATH": PATH}
    rt, mb = (f"rt-{kind}-{uuid.uuid4().hex[:6]}" for kind in ("real", "micro"))

    def tick() -> None:
        send_json(serving, topic, [_reading("tick", 0.0)], key="device")

    started = cli(
        "jobs", "start", rt, "--app", "realtime_jobs:windows", "--real-time",
        "-P", f"topic={topic}", env=env,
    )  # fmt: skip
    assert started.code == 0, started.err
    try:
        # Readings count once the query's tasks run: until then a reading may come too
        # late for its window, on the clock.
        def first_change() -> bool | None:
            tick()
            return True if _records(serving, f"{rt}.stats") else None

        wait_for(
            first_change,
            timeout=180,
            interval=1.0,
            what=f"{rt}'s first change",
        )
        sent = [("a", 1.5), ("b", 4.0), ("a", 2.5), ("a", 7.0), ("b", 1.0)]
        for device, value in sent:
            send_json(serving, topic, [_reading(device, value)], key="device")

        # Provisional changes for both devices as the readings come.
        def both() -> list[dict[str, Any]] | None:
            found = _device_changes(serving, rt)
            return found if {v["device"] for v in found} == {"a", "b"} else None

        changes = wait_for(both, timeout=60, interval=0.2, what=f"{rt}'s changes of a and b")
        assert all(v["kind"] == "provisional" for v in changes)
        windows = {(v["device"], v["window_start"]) for v in changes}
        finals = _finals(serving, f"{rt}.stats", windows, tick)
        records = [(k, v) for k, v in _records(serving, f"{rt}.stats") if v["device"] in ("a", "b")]
        for (device, start), final in finals.items():
            mine = [
                (k, v) for k, v in records if (v["device"], v["window_start"]) == (device, start)
            ]
            kinds = [v["kind"] for _k, v in mine]
            assert kinds[0] == "provisional" and kinds[-1] == "final", kinds
            # Keyed by the window's key and start; each change one version on.
            assert {k for k, _v in mine} == {f'["{device}", {_ms(start)}]'.encode()}
            assert [v["version"] for _k, v in mine] == list(range(1, len(mine) + 1))
            assert final["values"] == mine[-2][1]["values"] and final["batch"] is None
        totals = {d: sum(v for dd, v in sent if dd == d) for d in ("a", "b")}
        assert {
            d: sum(f["values"]["total"] for (dd, _s), f in finals.items() if dd == d)
            for d in ("a", "b")
        } == totals
        # The serving store holds each window's final value.
        client = redis_client(serving)
        for (device, start), final in finals.items():
            raw = client.hget(f"kf:{rt}:stats:w:" + json.dumps([device]), str(_ms(start)))
            assert raw is not None
            held = json.loads(raw)
            assert held == {
                "end": _ms(final["window_end"]),
                "values": final["values"],
                "version": final["version"],
                "final": True,
            }
    finally:
        stop_if_running(serving, rt)
    # The micro-batch path, over the same records: the same final values.
    started = cli(
        "jobs", "start", mb, "--app", "realtime_jobs:windows", "-P", f"topic={topic}", env=env
    )
    assert started.code == 0, started.err
    try:
        theirs = _finals(serving, f"{mb}.stats", set(finals), lambda: None, timeout=240)
        assert {w: theirs[w]["values"] for w in finals} == {
            w: f["values"] for w, f in finals.items()
        }
    finally:
        stop_if_running(serving, mb)


def _device_changes(settings: Settings, job: str) -> list[dict[str, Any]]:
    return [v for _k, v in _records(settings, f"{job}.stats") if v["device"] in ("a", "b")]


def _ms(iso: str) -> int:
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (realtime_jobs.with_stateful, "the @kf.stateful function 'last_seen'"),
        (realtime_jobs.with_udf, "the Python UDF <lambda>(value)"),
    ],
)
def test_a_python_operator_is_refused_in_real_time_mode_by_name(
    spark: SparkSession, kafka: Settings, build: Any, named: str
) -> None:
    job = declare(build, "rt-refused", {"topic": "t", "dest": "d"}, spark, KafkaReader(kafka))
    with pytest.raises(RealTimeModeError) as refused:
        refuse_python(job)
    assert refused.value.code == "KF736"
    assert named in str(refused.value)


def test_a_table_written_in_micro_batches_only_is_refused_in_real_time_mode(
    spark: SparkSession, kafka: Settings
) -> None:
    job = declare(realtime_jobs.with_postgres, "rt-pg", {"topic": "t"}, spark, KafkaReader(kafka))
    with pytest.raises(RealTimeModeError) as refused:
        refuse_python(job)
    assert refused.value.code == "KF736"
    assert "PostgreSQL table 'device_stats'" in str(refused.value)


def test_a_declarative_windowed_job_is_not_refused(spark: SparkSession, kafka: Settings) -> None:
    job = declare(realtime_jobs.windows, "rt-ok", {"topic": "t"}, spark, KafkaReader(kafka))
    refuse_python(job)


def test_the_cli_refuses_a_job_with_a_udf_before_its_queries_start(
    cli: Any, serving: Settings, new_topic: Any
) -> None:
    topic = new_topic()
    job = f"rt-udf-{uuid.uuid4().hex[:6]}"
    env = {"PYTHONPATH": PATH}
    try:
        started = cli(
            "jobs", "start", job, "--app", "realtime_jobs:with_udf", "--real-time",
            "-P", f"topic={topic}", "-P", "dest=out", env=env,
        )  # fmt: skip
        assert started.code != 0
        assert "RealTimeModeError" in started.err and "<lambda>(value)" in started.err
    finally:
        stop_if_running(serving, job)


def test_alert_rules_run_in_real_time_mode(cli: Any, serving: Settings, new_topic: Any) -> None:
    """A job of declarative alert rules (realtime_jobs.alerts) in real-time mode: an alert
    per reading a rule holds for, as it comes; the store keeps each device's latest."""
    topic, dest = new_topic(), new_topic()
    job = f"rt-alerts-{uuid.uuid4().hex[:6]}"
    env = {"PYTHONPATH": PATH}
    started = cli(
        "jobs", "start", job, "--app", "realtime_jobs:alerts", "--real-time",
        "-P", f"topic={topic}", "-P", f"dest={dest}", env=env,
    )  # fmt: skip
    assert started.code == 0, started.err
    try:
        send_json(
            serving,
            topic,
            [_reading("a", 9.0), _reading("b", 1.0), _reading("c", -2.0), _reading("a", 5.0)],
            key="device",
        )
        alerts = wait_for(
            lambda: found if len(found := _records(serving, dest)) >= 3 else None,
            timeout=180,
            interval=0.5,
            what=f"{job}'s alerts",
        )
        got = sorted((k, v["rule"], v["value"]) for k, v in alerts)
        assert got == [
            (b'["a"]', "high", 5.0),
            (b'["a"]', "high", 9.0),
            (b'["c"]', "negative", -2.0),
        ]
        latest = redis_client(serving).hgetall(f"kf:{job}:{dest}:latest")
        assert sorted(latest) == [b'["a"]', b'["c"]']
    finally:
        stop_if_running(serving, job)
