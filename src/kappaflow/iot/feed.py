"""Running a simulation: live at the wall clock or as fast as it goes, into Kafka or JSON
lines, with its labels written beside it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Protocol

from confluent_kafka import KafkaError, Message

from kappaflow.errors import ProduceError
from kappaflow.iot.simulator import Label, Outgoing, Simulation, Tally
from kappaflow.iot.telemetry import EVENTS_TOPIC, READINGS_TOPIC
from kappaflow.kafka.clients import producer
from kappaflow.kafka.records import produce_with_retry
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import KafkaSettings


class Sink(Protocol):
    def send(self, records: list[Outgoing]) -> None: ...

    def close(self) -> None: ...


class KafkaSink:
    """Records into their topics, acknowledged by all in-sync replicas."""

    def __init__(
        self, kafka: KafkaSettings, *, partitions: int, topics: dict[str, str] | None = None
    ) -> None:
        self.kafka = kafka
        #: Where each of the simulator's topics goes (by default, to itself).
        self.topics = {READINGS_TOPIC: READINGS_TOPIC, EVENTS_TOPIC: EVENTS_TOPIC, **(topics or {})}
        for topic in self.topics.values():
            create_topic(kafka, topic, partitions=partitions, exist_ok=True)
        self.client = producer(kafka, acks="all", **{"linger.ms": 20, "compression.type": "lz4"})
        self.failures: list[str] = []

    def _delivered(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.failures.append(err.str())

    def send(self, records: list[Outgoing]) -> None:
        topics = self.topics
        for r in records:
            produce_with_retry(
                self.client, topics[r.topic], r.value, r.key, on_delivery=self._delivered
            )
        self.client.poll(0)
        if self.failures:
            raise ProduceError(f"sending telemetry failed: {self.failures[0]}")

    def close(self) -> None:
        remaining = self.client.flush(self.kafka.timeout_s * 3)
        if remaining or self.failures:
            reason = self.failures[0] if self.failures else f"{remaining} records still queued"
            raise ProduceError(f"sending telemetry failed: {reason}")


class LinesSink:
    """Records as JSON lines: ``{"topic", "key", "value"}``."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def send(self, records: list[Outgoing]) -> None:
        for r in records:
            line = {"topic": r.topic, "key": r.key.decode(), "value": json.loads(r.value)}
            self.out.write(json.dumps(line) + "\n")

    def close(self) -> None:
        self.out.flush()


class LabelsFile:
    """The ground truth, one JSON line per incident, flushed as it grows."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.out = path.open("w", encoding="utf-8")

    def write(self, labels: list[Label]) -> None:
        for label in labels:
            self.out.write(json.dumps(label.to_json()) + "\n")
        if labels:
            self.out.flush()

    def close(self) -> None:
        self.out.close()


def feed(
    simulation: Simulation,
    sink: Sink,
    labels: LabelsFile,
    *,
    until: float | None,
    live: bool,
    stop: threading.Event,
    step_s: float,
    on_step: Callable[[Tally], None] | None = None,
) -> Tally:
    """Run ``simulation`` into ``sink`` until its clock reaches ``until`` (None: until
    ``stop``). Live, its clock follows the wall clock; otherwise it runs as fast as the
    sink takes records."""
    try:
        while not stop.is_set() and (until is None or simulation.clock < until):
            target = simulation.clock + step_s
            if live:
                # Pace by the wall clock; the wait wakes early when asked to stop.
                stop.wait(max(0.0, target - time.time()))
                target = max(target, time.time())
            if until is not None:
                target = min(target, until)
            records, incidents = simulation.advance(target)
            sink.send(records)
            labels.write(incidents)
            if on_step is not None:
                on_step(simulation.tally)
        sink.send(simulation.drain())
    finally:
        sink.close()
        labels.close()
    return simulation.tally
