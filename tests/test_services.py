"""Redis and `kappaflow up | down | status`, on services of their own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import redis

from conftest import EXTERNAL_KAFKA, is_loopback, make_settings, run_kappaflow
from kappaflow import services
from kappaflow.procs import ProcState
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings

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
    assert rows["kafka"]["state"] == "running" and rows["redis"]["state"] == "running"
    assert rows["kafka"]["address"] == own.kafka.bootstrap
    again = run_kappaflow(own, "up")
    assert again.err.count("already running") == 2
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
        assert states == {"kafka": "running", "redis": "running"}
    assert said == [f"kafka started on {own.kafka.bootstrap}", "kafka stopped"]
    assert {r.service: r.state for r in services.status(own)} == {
        "kafka": "stopped",
        "redis": "running",
    }


def test_external_services_are_not_managed(own: Settings) -> None:
    env = {
        "KAPPAFLOW_KAFKA__BOOTSTRAP_SERVERS": "kafka.example:9092",
        "KAPPAFLOW_REDIS__URL": "redis://cache.example:6379/0",
    }
    rows = [json.loads(line) for line in run_kappaflow(own, "status", "--json", env=env).lines()]
    assert {r["state"] for r in rows} == {"external"}
    refused = run_kappaflow(own, "kafka", "start", env=env)
    assert refused.code == 1
    assert "external" in refused.err
