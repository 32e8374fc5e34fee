"""The bridge from MQTT into Kafka: QoS 1, acknowledged to the broker only once in Kafka.

Devices publish readings to ``devices/<device>/telemetry`` at QoS 1. The bridge holds a
persistent session on the broker (MQTT 3.1.1, clean session off, a fixed client id), so
the broker keeps queueing for it while it is down. Each message becomes a Kafka record
keyed by the device id from its topic, its value the payload as sent; the broker gets
the message's PUBACK only after Kafka has acknowledged the record (all in-sync replicas,
idempotent producer). A bridge killed at any moment therefore loses nothing the broker
acknowledged to a device: what it had not acknowledged, the broker sends again when it
comes back. That makes delivery at-least-once; a reading sent twice carries the same
``id``, by which the cleaning job drops the second.

A payload that is not a JSON object, or whose ``device`` is not the topic's, goes to the
dead-letter topic with the reason and the original bytes, and is acknowledged too: it is
safely in Kafka.

While Kafka is slow or down, records wait in the producer (librdkafka retries them
without end) and their messages stay unacknowledged; past ``max_pending`` of them the
bridge stops reading from the broker, which holds the rest (the embedded broker sends a
client at most ``MAX_INFLIGHT`` unacknowledged messages anyway).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import paho.mqtt.client as paho
from confluent_kafka import KafkaError, KafkaException, Message
from paho.mqtt.client import ConnectFlags, MQTTMessage
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.reasoncodes import ReasonCode

from kappaflow.errors import InvalidTopicFilterError, MqttConnectError, ProduceError
from kappaflow.kafka.clients import describe, producer
from kappaflow.kafka.records import produce_with_retry
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic
from kappaflow.mqtt.broker import MAX_INFLIGHT
from kappaflow.settings import Settings
from kappaflow.timeutil import iso

log = logging.getLogger(__name__)

TOPIC_FILTER = "devices/+/telemetry"
DLQ_TOPIC = "mqtt-bridge.dlq"
CLIENT_ID = "kappaflow-bridge"
#: How long the bridge may take, when it stops, for Kafka to acknowledge what it holds;
#: what is still unacknowledged then, the broker sends again to the next bridge.
STOP_FLUSH_S = 10.0
#: The keepalive: a broker that went silent is noticed within one and a half of it, and a
#: bridge that holds ``max_pending`` messages while Kafka is down (it reads nothing, so it
#: sends no ping whose answer it could not read) is let go by the broker after as long.
KEEPALIVE_S = 60
_RECONNECT_MIN_S, _RECONNECT_MAX_S = 0.2, 5.0
#: How long one turn of the loop waits for the network when nothing arrives: the
#: longest a delivered record waits for its PUBACK to leave.
_TURN_S = 0.02


def device_level(topic_filter: str) -> int:
    """The topic level that holds the device id: the one the filter's first ``+`` matches."""
    levels = topic_filter.split("/")
    if "+" not in levels:
        raise InvalidTopicFilterError(
            f"topic filter {topic_filter!r} has no '+' level for the device id "
            "(for example devices/+/telemetry)"
        )
    return levels.index("+")


@dataclass
class BridgeCounts:
    #: Records Kafka acknowledged into the destination topic.
    bridged: int = 0
    #: Records Kafka acknowledged into the dead-letter topic.
    dead_lettered: int = 0
    #: Messages the broker sent again (a bridge before this one took them, or this one
    #: lost its connection before acknowledging them).
    redelivered: int = 0
    #: Messages not acknowledged when the bridge stopped: the broker sends them again.
    unacknowledged: int = 0

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class _Pending:
    """A message taken from the broker whose record Kafka has not acknowledged yet."""

    mid: int
    qos: int
    #: Which connection it came on: a PUBACK is only valid on that one.
    connection: int
    dead_letter: bool
    done: bool = False


class MqttBridge:
    """Messages of ``topic_filter`` into ``kafka_topic``, keyed by device; run with
    :meth:`run` until a stop event is set."""

    def __init__(
        self,
        settings: Settings,
        topic_filter: str,
        kafka_topic: str,
        dlq_topic: str = DLQ_TOPIC,
        *,
        client_id: str = CLIENT_ID,
        partitions: int = DEFAULT_PARTITIONS,
        max_pending: int = MAX_INFLIGHT,
        connect_timeout_s: float = 30.0,
    ) -> None:
        self.settings = settings
        self.topic_filter = topic_filter
        self.kafka_topic = kafka_topic
        self.dlq_topic = dlq_topic
        self.client_id = client_id
        self.partitions = partitions
        self.max_pending = max_pending
        self.connect_timeout_s = connect_timeout_s
        self.level = device_level(topic_filter)
        self.counts = BridgeCounts()
        self._pending: deque[_Pending] = deque()
        self._connection = 0
        self._closing = False
        self._closed = False
        self._subscribed = False
        self._failure: str | None = None
        self._on_ready: Callable[[], None] | None = None
        self._producer: Any = None
        self._client: paho.Client | None = None

    @property
    def held(self) -> int:
        """Messages taken from the broker and not acknowledged yet."""
        return len(self._pending)

    def run(
        self, stop: threading.Event, on_ready: Callable[[], None] | None = None
    ) -> BridgeCounts:
        """Bridge until ``stop`` is set; ``on_ready`` is called once subscribed."""
        kafka = self.settings.kafka
        for topic in (self.kafka_topic, self.dlq_topic):
            create_topic(kafka, topic, partitions=self.partitions, exist_ok=True)
        self._on_ready = on_ready
        # No local timeout: while Kafka is down a record waits and is retried, and its
        # message stays unacknowledged at the broker.
        self._producer = producer(kafka, acks="all", **{"message.timeout.ms": 0})
        client = self._client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            clean_session=False,
            protocol=paho.MQTTv311,
            manual_ack=True,
        )
        client.on_connect = self._connected
        client.on_subscribe = self._subscribed_to
        client.on_message = self._message
        client.on_disconnect = self._disconnected
        try:
            self._first_connect(client, stop)
            self._loop(client, stop)
        finally:
            self._close(client)
        if self._failure is not None:
            raise ProduceError(f"sending to Kafka failed: {self._failure}")
        return self.counts

    # The loop: the MQTT client's network and Kafka's deliveries in one thread, so that a
    # PUBACK goes out from the delivery callback, in the order the messages came.

    def _first_connect(self, client: paho.Client, stop: threading.Event) -> None:
        host, port = self.settings.mqtt.address
        deadline = time.monotonic() + self.connect_timeout_s
        while not stop.is_set():
            try:
                client.connect(host, port, keepalive=KEEPALIVE_S)
                return
            except OSError as exc:
                if time.monotonic() >= deadline:
                    hint = (
                        "start it with `kappaflow mqtt start`"
                        if self.settings.mqtt.embedded
                        else "check mqtt.url"
                    )
                    raise MqttConnectError(
                        f"cannot reach the MQTT broker at {self.settings.mqtt.effective_url} "
                        f"({exc.strerror or exc}): {hint}"
                    ) from None
                stop.wait(_RECONNECT_MIN_S)

    def _loop(self, client: paho.Client, stop: threading.Event) -> None:
        delay = _RECONNECT_MIN_S
        while not stop.is_set() and self._failure is None:
            if len(self._pending) < self.max_pending:
                rc = client.loop(timeout=_TURN_S)
                self._producer.poll(0)
            else:
                # Full: read nothing more, let Kafka catch up (the broker holds the rest);
                # only the acknowledgements go out.
                rc = client.loop_write()
                self._producer.poll(_TURN_S)
            if rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                delay = _RECONNECT_MIN_S
                continue
            # The connection is gone: what was not acknowledged on it comes again.
            self._producer.poll(0)
            if stop.wait(delay):
                return
            delay = min(delay * 2, _RECONNECT_MAX_S)
            try:
                client.reconnect()
            except OSError as exc:
                log.info("reconnecting to the MQTT broker: %s", exc)

    def _close(self, client: paho.Client) -> None:
        """Stop taking messages; give Kafka a moment for those held, acknowledge them, and
        disconnect (the session, and its subscription, stay at the broker)."""
        self._closing = True
        deadline = time.monotonic() + STOP_FLUSH_S
        if self._producer is not None:
            while self._pending and self._failure is None and time.monotonic() < deadline:
                if client.is_connected():
                    client.loop(timeout=0)
                self._producer.poll(_TURN_S)
            self.counts.unacknowledged = len(self._pending)
            # What Kafka has not acknowledged is dropped here: its messages come again.
            self._closed = True
            self._producer.purge()
            self._producer.flush(0)
        if client.is_connected():
            client.disconnect()

    # The MQTT client's callbacks.

    def _connected(
        self,
        client: paho.Client,
        _userdata: Any,
        flags: ConnectFlags,
        reason: ReasonCode,
        _properties: Any,
    ) -> None:
        if reason.is_failure:
            raise MqttConnectError(f"the MQTT broker refused the connection: {reason}")
        self._connection += 1
        log.info("connected to the MQTT broker (session present: %s)", flags.session_present)
        # Again on every connection: with the session present it changes nothing, and a
        # broker that lost the session (amqtt restarted) gets the subscription back.
        client.subscribe(self.topic_filter, qos=1)

    def _subscribed_to(
        self,
        _client: paho.Client,
        _userdata: Any,
        _mid: int,
        reasons: list[ReasonCode],
        _properties: Any,
    ) -> None:
        if any(r.is_failure for r in reasons):
            raise MqttConnectError(f"the MQTT broker refused the subscription {self.topic_filter}")
        if not self._subscribed:
            self._subscribed = True
            if self._on_ready is not None:
                self._on_ready()

    def _disconnected(
        self, _client: paho.Client, _userdata: Any, _flags: Any, reason: ReasonCode, _p: Any
    ) -> None:
        if not self._closing:
            log.warning("lost the MQTT broker (%s): reconnecting", reason)

    def _message(self, _client: paho.Client, _userdata: Any, message: MQTTMessage) -> None:
        if self._closing:
            return  # not acknowledged: the broker sends it to the next bridge
        if message.dup:
            self.counts.redelivered += 1
        payload, topic = bytes(message.payload), message.topic
        levels = topic.split("/")
        device = levels[self.level] if len(levels) > self.level else None
        reason = _refusal(payload, device)
        pending = _Pending(message.mid, message.qos, self._connection, reason is not None)
        self._pending.append(pending)
        key = device.encode() if device else None
        if reason is None:
            try:
                self._produce(self.kafka_topic, payload, key, pending)
                return
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                    raise ProduceError(f"sending to Kafka failed: {describe(exc)}") from None
                # Larger than Kafka takes: its dead letter says so, without the bytes.
                reason, payload = f"{len(payload)} bytes, more than Kafka takes", b""
                pending.dead_letter = True
        self._produce(self.dlq_topic, _dead_letter(reason, topic, payload), key, pending)

    # Kafka.

    def _produce(self, topic: str, value: bytes, key: bytes | None, pending: _Pending) -> None:
        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if self._closed:
                return
            if err is not None:
                # Not a timeout (there is none): a refusal that retrying will not mend.
                self._failure = f"{topic!r}: {err.str()}"
                return
            pending.done = True
            if pending.dead_letter:
                self.counts.dead_lettered += 1
            else:
                self.counts.bridged += 1
            self._acknowledge()

        produce_with_retry(self._producer, topic, value, key, poll_s=_TURN_S, on_delivery=delivered)

    def _acknowledge(self) -> None:
        """PUBACK every message at the head of the queue whose record is in Kafka: in the
        order they came, as MQTT asks of a receiver."""
        client = self._client
        while self._pending and self._pending[0].done:
            pending = self._pending.popleft()
            if client is not None and pending.qos > 0 and pending.connection == self._connection:
                client.ack(pending.mid, pending.qos)


def _refusal(payload: bytes, device: str | None) -> str | None:
    """Why a payload cannot be bridged as a reading of ``device``; None if it can."""
    if not device:
        return "the topic has no device id"
    try:
        reading = json.loads(payload)
    except ValueError:
        return "not valid JSON"
    if not isinstance(reading, dict):
        return "not a JSON object"
    if reading.get("device") != device:
        return f"device {reading.get('device')!r} is not the topic's {device!r}"
    return None


def _dead_letter(reason: str, topic: str, payload: bytes) -> bytes:
    """A dead letter as the jobs write theirs: the reason, the source, the original bytes."""
    body = {
        "error": reason,
        "source_topic": topic,
        "timestamp": iso(datetime.now(UTC)),
        "value_base64": base64.b64encode(payload).decode() if payload else None,
    }
    return json.dumps(body).encode()
