"""Redis, `kappaflow setup`, `up | down | status` and the global flags, on services of
their own (the MQTT broker's own tests are in test_iot_mqtt.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
import redis
from conftest import (
    EXTERNAL_KAFKA,
    JARS,
    Result,
    error_line,
    is_loopback,
    make_settings,
    run_kappaflow,
)

from kappaflow import __version__, services
from kappaflow.counting.spec import CountSpec
from kappaflow.jobs.manager import JobManager, JobRecord
from kappaflow.procs import ProcState, free_port
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings
from kappaflow.streams.output.backends import BatchAccount, RedisStore

# Starts services of its own.
pytestmark = pytest.mark.integration


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(tmp_path / "state")
    yield settings
    services.down(settings)


def test_redis_keeps_data_across_restarts(own: Settings) -> None:
    store = EmbeddedRedis(own)
    assert store.start() is True
    assert store.start() is False
    client = redis.Redis.from_url(store.url)
    client.hset("window:1", mapping={"count": 3})
    client.close()
    assert store.stop() is True
    assert store.status().state is ProcState.STOPPED
    store.start()
    client = redis.Redis.from_url(store.url)
    assert client.hget("window:1", "count") == b"3"
    client.close()


@pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="starts an embedded broker")
def test_up_status_down(own: Settings) -> None:
    up = run_kappaflow(own, "up")
    assert up.code == 0, up.err
    rows = {
        r["service"]: r for r in map(json.loads, run_kappaflow(own, "status", "--json").lines())
    }
    assert {r["state"] for r in rows.values()} == {"running"}
    assert list(rows) == ["kafka", "redis", "mqtt", "api"]
    assert rows["kafka"]["address"] == own.kafka.bootstrap
    assert rows["mqtt"]["address"] == f"mqtt://127.0.0.1:{own.mqtt.port}"
    again = run_kappaflow(own, "up")
    assert rows["api"]["address"] == f"http://127.0.0.1:{own.api.port}"
    assert again.err.count("already running") == 4
    # By default nothing embedded listens beyond loopback.
    for row in rows.values():
        listening = [
            c.laddr
            for c in psutil.Process(row["pid"]).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert listening and all(is_loopback(a.ip) for a in listening), (row, listening)
    down = run_kappaflow(own, "down")
    assert down.code == 0
    assert [line.split()[0] for line in down.err.splitlines()] == ["api", "mqtt", "redis", "kafka"]
    rows = {
        r["service"]: r for r in map(json.loads, run_kappaflow(own, "status", "--json").lines())
    }
    assert {r["state"] for r in rows.values()} == {"stopped"}


@pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="starts an embedded broker")
def test_a_command_stops_only_the_services_it_started(own: Settings) -> None:
    """What the demo and the benchmarks do: Redis ran before, so it keeps running."""
    assert EmbeddedRedis(own).start() is True
    said: list[str] = []
    with services.embedded_services(own, said.append):
        states = {r.service: r.state for r in services.status(own)}
        running = {"kafka": "running", "redis": "running", "mqtt": "running"}
        assert states == {**running, "api": "stopped"}
    mqtt = f"mqtt://127.0.0.1:{own.mqtt.port}"
    assert said == [
        f"kafka started on {own.kafka.bootstrap}",
        f"mqtt started on {mqtt}",
        "mqtt stopped",
        "kafka stopped",
    ]
    assert {r.service: r.state for r in services.status(own)} == {
        "kafka": "stopped",
        "redis": "running",
        "mqtt": "stopped",
        "api": "stopped",
    }


def test_external_services_are_not_managed(own: Settings) -> None:
    env = {
        "KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": "kafka.example:9092",
        "KAPPAFLOW_REDIS__URL": "redis://cache.example:6379/0",
        "KAPPAFLOW_MQTT__URL": "mqtt://mqtt.example:1883",
    }
    rows = [json.loads(line) for line in run_kappaflow(own, "status", "--json", env=env).lines()]
    states = {r["service"]: r["state"] for r in rows}
    external = {"kafka": "external", "redis": "external", "mqtt": "external"}
    assert states == {**external, "api": "stopped"}
    refused = run_kappaflow(own, "kafka", "start", env=env)
    assert refused.code == 1
    assert "external" in refused.err


def test_setup_again_finds_everything_in_place(own: Settings) -> None:
    """With the suite's jars resolved and built and the class-data archive written, setup
    checks, resolves nothing, builds nothing and fetches no Maven: a second run says the
    same as the first."""
    built = [*JARS.glob("localfs/*"), *JARS.glob("iot/*"), *JARS.glob("cds/*")]
    made = [*JARS.glob("*/.resolved"), *built]
    before = {path: path.stat().st_mtime_ns for path in made}
    runs = [run_kappaflow(own, "setup", timeout=120) for _ in range(2)]
    for result in runs:
        assert result.code == 0, result.err
        # Nothing resolved, built or installed.
        # (Without mosquitto, a line says the broker is amqtt before the broker's line.)
        java, found, *_, mqtt, ready = result.err.splitlines()
        assert java.startswith("java ") and found.startswith("redis-server at ")
        assert mqtt.startswith("mqtt broker: ")
        assert ready == f"jars ready in {JARS}"
        assert result.out == ""
    assert runs[0].err == runs[1].err
    assert {path: path.stat().st_mtime_ns for path in made} == before
    assert not (own.state_dir / "tools").exists()  # no Maven fetched


def test_redis_commands_and_the_global_flags(own: Settings, tmp_path: Path) -> None:
    version = run_kappaflow(own, "--version")
    assert (version.code, version.out) == (0, f"kappaflow, version {__version__}\n")

    # --state-dir wins over KAPPAFLOW_STATE_DIR, which run_kappaflow sets to own's.
    state = tmp_path / "flagged"
    url = own.redis.effective_url

    def managed(*args: str) -> Result:
        return run_kappaflow(own, "--state-dir", str(state), *args)

    def status() -> dict[str, object]:
        shown = managed("redis", "status", "--json")
        assert shown.code == 0, shown.err
        row: dict[str, object] = json.loads(shown.out)
        return row

    assert status() == {"state": "stopped", "pid": None, "url": url, "started_at": None}
    try:
        started = managed("redis", "start")
        assert (started.code, started.err) == (0, f"redis started on {url}\n")
        running = status()
        assert running["state"] == "running" and running["started_at"]
        assert (state / "redis" / "redis.pid").read_text().split()[0] == str(running["pid"])
        assert not (own.state_dir / "redis").exists()
        assert managed("redis", "start").err == f"redis already running on {url}\n"

        # That Redis, given by URL from another state directory, is external: used,
        # never started or stopped.
        other = tmp_path / "other"

        def external(*args: str, at: str = url) -> Result:
            return run_kappaflow(own, "--state-dir", str(other), "--redis-url", at, *args)

        for command in ("start", "stop", "status"):
            assert "Redis is external" in error_line(external("redis", command), "KF305", 1)
        rows = [json.loads(line) for line in external("status", "--json").lines()]
        assert rows[1] == {"service": "redis", "state": "external", "address": url, "pid": None}
        down = external("down")
        assert (down.code, down.err) == (
            0,
            "api was not running\nmqtt was not running\nkafka was not running\n",
        )
        assert status() == running

        spec = CountSpec(source="views", key_field="page", time_field="ts", window_ms=60_000)
        home = JobManager(own.model_copy(update={"state_dir": other})).job_dir("views")
        home.mkdir(parents=True)
        JobRecord(name="views", pipeline="count", params=spec.to_params()).save(home / "job.json")
        window = {"key": ['["/a"]'], "window_start": [0], "window_end": [60_000]}
        RedisStore(redis.Redis.from_url(url), "views").apply(
            "counts",
            0,
            pa.table({**window, "kind": ["final"], "values": ['{"count":3}'], "version": [2],
                      "watermark": [60_000]}),
            BatchAccount({"events": 3}, 60_000, {}),
        )  # fmt: skip
        counted = external("counts", "views")
        assert counted.code == 0, counted.err
        assert [json.loads(line)["count"] for line in counted.lines()] == [3]
        nowhere = f"redis://127.0.0.1:{free_port()}/0"
        refused = error_line(external("counts", "views", at=nowhere), "KF306", 1)
        assert nowhere in refused and "check redis.url" in refused

        stopped = managed("redis", "stop")
        assert (stopped.code, stopped.err) == (0, "redis stopped\n")
        assert managed("redis", "stop").err == "redis was not running\n"
        assert status() == {"state": "stopped", "pid": None, "url": url, "started_at": None}
    finally:
        EmbeddedRedis(own.model_copy(update={"state_dir": state})).stop()
