"""The embedded broker's lifecycle, on brokers of their own (not the session's)."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message, Producer
from conftest import EXTERNAL_KAFKA, make_settings, run_kappaflow

from kappaflow.errors import ServiceError
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.records import StartAt, produce_lines, read_records
from kappaflow.kafka.topics import create_topic, list_topics
from kappaflow.procs import ProcState
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="embedded broker only"),
]


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(tmp_path / "state")
    yield settings
    EmbeddedBroker(settings).stop(timeout=10)


def test_restart_keeps_topics_and_records(own: Settings) -> None:
    broker = EmbeddedBroker(own)
    assert broker.start() is True
    assert broker.start() is False  # already running: nothing to do
    status = broker.status()
    assert status.state is ProcState.RUNNING and status.pid is not None
    # The settings' JVM options reach the broker's JVM, after kappaflow's own.
    command = Path(f"/proc/{status.pid}/cmdline").read_bytes().decode().split("\0")
    assert own.kafka.jvm_options and command.index(own.kafka.jvm_options[0]) > command.index(
        "-XX:+UseG1GC"
    )
    create_topic(own.kafka, "kept", partitions=2)
    lines = [json.dumps({"n": n, "k": f"k{n % 3}"}) for n in range(50)]
    assert produce_lines(own.kafka, "kept", lines, key_field="k").sent == 50

    assert broker.stop() is True
    assert broker.status().state is ProcState.STOPPED
    assert broker.stop() is False

    assert broker.start() is True
    assert {"name": "kept", "partitions": 2} in list_topics(own.kafka)
    values = [
        json.loads(m.value() or b"")
        for m in read_records(own.kafka, "kept", start=StartAt(beginning=True))
    ]
    assert sorted(v["n"] for v in values) == list(range(50))
    assert any("Kafka Server started" in line for line in broker.logs(500))


def test_stale_pid_file_is_detected_and_cleared(own: Settings) -> None:
    broker = EmbeddedBroker(own)
    broker.process.pid_file.parent.mkdir(parents=True, exist_ok=True)
    # Our own pid: alive, but not a broker, so it must not be trusted (or signalled).
    broker.process.pid_file.write_text(f"{os.getpid()}\n")
    assert broker.status().state is ProcState.STALE
    result = run_kappaflow(own, "kafka", "status", "--json")
    assert json.loads(result.out)["state"] == "stale"
    assert broker.start() is True
    assert broker.status().state is ProcState.RUNNING


def test_killed_broker_leaves_a_stale_pid_and_restarts(own: Settings) -> None:
    """A broker killed outright keeps its topics and every record it acknowledged."""
    broker = EmbeddedBroker(own)
    broker.start()
    create_topic(own.kafka, "survivor", partitions=2)
    sent = [(f"k{n % 7}".encode(), json.dumps({"n": n}).encode()) for n in range(200)]
    acknowledged: list[tuple[bytes, bytes]] = []

    def delivered(err: KafkaError | None, message: Message) -> None:
        assert err is None, err
        acknowledged.append((message.key() or b"", message.value() or b""))

    producer = Producer({**own.kafka.client_config(), "acks": "all"})
    for key, value in sent:
        producer.produce("survivor", key=key, value=value, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert sorted(acknowledged) == sorted(sent)
    pid = broker.status().pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: True if broker.status().state is ProcState.STALE else None,
        timeout=30,
        what="the broker to die",
    )
    assert broker.start() is True
    assert {"name": "survivor", "partitions": 2} in list_topics(own.kafka)
    kept = [
        (m.key() or b"", m.value() or b"")
        for m in read_records(own.kafka, "survivor", start=StartAt(beginning=True))
    ]
    assert sorted(kept) == sorted(sent)


def test_port_in_use_is_refused(own: Settings) -> None:
    with socket.socket() as holder:
        holder.bind((own.kafka.host, own.kafka.port))
        holder.listen()
        with pytest.raises(ServiceError, match="already in use"):
            EmbeddedBroker(own).start()
    assert EmbeddedBroker(own).status().state is ProcState.STOPPED
    # A port held for a moment (as a connection the system gave it to holds it) is
    # waited for: the start goes on once it is free.
    holder = socket.socket()
    holder.bind((own.kafka.host, own.kafka.controller_port))
    releaser = threading.Timer(1.0, holder.close)
    releaser.start()
    try:
        assert EmbeddedBroker(own).start() is True
    finally:
        releaser.cancel()
        holder.close()


def test_cli_lifecycle(own: Settings) -> None:
    started = run_kappaflow(own, "kafka", "start")
    assert started.code == 0, started.err
    assert "started" in started.err
    status = run_kappaflow(own, "kafka", "status", "--json")
    assert json.loads(status.out)["state"] == "running"
    assert run_kappaflow(own, "kafka", "logs", "-n", "500").out.count("\n") > 5
    stopped = run_kappaflow(own, "kafka", "stop")
    assert stopped.code == 0 and "stopped" in stopped.err
    assert json.loads(run_kappaflow(own, "kafka", "status", "--json").out)["state"] == "stopped"
