"""The device registry: which devices exist and the token each one sends with.

A device is registered by a record in the compacted topic ``devices.registry``, keyed by
its id, holding the SHA-256 of its token (the token itself is shown once, to whoever
registered it, and never stored in Kafka). A tombstone (a null value) removes the device.
The gateway keeps the registry in memory, following the topic; the cleaning job joins it
as a table, so a reading of a device that is not registered, sent past the gateway by a
producer, goes to the dead letters too.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from kappaflow.errors import ProduceError
from kappaflow.kafka.clients import consumer, producer
from kappaflow.kafka.topics import COMPACTED, create_topic
from kappaflow.settings import KafkaSettings
from kappaflow.timeutil import iso
from kappaflow.waiting import wait_for

REGISTRY_TOPIC = "devices.registry"


@dataclass
class Device:
    """A registered device, as the registry topic holds it."""

    device: str
    token_sha256: str
    registered: datetime


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(24)


def register(
    kafka: KafkaSettings,
    tokens: dict[str, str],
    *,
    topic: str = REGISTRY_TOPIC,
    partitions: int = 1,
) -> None:
    """Register each device of ``tokens`` (device → token), acknowledged by all in-sync
    replicas before it returns."""
    create_topic(kafka, topic, partitions=partitions, configs=dict(COMPACTED), exist_ok=True)
    client = producer(kafka, acks="all")
    failures: list[str] = []

    def delivered(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failures.append(err.str())

    now = iso(datetime.now(UTC))
    for device, token in tokens.items():
        value = {"device": device, "token_sha256": digest(token), "registered": now}
        client.produce(topic, json.dumps(value).encode(), device.encode(), on_delivery=delivered)
        client.poll(0)
    remaining = client.flush(kafka.timeout_s * 3)
    if failures or remaining:
        reason = failures[0] if failures else f"{remaining} records still queued"
        raise ProduceError(f"registering devices failed: {reason}")


def load_tokens(path: Path) -> dict[str, str]:
    """Device → token, as ``save_tokens`` wrote them; empty when there is no file."""
    if not path.exists():
        return {}
    found = json.loads(path.read_text())
    return {str(k): str(v) for k, v in found.items()}


def save_tokens(path: Path, tokens: dict[str, str]) -> None:
    """The tokens, readable by their owner only: they are the devices' credentials."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(".tmp")
    temp.touch(mode=0o600)
    temp.chmod(0o600)
    temp.write_text(json.dumps(tokens, indent=0, sort_keys=True))
    temp.replace(path)


def fleet_tokens(path: Path, devices: Iterable[str]) -> tuple[dict[str, str], dict[str, str]]:
    """The tokens of ``devices`` kept in ``path``, new ones made for devices it lacks:
    (all tokens of ``devices``, the new ones only). The file is updated."""
    known = load_tokens(path)
    new = {d: new_token() for d in devices if d not in known}
    if new:
        save_tokens(path, {**known, **new})
    everything = {**known, **new}
    return {d: everything[d] for d in devices}, new


class Registry:
    """The registry topic followed into memory: device → token digest.

    ``start`` reads the topic to its end before it returns, then a thread follows it, so
    a device registered later is known within a poll.
    """

    def __init__(self, kafka: KafkaSettings, topic: str = REGISTRY_TOPIC) -> None:
        self.kafka = kafka
        self.topic = topic
        self.digests: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._caught_up = threading.Event()
        self.error: str | None = None

    def check(self, device: str, token: str | None) -> bool | None:
        """None: the device is not registered; else whether ``token`` is its token."""
        expected = self.digests.get(device)
        if expected is None:
            return None
        return token is not None and hmac.compare_digest(expected, digest(token))

    def __len__(self) -> int:
        return len(self.digests)

    def start(self, *, timeout: float = 30.0) -> None:
        create_topic(self.kafka, self.topic, partitions=1, configs=dict(COMPACTED), exist_ok=True)
        self._thread = threading.Thread(target=self._follow, name="registry", daemon=True)
        self._thread.start()
        wait_for(
            lambda: True if self._caught_up.is_set() or self.error else None,
            timeout=timeout,
            what=f"the device registry {self.topic!r}",
        )
        if self.error:
            raise KafkaException(self.error)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _follow(self) -> None:
        client = consumer(self.kafka)
        try:
            metadata = client.list_topics(self.topic, timeout=self.kafka.timeout_s)
            partitions = list(metadata.topics[self.topic].partitions)
            assigned = [TopicPartition(self.topic, p, 0) for p in partitions]
            ends = {
                p: client.get_watermark_offsets(TopicPartition(self.topic, p))[1]
                for p in partitions
            }
            client.assign(assigned)
            pending = {p for p, end in ends.items() if end > 0}
            if not pending:
                self._caught_up.set()
            while not self._stop.is_set():
                message = client.poll(0.2)
                if message is None:
                    continue
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(message.partition())
                        if not pending:
                            self._caught_up.set()
                    continue
                self._apply(message)
                if (message.offset() or 0) + 1 >= ends.get(message.partition(), 0):
                    pending.discard(message.partition())
                    if not pending:
                        self._caught_up.set()
        except KafkaException as exc:
            self.error = str(exc)
        finally:
            client.close()

    def _apply(self, message: Message) -> None:
        key = message.key()
        if key is None:
            return
        device = key.decode(errors="replace")
        value = message.value()
        if value is None:
            self.digests.pop(device, None)
            return
        try:
            found = json.loads(value)
            self.digests[device] = str(found["token_sha256"])
        except (ValueError, KeyError, TypeError):
            # Not a registration: the device keeps what it had.
            return
