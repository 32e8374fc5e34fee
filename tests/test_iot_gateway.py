"""The HTTP gateway against the real broker: what it acknowledges is in Kafka, what it
refuses is in its dead letters with the reason, and it says 503 and 429 when it must."""

from __future__ import annotations

import base64
import json
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from confluent_kafka import Producer
from conftest import EXTERNAL_KAFKA, RunCli, error_line, make_settings
from live_jobs import topic_values

from kappaflow.iot.gateway import Gateway, GatewayConfig, create_app
from kappaflow.iot.registry import Registry, load_tokens, register
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

pytestmark = pytest.mark.integration


@dataclass
class Running:
    url: str
    gateway: Gateway
    config: GatewayConfig
    tokens: dict[str, str]
    registry_topic: str

    def post(
        self, device: str, body: Any, *, token: str | None = None, kind: str = "readings"
    ) -> httpx.Response:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        bearer = token if token is not None else self.tokens.get(device, "")
        return httpx.post(
            f"{self.url}/v1/devices/{device}/{kind}",
            content=raw,
            headers={"Authorization": f"Bearer {bearer}"} if bearer else {},
            timeout=60,
        )


@contextmanager
def gateway_on(settings: Settings, **limits: Any) -> Iterator[Running]:
    """A gateway on a free port, on topics of its own, with two registered devices."""
    suffix = uuid.uuid4().hex[:8]
    config = GatewayConfig(
        readings_topic=f"raw-{suffix}",
        events_topic=f"events-{suffix}",
        dlq_topic=f"gwdlq-{suffix}",
        partitions=2,
        **limits,
    )
    tokens = {"dev-1": f"secret-1-{suffix}", "dev-2": f"secret-2-{suffix}"}
    registry_topic = f"registry-{suffix}"
    register(settings.kafka, tokens, topic=registry_topic)
    gateway = Gateway(settings.kafka, Registry(settings.kafka, registry_topic), config)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=60, what="the gateway to listen")
    try:
        yield Running(f"http://127.0.0.1:{port}", gateway, config, tokens, registry_topic)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def reading(n: int, **fields: Any) -> dict[str, Any]:
    return {
        "metric": "cpu_temp",
        "value": 40.0 + n,
        "unit": "celsius",
        "time": "2026-11-26T10:00:00Z",
        "seq": n,
        "id": f"r{n}",
        **fields,
    }


def letters(settings: Settings, topic: str) -> list[dict[str, Any]]:
    found = topic_values(settings, topic)
    for letter in found:
        letter["value"] = base64.b64decode(letter["value_base64"] or "")
    return found


def test_readings_and_events_are_in_kafka_when_the_answer_comes(kafka: Settings) -> None:
    with gateway_on(kafka) as gw:
        batch = gw.post("dev-1", [reading(n) for n in range(50)])
        assert batch.status_code == 200
        assert batch.json() == {"accepted": 50, "rejected": []}
        one = gw.post("dev-2", reading(7, device="dev-2", time=1_764_151_200_000))
        assert one.json() == {"accepted": 1, "rejected": []}
        event = gw.post(
            "dev-1", {"time": "2026-11-26T10:00:01Z", "kind": "heartbeat"}, kind="events"
        )
        assert event.status_code == 200
        # Acknowledged means written: read at once, without waiting.
        values = topic_values(kafka, gw.config.readings_topic)
        events = topic_values(kafka, gw.config.events_topic)
        health = httpx.get(f"{gw.url}/v1/health").json()
    assert sorted((v["device"], v["id"]) for v in values) == sorted(
        [("dev-1", f"r{n}") for n in range(50)] + [("dev-2", "r7")]
    )
    assert events == [{"time": "2026-11-26T10:00:01Z", "kind": "heartbeat", "device": "dev-1"}]
    assert health["devices"] == 2 and health["counts"]["accepted"] == 52


def test_bad_items_go_to_the_dead_letters_with_reason_and_bytes(kafka: Settings) -> None:
    bad = [
        reading(1, value="hot"),
        reading(2, time="2026-11-26 10:00:00"),
        reading(3, time=1_764_151_200),
        reading(4, device="dev-2"),
        reading(5, colour="red"),
        [1, 2],
        reading(6, value=float("nan")),
    ]
    with gateway_on(kafka) as gw:
        answer = gw.post("dev-1", [reading(0), *bad], token=None)
        values = topic_values(kafka, gw.config.readings_topic)
        dead = letters(kafka, gw.config.dlq_topic)
        counts = gw.gateway.counts
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == 1
    assert [r["index"] for r in body["rejected"]] == [1, 2, 3, 4, 5, 6, 7]
    assert [v["id"] for v in values] == ["r0"]
    reasons = [d["error"] for d in dead]
    assert reasons[0].startswith("value: Input should be a valid number")
    assert "has no time zone" in reasons[1]
    assert "seconds, not milliseconds" in reasons[2]
    assert "not the device of the path" in reasons[3]
    assert reasons[4].startswith("colour: Extra inputs are not permitted")
    assert "must be a JSON object, not list" in reasons[5]
    assert "finite" in reasons[6]
    assert json.loads(dead[0]["value"]) == bad[0]
    assert all(d["device"] == "dev-1" and d["source"] == "gateway" for d in dead)
    assert counts["rejected"] == 7


def test_refusals_are_json_errors_and_dead_letters(kafka: Settings) -> None:
    with gateway_on(kafka) as gw:
        wrong = gw.post("dev-1", reading(1), token="not-it")
        missing = gw.post("dev-1", reading(1), token="")
        unknown = gw.post("dev-9", reading(1), token="whatever")
        garbage = gw.post("dev-1", b"\x00not json{")
        too_many = gw.post("dev-1", [reading(n) for n in range(5_001)])
        dead = letters(kafka, gw.config.dlq_topic)
        assert topic_values(kafka, gw.config.readings_topic) == []
    assert (wrong.status_code, wrong.json()["code"]) == (401, "KF802")
    assert (missing.status_code, missing.json()["code"]) == (401, "KF802")
    assert (unknown.status_code, unknown.json()["code"]) == (404, "KF803")
    assert (garbage.status_code, garbage.json()["code"]) == (400, "KF801")
    assert (too_many.status_code, too_many.json()["code"]) == (400, "KF801")
    assert [d["error"] for d in dead] == [
        "missing or wrong token",
        "missing or wrong token",
        "unknown device",
        dead[3]["error"],
    ]
    assert dead[3]["error"].startswith("not JSON")
    assert dead[3]["value"] == b"\x00not json{"
    assert json.loads(dead[2]["value"]) == reading(1)


def test_a_device_removed_from_the_registry_is_unknown_from_then_on(kafka: Settings) -> None:
    with gateway_on(kafka) as gw:
        before = gw.post("dev-2", reading(1, device="dev-2"))
        assert before.json() == {"accepted": 1, "rejected": []}
        # A tombstone on the registry topic removes the device, as the gateway follows it.
        removal = Producer(kafka.kafka.client_config())
        removal.produce(gw.registry_topic, key=b"dev-2", value=None)
        assert removal.flush(30) == 0
        wait_for(
            lambda: True if httpx.get(f"{gw.url}/v1/health").json()["devices"] == 1 else None,
            timeout=60,
            what="the gateway to read the removal",
        )
        after = gw.post("dev-2", reading(2, device="dev-2"))
        still = gw.post("dev-1", reading(3))
        values = topic_values(kafka, gw.config.readings_topic)
        dead = letters(kafka, gw.config.dlq_topic)
    assert (after.status_code, after.json()["code"]) == (404, "KF803")
    assert still.json() == {"accepted": 1, "rejected": []}
    assert sorted((v["device"], v["id"]) for v in values) == [("dev-1", "r3"), ("dev-2", "r1")]
    assert [(d["device"], d["error"]) for d in dead] == [("dev-2", "unknown device")]
    assert json.loads(dead[0]["value"]) == reading(2, device="dev-2")


def test_overload_is_refused_with_429_and_nothing_taken_is_lost(kafka: Settings) -> None:
    with gateway_on(kafka, max_in_flight=150) as gw:

        def send(n: int) -> tuple[int, list[str]]:
            batch = [reading(n * 100 + i) for i in range(100)]
            answer = gw.post("dev-1", batch)
            return answer.status_code, [r["id"] for r in batch]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(send, range(64)))
        values = topic_values(kafka, gw.config.readings_topic)
        whole = gw.post("dev-2", [reading(n) for n in range(151)])
    statuses = [status for status, _ in answers]
    assert set(statuses) <= {200, 429}
    assert 429 in statuses, "16 senders of 100 readings never had two requests in flight"
    assert (whole.status_code, whole.json()["code"]) == (429, "KF804")
    acknowledged = {i for status, ids in answers if status == 200 for i in ids}
    assert acknowledged <= {v["id"] for v in values}


@pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="stops its own embedded broker")
def test_kafka_down_is_503_and_no_acknowledged_reading_is_lost(tmp_path: Path) -> None:
    own = make_settings(tmp_path / "state")
    broker = EmbeddedBroker(own)
    broker.start()
    try:
        with gateway_on(own, delivery_timeout_s=3.0) as gw:
            acknowledged: list[str] = []
            refused: list[int] = []
            stop = threading.Event()

            def device() -> None:
                n = 0
                while not stop.is_set():
                    answer = gw.post("dev-1", [reading(n), reading(n + 1)])
                    if answer.status_code == 200:
                        acknowledged.extend([f"r{n}", f"r{n + 1}"])
                    else:
                        assert answer.json()["code"] == "KF805"
                        assert answer.headers["retry-after"] == "1"
                        refused.append(answer.status_code)
                    n += 2

            sender = threading.Thread(target=device)
            sender.start()
            try:
                wait_for(lambda: len(acknowledged) > 200 or None, timeout=60, what="readings")
                broker.stop()
                wait_for(lambda: refused or None, timeout=60, what="a 503")
                down = httpx.get(f"{gw.url}/v1/health")
                broker.start()
                before = len(acknowledged)
                # The broker's return on a busy machine: its log recovery, then metadata.
                wait_for(lambda: len(acknowledged) > before + 100 or None, timeout=300, what="back")
            finally:
                stop.set()
                sender.join(timeout=120)
            values = topic_values(own, gw.config.readings_topic)
        assert down.status_code == 503 and down.json()["kafka"] == "down"
        assert set(refused) == {503}
        assert set(acknowledged) <= {v["id"] for v in values}
    finally:
        broker.stop()


def test_register_gives_each_device_a_token_it_keeps(cli: RunCli, kafka: Settings) -> None:
    topic = f"registry-{uuid.uuid4().hex[:8]}"
    first = cli("iot", "register", "lamp-1", "lamp-2", "--topic", topic)
    again = cli("iot", "register", "lamp-1", "--fleet", "3", "--topic", topic)
    tokens = kafka.state_dir / "iot" / "tokens.json"
    lines = [json.loads(line) for line in first.lines()]
    assert [line["device"] for line in lines] == ["lamp-1", "lamp-2"]
    assert json.loads(again.lines()[0])["token"] == lines[0]["token"]
    assert json.loads(again.lines()[1]) == {"registered": 4, "new": 3, "tokens": str(tokens)}
    assert tokens.stat().st_mode & 0o777 == 0o600
    assert set(load_tokens(tokens)) >= {"lamp-1", "lamp-2", "dev-000000", "dev-000002"}
    registry = Registry(kafka.kafka, topic)
    registry.start()
    try:
        assert len(registry) == 5
        assert registry.check("lamp-2", lines[1]["token"]) is True
        assert registry.check("lamp-2", lines[0]["token"]) is False
        assert registry.check("lamp-3", "x") is None
    finally:
        registry.stop()
    missing = cli("iot", "register", "--topic", topic)
    assert error_line(missing, "KF001", 2).endswith("give the DEVICE ids to register, or --fleet N")
