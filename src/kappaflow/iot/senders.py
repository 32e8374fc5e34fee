"""The simulator's devices sending over the network: to the HTTP gateway, to the MQTT
broker, or some to each. Each is a ``feed.Sink``.

A device sends what it sampled in a step as one request (HTTP) or one message per record
(MQTT, QoS 1), and sends again what was refused for a while (HTTP 429 and 503), as a
device's firmware does; what could not be sent by then is counted as lost by the sender.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from kappaflow.errors import ProduceError, WaitTimeoutError
from kappaflow.iot.simulator import Outgoing
from kappaflow.iot.telemetry import EVENTS_TOPIC
from kappaflow.waiting import wait_for

#: How long a device keeps sending a request the gateway refuses with 429 or 503.
RETRY_FOR_S = 30.0


@dataclass
class Sent:
    """What a sender counted: records acknowledged, requests by status, latencies (s)."""

    acknowledged: int = 0
    lost: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def to_json(self) -> dict[str, object]:
        with self.lock:
            spent = sorted(self.latencies)
        return {
            "acknowledged": self.acknowledged,
            "lost": self.lost,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
            "p50_ms": round(spent[len(spent) // 2] * 1000, 2) if spent else None,
            "p99_ms": round(spent[int(len(spent) * 0.99)] * 1000, 2) if spent else None,
        }


class GatewaySink:
    """Each device's records of a step as one POST to the gateway, devices in parallel."""

    def __init__(self, url: str, tokens: dict[str, str], *, workers: int = 8) -> None:
        self.url = url.rstrip("/")
        self.tokens = tokens
        self.client = httpx.Client(timeout=30.0, limits=httpx.Limits(max_connections=workers))
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="device")
        self.sent = Sent()

    def send(self, records: list[Outgoing]) -> None:
        batches: dict[tuple[str, str], list[bytes]] = defaultdict(list)
        for r in records:
            kind = "events" if r.topic == EVENTS_TOPIC else "readings"
            batches[(r.key.decode(), kind)].append(r.value)
        for done in self.pool.map(lambda item: self._post(*item), batches.items()):
            del done

    def _post(self, target: tuple[str, str], values: list[bytes]) -> None:
        device, kind = target
        body = b"[" + b",".join(values) + b"]"
        headers = {
            "Authorization": f"Bearer {self.tokens.get(device, '')}",
            "Content-Type": "application/json",
        }
        give_up = time.monotonic() + RETRY_FOR_S
        pause = 0.1
        while True:
            began = time.perf_counter()
            try:
                answer = self.client.post(
                    f"{self.url}/v1/devices/{device}/{kind}", content=body, headers=headers
                )
                status = answer.status_code
            except httpx.TransportError:
                status = 0
            spent = time.perf_counter() - began
            with self.sent.lock:
                self.sent.statuses[status] += 1
                self.sent.latencies.append(spent)
                if status == 200:
                    self.sent.acknowledged += len(values)
            if status == 200:
                return
            if status not in (0, 429, 503) or time.monotonic() >= give_up:
                with self.sent.lock:
                    self.sent.lost += len(values)
                return
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


class MqttSink:
    """Each record as a QoS 1 message to ``devices/<device>/<telemetry|events>``."""

    def __init__(self, host: str, port: int, *, client_id: str = "kappaflow-devices") -> None:
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311
        )
        self.client.max_inflight_messages_set(1000)
        self.client.max_queued_messages_set(100_000)
        self.sent = Sent()
        # Publish times by message id, and the ids acknowledged before their publish call
        # returned. Their own lock, never held while paho's are: the acknowledgement comes
        # in paho's network thread, which holds its callback lock then.
        self._pending: dict[int, float] = {}
        self._early: set[int] = set()
        self._lock = threading.Lock()
        self.client.on_publish = self._on_publish
        self.client.connect(host, port, keepalive=30)
        self.client.loop_start()

    def _on_publish(
        self,
        _client: mqtt.Client,
        _userdata: object,
        mid: int,
        _reason: object,
        _properties: object,
    ) -> None:
        with self._lock:
            began = self._pending.pop(mid, None)
            if began is None:
                self._early.add(mid)
        self._acknowledged(began)

    def _acknowledged(self, began: float | None) -> None:
        with self.sent.lock:
            self.sent.acknowledged += 1
            self.sent.statuses[0] += 1
            if began is not None:
                self.sent.latencies.append(time.perf_counter() - began)

    def send(self, records: list[Outgoing]) -> None:
        for r in records:
            device = r.key.decode()
            kind = "events" if r.topic == EVENTS_TOPIC else "telemetry"
            began = time.perf_counter()
            info = self.client.publish(f"devices/{device}/{kind}", r.value, qos=1)
            if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
                raise ProduceError("the MQTT client's queue is full: the broker is not keeping up")
            with self._lock:
                early = info.mid in self._early
                if early:
                    self._early.discard(info.mid)
                else:
                    self._pending[info.mid] = began

    def close(self, timeout: float = 30.0) -> None:
        with contextlib.suppress(WaitTimeoutError):
            wait_for(
                lambda: True if not self._pending else None,
                timeout=timeout,
                interval=0.05,
                what="the MQTT broker's acknowledgements",
            )
        with self._lock, self.sent.lock:
            self.sent.lost += len(self._pending)
        self.client.disconnect()
        self.client.loop_stop()


class SplitSink:
    """Devices of even number to ``even``, odd to ``odd`` (``dev-000041`` is odd)."""

    def __init__(self, even: GatewaySink | MqttSink, odd: GatewaySink | MqttSink) -> None:
        self.even, self.odd = even, odd

    def send(self, records: list[Outgoing]) -> None:
        evens = [r for r in records if int(r.key[-1:]) % 2 == 0]
        odds = [r for r in records if int(r.key[-1:]) % 2 == 1]
        self.even.send(evens)
        self.odd.send(odds)

    def close(self) -> None:
        self.even.close()
        self.odd.close()
