"""Devices over MQTT: the embedded broker, and the bridge into Kafka at QoS 1.

The bridge's tests run against both brokers kappaflow embeds, mosquitto and amqtt, and
the real Kafka broker. The restart test kills the bridge's process with SIGKILL while
devices publish, and checks that every message the broker acknowledged to a device is in
Kafka: on mosquitto, since amqtt drops the messages in flight to a client that goes away
(docs/iot.md, "Devices over MQTT").
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from conftest import EXTERNAL_KAFKA, Result, RunCli, error_line, make_settings, settings_env
from paho.mqtt.enums import CallbackAPIVersion

import kappaflow.cli
from kappaflow import errors
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import topic_partitions
from kappaflow.mqtt import broker as mqtt_broker
from kappaflow.mqtt.bridge import MqttBridge, device_level
from kappaflow.mqtt.broker import EmbeddedMqtt, amqtt_installed, find_mosquitto
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for


def _with_mqtt(settings: Settings, state_dir: Path) -> Settings:
    """``settings`` (its Kafka) with an MQTT broker of its own: a port and a state dir."""
    mqtt = settings.mqtt.model_copy(update={"port": free_port()})
    return settings.model_copy(update={"mqtt": mqtt, "state_dir": state_dir})


@contextmanager
def _broker(settings: Settings, kind: str) -> Iterator[EmbeddedMqtt]:
    with pytest.MonkeyPatch.context() as patch:
        if kind == "amqtt":
            if not amqtt_installed():
                pytest.skip("amqtt is not installed (pip install 'kappaflow[mqtt]')")
            # The fallback, as on a machine without mosquitto.
            patch.setattr(mqtt_broker, "find_mosquitto", lambda configured=None: None)
        elif find_mosquitto() is None:
            pytest.skip("mosquitto is not installed (make setup installs it, as root)")
        service = EmbeddedMqtt(settings)
        service.start()
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture(scope="module", params=["mosquitto", "amqtt"])
def mqtt(
    request: pytest.FixtureRequest, kafka: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """Settings whose Kafka and MQTT broker (each kind in turn) run."""
    settings = _with_mqtt(kafka, tmp_path_factory.mktemp(f"mqtt-{request.param}"))
    with _broker(settings, request.param):
        yield settings


def _names() -> tuple[str, str, str, str]:
    """A test's own MQTT topic filter, Kafka topic, dead-letter topic and client id."""
    tag = uuid.uuid4().hex[:10]
    return f"t-{tag}/+/telemetry", f"raw-{tag}", f"dlq-{tag}", f"bridge-{tag}"


def _reading(device: str, seq: int) -> dict[str, Any]:
    return {
        "device": device,
        "metric": "cpu_temp",
        "value": 40.0 + seq % 7,
        "unit": "celsius",
        "time": "2026-11-26T09:00:00.000Z",
        "seq": seq,
        "id": f"{device}/{seq}/cpu_temp",
    }


class Publisher:
    """A device-side MQTT client publishing at QoS 1 on a thread of paho's."""

    def __init__(self, settings: Settings) -> None:
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=f"dev-{uuid.uuid4().hex[:8]}"
        )
        # Many messages on their way at once, as a gateway of many devices would send.
        self.client.max_inflight_messages_set(100)
        self.client.max_queued_messages_set(0)
        host, port = settings.mqtt.address
        self.client.connect(host, port)
        self.client.loop_start()
        self.sent: list[tuple[str, paho.MQTTMessageInfo]] = []

    def publish(self, topic: str, payload: bytes, name: str = "") -> None:
        self.sent.append((name, self.client.publish(topic, payload, qos=1)))

    def acknowledged(self) -> list[str]:
        """The names of the messages the broker acknowledged (PUBACK)."""
        return [name for name, info in self.sent if info.is_published()]

    def wait_all(self, timeout: float = 30) -> None:
        wait_for(
            lambda: True if len(self.acknowledged()) == len(self.sent) else None,
            timeout=timeout,
            what="the broker to acknowledge every message",
        )

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@contextmanager
def publisher(settings: Settings) -> Iterator[Publisher]:
    device = Publisher(settings)
    try:
        yield device
    finally:
        device.close()


@contextmanager
def bridge_thread(settings: Settings, *args: Any, **kwargs: Any) -> Iterator[MqttBridge]:
    """A bridge running in this process until the block ends."""
    bridge = MqttBridge(settings, *args, partitions=2, **kwargs)
    stop, ready = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            bridge.run(stop, on_ready=ready.set)
        except BaseException as exc:
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=run, name="bridge", daemon=True)
    thread.start()
    assert ready.wait(30), "the bridge did not subscribe"
    try:
        if failed:
            raise failed[0]
        yield bridge
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
    if failed:
        raise failed[0]


def records(settings: Settings, topic: str) -> list[tuple[str | None, bytes]]:
    return [
        ((m.key() or b"").decode() or None, m.value() or b"")
        for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
    ]


def count(settings: Settings, topic: str) -> int:
    """How many records ``topic`` holds (its partitions' high watermarks)."""
    from confluent_kafka import TopicPartition

    try:
        partitions = topic_partitions(settings.kafka, topic)
    except errors.TopicNotFoundError:
        return 0  # just created, not in the metadata yet
    reader = consumer(settings.kafka)
    try:
        return sum(
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in partitions
        )
    finally:
        reader.close()


def wait_count(settings: Settings, topic: str, at_least: int, timeout: float = 30) -> int:
    return wait_for(
        lambda: n if (n := count(settings, topic)) >= at_least else None,
        timeout=timeout,
        interval=0.1,
        what=f"{at_least} records in {topic}",
    )


# The bridge, on each broker.


def test_readings_arrive_in_kafka_keyed_by_device(mqtt: Settings) -> None:
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    sent: list[tuple[str, bytes]] = []
    with bridge_thread(mqtt, mqtt_topic, topic, dlq, client_id=client_id) as bridge:
        counts = bridge.counts
        with publisher(mqtt) as device:
            for seq in range(60):
                name = f"dev-{seq % 3:06d}"
                payload = json.dumps(_reading(name, seq)).encode()
                device.publish(f"{prefix}/{name}/telemetry", payload)
                sent.append((name, payload))
            device.wait_all()
        wait_count(mqtt, topic, len(sent))
        wait_for(lambda: counts.bridged == 60 or None, timeout=10, what="the count")
    got = records(mqtt, topic)
    assert sorted(got) == sorted(sent)  # keyed by device, the payload as sent
    for name in ("dev-000000", "dev-000001", "dev-000002"):
        seqs = [json.loads(v)["seq"] for k, v in got if k == name]
        assert seqs == sorted(seqs)  # a device's readings in the order it sent them
    assert (counts.bridged, counts.dead_lettered, counts.unacknowledged) == (60, 0, 0)
    assert count(mqtt, dlq) == 0


def test_what_is_no_reading_goes_to_the_dead_letter_topic(mqtt: Settings) -> None:
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    bad = {
        b"\xff not json": "not valid JSON",
        b"[1, 2, 3]": "not a JSON object",
        json.dumps(_reading("dev-000009", 1)).encode(): "is not the topic's 'dev-000001'",
    }
    good = json.dumps(_reading("dev-000001", 2)).encode()
    with bridge_thread(mqtt, mqtt_topic, topic, dlq, client_id=client_id) as bridge:
        counts = bridge.counts
        with publisher(mqtt) as device:
            for payload in bad:
                device.publish(f"{prefix}/dev-000001/telemetry", payload)
            device.publish(f"{prefix}/dev-000001/telemetry", good)  # the bridge goes on
            device.wait_all()
        wait_count(mqtt, dlq, len(bad))
        wait_count(mqtt, topic, 1)
    assert records(mqtt, topic) == [("dev-000001", good)]
    letters = {base64.b64decode(json.loads(v)["value_base64"]): json.loads(v) for _, v in
               records(mqtt, dlq)}  # fmt: skip
    assert set(letters) == set(bad)  # the original bytes
    for payload, reason in bad.items():
        assert reason in letters[payload]["error"]
        assert letters[payload]["source_topic"] == f"{prefix}/dev-000001/telemetry"
    assert (counts.bridged, counts.dead_lettered) == (1, 3)


def test_a_stopped_bridge_finds_what_was_published_while_it_was_away(mqtt: Settings) -> None:
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    with bridge_thread(mqtt, mqtt_topic, topic, dlq, client_id=client_id):
        pass  # the session and its subscription now exist
    with publisher(mqtt) as device:
        for seq in range(200):
            reading = _reading("dev-000001", seq)
            device.publish(f"{prefix}/dev-000001/telemetry", json.dumps(reading).encode())
        device.wait_all()
    with bridge_thread(mqtt, mqtt_topic, topic, dlq, client_id=client_id) as bridge:
        counts = bridge.counts
        wait_count(mqtt, topic, 200)
    assert counts.bridged == 200
    assert [json.loads(v)["seq"] for _, v in records(mqtt, topic)] == list(range(200))


@pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="pauses the embedded Kafka broker")
@pytest.mark.parametrize("mqtt", ["mosquitto"], indirect=True)
def test_while_kafka_stalls_messages_wait_unacknowledged_at_the_broker(
    mqtt: Settings, kafka: Settings
) -> None:
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    pid = EmbeddedBroker(kafka).status().pid
    assert pid is not None
    bridge_args = (mqtt_topic, topic, dlq)
    with bridge_thread(mqtt, *bridge_args, client_id=client_id, max_pending=100) as bridge:
        os.kill(pid, signal.SIGSTOP)
        try:
            with publisher(mqtt) as device:
                for seq in range(1_000):
                    reading = _reading("dev-000001", seq)
                    device.publish(f"{prefix}/dev-000001/telemetry", json.dumps(reading).encode())
                device.wait_all()
            # The bridge holds as many as it may, waiting for Kafka; the broker the rest.
            wait_for(lambda: bridge.held == 100 or None, timeout=10, what="a full bridge")
            assert bridge.counts.bridged == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_count(mqtt, topic, 1_000)
        wait_for(lambda: bridge.held == 0 or None, timeout=10, what="every acknowledgement")
    assert bridge.counts.bridged == 1_000 and bridge.counts.unacknowledged == 0
    assert [json.loads(v)["seq"] for _, v in records(mqtt, topic)] == list(range(1_000))


# THE guarantee: a bridge killed mid-stream loses no message the broker acknowledged.


class BridgeProcess:
    """`kappaflow iot bridge` in a process of its own, so that it can be killed hard."""

    def __init__(self, settings: Settings, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kappaflow", "iot", "bridge", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **settings_env(settings)},
        )
        self.err: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        wait_for(self._ready, timeout=60, interval=0.05, what="the bridge to subscribe")

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err.append(line)

    def _ready(self) -> bool | None:
        if any(line.startswith("bridging ") for line in self.err):
            return True
        if self.proc.poll() is not None:
            raise AssertionError("the bridge exited:\n" + "".join(self.err))
        return None

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self._ended()

    def stop(self) -> dict[str, Any]:
        """SIGTERM, as a service manager stops it: its summary line."""
        self.proc.send_signal(signal.SIGTERM)
        out = self._ended()
        assert self.proc.returncode == 0, "".join(self.err)
        summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return summary

    def _ended(self) -> str:
        """What it printed on stdout, once it has exited."""
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.wait(30)
        self.reader.join(10)
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return out


@pytest.mark.parametrize("mqtt", ["mosquitto"], indirect=True)
def test_no_acknowledged_message_is_lost_when_the_bridge_is_killed(mqtt: Settings) -> None:
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    total, devices = 2_000, 20
    args = ["--mqtt-topic", mqtt_topic, "--topic", topic, "--dlq", dlq]
    args += ["--client-id", client_id, "--partitions", "2"]
    first = BridgeProcess(mqtt, *args)
    killed_at: dict[str, int] = {}
    second: BridgeProcess | None = None
    try:
        with publisher(mqtt) as device:
            done = threading.Event()

            def publish() -> None:
                # At most 1,000 a second, steady: the bridge is killed in the middle of
                # the stream, and the devices go on while it is down.
                for seq in range(total):
                    name = f"dev-{seq % devices:06d}"
                    payload = json.dumps(_reading(name, seq)).encode()
                    device.publish(f"{prefix}/{name}/telemetry", payload, f"{name}/{seq}/cpu_temp")
                    if seq % 20 == 19:
                        done.wait(0.02)
                done.set()

            sender = threading.Thread(target=publish, daemon=True)
            sender.start()
            wait_count(mqtt, topic, 300)
            first.kill()
            killed_at["kafka"] = count(mqtt, topic)
            killed_at["acknowledged"] = len(device.acknowledged())
            # Down while the devices publish a third of the stream.
            wait_for(
                lambda: len(device.acknowledged()) >= 1_200 or None,
                timeout=30,
                what="messages published while the bridge is down",
            )
            assert not done.is_set(), "the bridge was down after the stream had ended"
            second = BridgeProcess(mqtt, *args)
            sender.join(60)
            device.wait_all()
            acknowledged = device.acknowledged()
        assert len(acknowledged) == total

        def ids() -> Counter[str]:
            return Counter(json.loads(value)["id"] for _, value in records(mqtt, topic))

        with contextlib.suppress(TimeoutError):
            wait_for(
                lambda: True if set(acknowledged) <= set(ids()) else None,
                timeout=60,
                interval=0.5,
                what="every acknowledged message in Kafka",
            )
        summary = second.stop()
    finally:
        for bridge in (first, second):
            if bridge is not None and bridge.proc.poll() is None:
                bridge.kill()
    got = records(mqtt, topic)
    seen = Counter(json.loads(value)["id"] for _, value in got)
    missing = set(acknowledged) - set(seen)
    assert not missing, f"{len(missing)} acknowledged messages are not in Kafka"
    duplicates = sum(n - 1 for n in seen.values())
    print(
        f"killed with {killed_at['kafka']} records in Kafka, {killed_at['acknowledged']} "
        f"acknowledged to devices; {len(got)} records, {duplicates} duplicates; "
        f"second bridge: {summary}"
    )
    assert killed_at["kafka"] < total
    assert all(key == json.loads(value)["device"] for key, value in got)
    assert summary["bridged"] > 0
    assert summary["unacknowledged"] == 0 and summary["dead_lettered"] == 0
    assert count(mqtt, dlq) == 0


# The broker.


def test_mosquitto_keeps_a_stopped_bridges_messages_across_its_restart(
    kafka: Settings, tmp_path: Path
) -> None:
    settings = _with_mqtt(kafka, tmp_path / "state")
    mqtt_topic, topic, dlq, client_id = _names()
    prefix = mqtt_topic.split("/")[0]
    with _broker(settings, "mosquitto") as broker:
        with bridge_thread(settings, mqtt_topic, topic, dlq, client_id=client_id):
            pass  # the session and its subscription now exist
        with publisher(settings) as device:
            for seq in range(100):
                reading = _reading("dev-000001", seq)
                device.publish(f"{prefix}/dev-000001/telemetry", json.dumps(reading).encode())
            device.wait_all()
        assert broker.stop() and broker.start()
        assert (tmp_path / "state" / "mqtt" / "data" / "mosquitto.db").exists()
        with bridge_thread(settings, mqtt_topic, topic, dlq, client_id=client_id) as bridge:
            counts = bridge.counts
            wait_count(settings, topic, 100)
    assert counts.bridged == 100
    assert sorted(json.loads(v)["seq"] for _, v in records(settings, topic)) == list(range(100))


def in_process(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> RunCli:
    """The CLI run in this process (as fast as a call), with ``settings``."""

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        with monkeypatch.context() as patch:
            for name, value in {**settings_env(settings), **(env or {})}.items():
                patch.setenv(name, value)
            code = kappaflow.cli.main(list(args))
        printed = capsys.readouterr()
        return Result(code, printed.out, printed.err)

    return run


@pytest.mark.integration
def test_mqtt_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if find_mosquitto() is None and not amqtt_installed():
        pytest.skip("no MQTT broker installed")
    own = make_settings(tmp_path / "state")
    cli = in_process(own, monkeypatch, capsys)
    url = f"mqtt://127.0.0.1:{own.mqtt.port}"
    try:
        started = cli("mqtt", "start")
        assert (started.code, started.err) == (0, f"mqtt started on {url}\n")
        assert cli("mqtt", "start").err == f"mqtt already running on {url}\n"
        status = json.loads(cli("mqtt", "status", "--json").out)
        assert status["state"] == "running" and status["url"] == url
        pid = (tmp_path / "state" / "mqtt" / "mqtt.pid").read_text().split()[0]
        assert str(status["pid"]) == pid
    finally:
        stopped = cli("mqtt", "stop")
    assert (stopped.code, stopped.err) == (0, "mqtt stopped\n")
    assert cli("mqtt", "stop").err == "mqtt was not running\n"
    external = cli("mqtt", "status", env={"KAPPAFLOW_MQTT__URL": url})
    assert "external" in error_line(external, "KF305", 1)


def test_the_bridge_says_what_is_wrong(
    kafka: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = in_process(kafka, monkeypatch, capsys)
    # What handled Ctrl-C before (Python's own, or a Spark session's in this process).
    before = signal.getsignal(signal.SIGINT)
    no_device = cli("iot", "bridge", "--mqtt-topic", "devices/#")
    assert "no '+' level" in error_line(no_device, "KF510", 1)
    nowhere = f"mqtt://127.0.0.1:{free_port()}"
    unreachable = cli(
        "iot", "bridge", "--connect-timeout", "1s", env={"KAPPAFLOW_MQTT__URL": nowhere}
    )
    assert f"cannot reach the MQTT broker at {nowhere}" in error_line(unreachable, "KF308", 1)
    assert signal.getsignal(signal.SIGINT) is before  # given back


# Without services.


def test_the_device_is_the_level_of_the_first_plus() -> None:
    assert device_level("devices/+/telemetry") == 1
    assert device_level("+/readings/#") == 0
    with pytest.raises(errors.InvalidTopicFilterError):
        device_level("devices/#")


def test_without_a_broker_the_error_says_how_to_install_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.setattr(mqtt_broker, "find_mosquitto", lambda configured=None: None)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(errors.MqttBrokerNotFoundError) as caught:
        mqtt_broker.find_mqtt_broker()
    assert "sudo apt-get install mosquitto" in str(caught.value)
    assert "pip install 'kappaflow[mqtt]'" in str(caught.value)


def test_setup_without_root_uses_amqtt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kappaflow.mqtt import setup as install

    if not amqtt_installed():
        pytest.skip("amqtt is not installed")
    for module in (install, mqtt_broker):
        monkeypatch.setattr(module, "find_mosquitto", lambda configured=None: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    said: list[str] = []
    line = install.ensure_mqtt_broker(make_settings(tmp_path), said.append)
    assert said == [
        "mosquitto not found (install it: sudo apt-get install mosquitto); "
        "the embedded MQTT broker is amqtt"
    ]
    assert line.startswith("mqtt broker: amqtt at ")
