"""The IoT application's ingestion paths: readings per second and response time of each,
beside a direct Kafka producer, measured in the same run on the same broker.

Three paths take the same readings (``kappaflow.iot.telemetry``'s JSON, keyed by device)
into topics of the same layout (``DEFAULT_PARTITIONS`` partitions):

- ``direct``: a confluent-kafka producer (``kafka.clients.producer``: idempotent,
  acks=all), in the benchmark's process: the baseline;
- ``http``: the HTTP gateway (``kappaflow iot gateway``, a process of its own): each
  request is answered after Kafka acknowledged its readings;
- ``mqtt``: the embedded MQTT broker and the bridge (``kappaflow iot bridge``, a process
  of its own): QoS 1 messages, one reading each.

Each of ``devices`` simulated devices sends a batch of ``batch`` readings (one request,
one burst of messages, or one burst of records), waits for its acknowledgement, and sends
the next: a closed loop. The broker acknowledges an MQTT message (PUBACK) as soon as it
has it, before the bridge has taken it to Kafka, so MQTT devices are not held back by
Kafka as HTTP devices are: the broker queues what the bridge has not taken yet. So that
the queue stays bounded and the figures are of a steady state, MQTT devices also wait
while ``mqtt_in_flight`` of their readings are not in Kafka (a consumer of the bridge's
topic counts them): by default as many as the bridge holds at most (``MAX_INFLIGHT``);
``devices x batch`` holds them to what the other paths have in flight.

Per path and batch size, after a warm-up: readings acknowledged per second (an HTTP
answer's ``accepted``, a PUBACK, a delivery report), readings per second into the topic
(its end offsets), the response time (HTTP answer; MQTT PUBACK; the direct producer's
delivery report of a batch's last record), the time from sending a reading to its append
to the log (the topics stamp records with the broker's clock, ``LogAppendTime``, and each
reading's ``time`` is its send time), and the CPU seconds per second of wall time of the
benchmark's own process (the load generator), the gateway, the bridge, Kafka and the MQTT
broker, and of the whole machine, whose other work shows there and in the load average.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import paho.mqtt.client as paho
import psutil
from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from kappaflow.errors import ServiceExitedError
from kappaflow.iot.gateway import MAX_BATCH
from kappaflow.iot.registry import fleet_tokens, register
from kappaflow.iot.simulator import device_names
from kappaflow.iot.telemetry import METRICS
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.clients import consumer, producer
from kappaflow.kafka.topics import DEFAULT_PARTITIONS, create_topic, delete_topic, list_topics
from kappaflow.mqtt.broker import MAX_INFLIGHT, EmbeddedMqtt
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from kappaflow_bench.report import machine, percentile, write_json

PATHS = ("direct", "http", "mqtt")
#: Records stamped by the broker when appended: send → log is then one clock's difference.
LOG_APPEND_TIME = {"message.timestamp.type": "LogAppendTime"}
#: Readings read back per measurement for the send → log times; every n-th beyond that.
LOG_SAMPLES = 50_000
#: How long a stopped generator may take for what it has in flight.
DRAIN_S = 30.0
#: MQTT readings the devices may have sent that are not in Kafka yet.
MQTT_IN_FLIGHT = MAX_INFLIGHT


@dataclass
class Measurement:
    path: str
    batch: int
    devices: int
    seconds: float
    #: Readings acknowledged to the devices in the window, and per second.
    readings: int = 0
    rate: float = 0.0
    #: Records added to the path's topic in the window (its end offsets), and per second.
    in_kafka: int = 0
    kafka_rate: float = 0.0
    #: Answers in the window: HTTP responses, PUBACKs, batches acknowledged to the producer.
    responses: int = 0
    response_p50_ms: float | None = None
    response_p99_ms: float | None = None
    #: A reading's send → its append to the topic's log (ms resolution), sampled.
    to_log_p50_ms: float | None = None
    to_log_p99_ms: float | None = None
    to_log_samples: int = 0
    #: What went wrong in the window: HTTP statuses, refused readings, failed deliveries.
    errors: dict[str, int] = field(default_factory=dict)
    #: CPU seconds per wall second: the load generator, the services, the whole machine
    #: (of its ``cpus``; other work included).
    cpu: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    #: MQTT: the devices' share of the window spent waiting for Kafka to catch up.
    held_share: float | None = None
    load_average_at_start: list[float] = field(default_factory=list)
    #: Readings/s into Kafka over the direct producer's, at the same batch size.
    ratio_to_direct: float | None = None


@dataclass
class IngestBenchResult:
    devices: int
    batches: list[int]
    warmup_s: float
    duration_s: float
    reading_bytes: int
    mqtt_in_flight: int
    measurements: list[Measurement] = field(default_factory=list)
    #: What the gateway counted (``/v1/health`` at the end) and what the bridge did (the
    #: JSON line it prints when it stops).
    gateway: dict[str, Any] = field(default_factory=dict)
    bridge: dict[str, Any] = field(default_factory=dict)
    uptime_at_start: str = ""
    uptime_at_end: str = ""
    machine: dict[str, Any] = field(default_factory=dict)


# The readings.


class Device:
    """A simulated device's readings: the six metrics in turn, ``seq`` per round of them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.sent = 0

    def readings(self, n: int) -> list[bytes]:
        """The next ``n`` readings, stamped now: their ``time`` is their send time."""
        now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        found = []
        for k in range(self.sent, self.sent + n):
            metric = METRICS[k % len(METRICS)]
            seq = k // len(METRICS)
            value = round(metric.low + (metric.high - metric.low) * (0.3 + k % 40 / 100), 2)
            reading = {
                "device": self.name,
                "metric": metric.name,
                "value": value,
                "unit": metric.unit,
                "time": now,
                "seq": seq,
                "id": f"{self.name}/{seq}/{metric.name}",
            }
            found.append(json.dumps(reading).encode())
        self.sent += n
        return found


class Tally:
    """What a generator's devices were answered: (when, response time, readings) each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: list[tuple[float, float, int]] = []
        self.errors: list[tuple[float, str]] = []
        #: (when, seconds) a device waited before it could send.
        self.held: list[tuple[float, float]] = []

    def answer(self, began: float, readings: int) -> None:
        now = time.perf_counter()
        with self.lock:
            self.answers.append((now, now - began, readings))

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors.append((time.perf_counter(), kind))


# The generators: each runs until ``stop`` is set, then returns once its answers are in.


def run_direct(
    settings: Settings, topic: str, devices: list[Device], batch: int, stop: threading.Event
) -> Tally:
    """One producer, as the gateway has; each device's next batch once all of its last
    one is acknowledged. Delivery reports come in ``poll``, in this thread: no locks."""
    tally = Tally()
    client = producer(settings.kafka, acks="all")
    left = [0] * len(devices)
    began = [0.0] * len(devices)
    failed = [0] * len(devices)
    ready = list(range(len(devices)))

    def delivered(i: int, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            failed[i] += 1
            tally.error(err.name())
        left[i] -= 1
        if left[i] == 0:
            tally.answer(began[i], batch - failed[i])
            ready.append(i)

    callbacks = [functools.partial(delivered, i) for i in range(len(devices))]
    while not stop.is_set():
        sending, ready[:] = list(ready), []
        for i in sending:
            device = devices[i]
            key = device.name.encode()
            left[i], failed[i], began[i] = batch, 0, time.perf_counter()
            for value in device.readings(batch):
                client.produce(topic, value, key, on_delivery=callbacks[i])
        client.poll(0.05)
    client.flush(DRAIN_S)
    return tally


def run_http(
    url: str,
    devices: list[Device],
    tokens: dict[str, str],
    batch: int,
    stop: threading.Event,
) -> Tally:
    """A thread per device, each with a connection of its own, as devices have."""
    tally = Tally()

    def device_loop(device: Device) -> None:
        headers = {
            "Authorization": f"Bearer {tokens[device.name]}",
            "Content-Type": "application/json",
        }
        path = f"/v1/devices/{device.name}/readings"
        with httpx.Client(base_url=url, headers=headers, timeout=30.0) as client:
            while not stop.is_set():
                values = device.readings(batch)
                # One reading is sent as an object, a batch as an array.
                body = values[0] if batch == 1 else b"[" + b",".join(values) + b"]"
                began = time.perf_counter()
                try:
                    answer = client.post(path, content=body)
                except httpx.TransportError as exc:
                    tally.error(type(exc).__name__)
                    stop.wait(0.1)
                    continue
                if answer.status_code != 200:
                    tally.error(f"HTTP {answer.status_code}")
                    stop.wait(0.1)  # what the gateway's Retry-After asks, shorter
                    continue
                found = answer.json()
                tally.answer(began, int(found["accepted"]))
                if found["rejected"]:
                    tally.error("rejected")

    threads = [
        threading.Thread(target=device_loop, args=(d,), name=f"http-{d.name}") for d in devices
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally


class _InFlight:
    """Readings sent and not yet in Kafka, at most ``limit``: taken before a burst,
    given back as a consumer of the bridge's topic sees them arrive."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.cond = threading.Condition()

    def take(self, n: int, stop: threading.Event) -> bool:
        with self.cond:
            while self.count + n > self.limit:
                if stop.is_set():
                    return False
                self.cond.wait(0.1)
            self.count += n
            return True

    def arrived(self, n: int) -> None:
        with self.cond:
            self.count = max(0, self.count - n)
            self.cond.notify_all()


class _MqttDevice:
    """A device's MQTT connection: a burst of QoS 1 messages, then their PUBACKs."""

    def __init__(self, settings: Settings, device: Device, topic: str) -> None:
        self.device = device
        self.topic = topic
        self.batch = 1
        self.tally: Tally | None = None
        # Send times by message id, and the ids whose PUBACK came before publish
        # returned. Their own lock, never held while calling publish: paho's network
        # thread holds its callback lock while it calls on_publish, which takes this one.
        self._lock = threading.Lock()
        self._sent: dict[int, float] = {}
        self._early: dict[int, float] = {}
        self._left = 0
        self._acked = threading.Event()
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"kappaflow-bench-{device.name}",
            protocol=paho.MQTTv311,
        )
        # Not paho's 20: a burst goes out whole, as the other paths' batches do.
        self.client.max_inflight_messages_set(MAX_BATCH)
        self.client.on_publish = self._on_publish
        host, port = settings.mqtt.address
        self.client.connect(host, port, keepalive=30)
        self.client.loop_start()

    def _on_publish(
        self, _client: paho.Client, _userdata: Any, mid: int, _reason: Any, _props: Any
    ) -> None:
        now = time.perf_counter()
        with self._lock:
            began = self._sent.pop(mid, None)
            if began is None:
                self._early[mid] = now
            else:
                self._answered(began, now)

    def _answered(self, began: float, at: float) -> None:
        # Under self._lock.
        if self.tally is not None:
            with self.tally.lock:
                self.tally.answers.append((at, at - began, 1))
        self._left -= 1
        if self._left == 0:
            self._acked.set()

    def run(self, tally: Tally, in_flight: _InFlight, stop: threading.Event) -> None:
        with self._lock:
            # What a burst cut short by the last stop left behind.
            self.tally = tally
            self._sent.clear()
            self._early.clear()
        while not stop.is_set():
            waited = time.perf_counter()
            if not in_flight.take(self.batch, stop):
                return
            now = time.perf_counter()
            with tally.lock:
                tally.held.append((now, now - waited))
            with self._lock:
                self._left = self.batch
                self._acked.clear()
            for value in self.device.readings(self.batch):
                began = time.perf_counter()
                info = self.client.publish(self.topic, value, qos=1)
                if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
                    tally.error(f"publish {info.rc.name}")
                with self._lock:
                    acked_at = self._early.pop(info.mid, None)
                    if acked_at is not None:
                        self._answered(began, acked_at)
                    else:
                        self._sent[info.mid] = began
            while not self._acked.wait(1.0):
                if stop.is_set() and not self._acked.wait(DRAIN_S):
                    tally.error("no PUBACK")
                    return

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def run_mqtt(
    settings: Settings,
    kafka_topic: str,
    clients: list[_MqttDevice],
    limit: int,
    batch: int,
    stop: threading.Event,
) -> Tally:
    """The devices' bursts, while fewer than ``limit`` readings (at least one burst of
    each device) are not in Kafka yet."""
    tally = Tally()
    in_flight = _InFlight(max(limit, len(clients) * batch))
    arrivals = _follow(settings, kafka_topic, in_flight.arrived)
    threads = [
        threading.Thread(target=c.run, args=(tally, in_flight, stop), name=f"mqtt-{c.device.name}")
        for c in clients
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # What the bridge still holds reaches Kafka before the next measurement starts.
        with suppress(TimeoutError):
            wait_for(
                lambda: True if in_flight.count == 0 else None,
                timeout=DRAIN_S,
                interval=0.05,
                what="the bridge to catch up",
            )
    finally:
        arrivals.set()
    return tally


def _follow(settings: Settings, topic: str, arrived: Callable[[int], None]) -> threading.Event:
    """A thread counting the records that arrive in ``topic`` from now on, until the
    returned event is set. It reads the values, never parses them."""
    done = threading.Event()
    # No waiting for a fuller fetch: an arrival is reported within milliseconds.
    reader = consumer(settings.kafka, **{"fetch.wait.max.ms": 5, "enable.partition.eof": False})
    # From the offsets of now, not "the end" (resolved at the first fetch): a record that
    # arrived in between would never be counted, and its place in flight never given back.
    ends = _ends(reader, topic, settings.kafka.timeout_s)
    reader.assign([TopicPartition(topic, p, end) for p, end in ends.items()])

    def follow() -> None:
        try:
            while not done.is_set():
                messages = reader.consume(10_000, timeout=0.05)
                n = sum(1 for m in messages if m.error() is None)
                if n:
                    arrived(n)
        finally:
            reader.close()

    threading.Thread(target=follow, name="arrivals", daemon=True).start()
    return done


# The services: the gateway and the bridge, each a process of its own.


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def check(self) -> None:
        if self.process.poll() is not None:
            lines = self.log.read_text(errors="replace").strip().splitlines()
            raise ServiceExitedError(
                f"the {self.name} exited ({self.process.returncode}): "
                + (lines[-1] if lines else "no output")
            )

    def stop(self) -> dict[str, Any]:
        """SIGTERM, as a service manager stops it; the JSON line it printed at the end."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=DRAIN_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for line in reversed(self.log.read_text(errors="replace").splitlines()):
            with suppress(ValueError):
                found = json.loads(line)
                if isinstance(found, dict):
                    return found
        return {}


@contextmanager
def service(name: str, argv: list[str], log: Path) -> Iterator[Service]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        process = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT)
    started = Service(name, process, log)
    try:
        yield started
    finally:
        started.stop()


# The measurements.


@dataclass
class _Snapshot:
    at: float
    ends: dict[int, int]
    cpu: dict[str, float]
    machine: Any  # psutil.cpu_times()


def _ends(reader: Consumer, topic: str, timeout: float) -> dict[int, int]:
    partitions = reader.list_topics(topic, timeout=timeout).topics[topic].partitions
    return {
        p: reader.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
        for p in partitions
    }


def _snapshot(
    reader: Consumer, topic: str, timeout: float, processes: dict[str, psutil.Process]
) -> _Snapshot:
    cpu = {}
    for name, proc in processes.items():
        with suppress(psutil.Error):
            times = proc.cpu_times()
            cpu[name] = times.user + times.system
    return _Snapshot(time.perf_counter(), _ends(reader, topic, timeout), cpu, psutil.cpu_times())


def _to_log_ms(
    settings: Settings, topic: str, start: dict[int, int], end: dict[int, int]
) -> list[float]:
    """Send → log append, in ms, of the records between the offsets (every n-th, at
    most about ``LOG_SAMPLES``), from each reading's ``time`` and the log's stamp."""
    remaining = {p for p in end if end[p] > start.get(p, 0)}
    step = max(1, sum(end[p] - start.get(p, 0) for p in remaining) // LOG_SAMPLES)
    reader = consumer(settings.kafka, **{"enable.partition.eof": False})
    reader.assign([TopicPartition(topic, p, start.get(p, 0)) for p in remaining])
    found: list[float] = []
    deadline = time.monotonic() + 120
    try:
        while remaining and time.monotonic() < deadline:
            for message in reader.consume(10_000, timeout=1.0):
                p, offset = message.partition(), message.offset()
                if message.error() is not None or p not in remaining or offset is None:
                    continue
                if offset < end[p] and offset % step == 0:
                    kind, stamp_ms = message.timestamp()
                    if kind != TIMESTAMP_LOG_APPEND_TIME:
                        raise RuntimeError(f"{topic!r} is not stamped with the log's clock")
                    sent = datetime.fromisoformat(json.loads(message.value() or b"{}")["time"])
                    found.append(stamp_ms - sent.timestamp() * 1000)
                if offset + 1 >= end[p]:
                    remaining.discard(p)
    finally:
        reader.close()
    return found


def _figures(found: Measurement, tally: Tally, first: _Snapshot, last: _Snapshot) -> None:
    """``found``'s figures from what the generator counted between two snapshots."""
    seconds = found.seconds = last.at - first.at
    window = [a for a in tally.answers if first.at <= a[0] < last.at]
    found.readings = sum(a[2] for a in window)
    found.rate = round(found.readings / seconds, 1)
    found.in_kafka = sum(last.ends[p] - first.ends.get(p, 0) for p in last.ends)
    found.kafka_rate = round(found.in_kafka / seconds, 1)
    found.responses = len(window)
    times = [a[1] * 1000 for a in window]
    found.response_p50_ms, found.response_p99_ms = _p50_p99(times)
    found.errors = dict(Counter(kind for at, kind in tally.errors if first.at <= at < last.at))
    found.cpu = {
        name: round((last.cpu[name] - first.cpu[name]) / seconds, 3)
        for name in last.cpu
        if name in first.cpu
    }
    total = sum(last.machine) - sum(first.machine)
    idle = (last.machine.idle - first.machine.idle) + (last.machine.iowait - first.machine.iowait)
    found.machine_busy = round((total - idle) / total * (os.cpu_count() or 1), 3) if total else 0.0
    if found.path == "mqtt":
        held = sum(s for at, s in tally.held if first.at <= at < last.at)
        found.held_share = round(held / (found.devices * seconds), 3)


def _p50_p99(values: list[float]) -> tuple[float | None, float | None]:
    return tuple(  # type: ignore[return-value]
        None if v is None else round(v, 2) for v in (percentile(values, 50), percentile(values, 99))
    )


# The run.


class IngestBench:
    """The services, the devices and the topics of one run."""

    def __init__(
        self,
        settings: Settings,
        devices: int,
        warmup_s: float,
        duration_s: float,
        mqtt_in_flight: int = MQTT_IN_FLIGHT,
    ) -> None:
        self.settings = settings
        self.fleet = device_names(devices)
        self.warmup_s, self.duration_s = warmup_s, duration_s
        self.mqtt_in_flight = mqtt_in_flight
        run_id = uuid.uuid4().hex[:6]
        self.direct_topic = f"bench.ingest.{run_id}.direct"
        self.mqtt_topic = f"bench.ingest.{run_id}.mqtt"
        self.http_topic = f"bench.ingest.{run_id}.http"
        self.gateway_topics = {
            "events": f"bench.ingest.{run_id}.events",
            "dlq": f"bench.ingest.{run_id}.gateway-dlq",
            "registry": f"bench.ingest.{run_id}.registry",
        }
        self.mqtt_prefix = f"bench-ingest-{run_id}"
        self.bridge_id = f"kappaflow-bench-bridge-{run_id}"
        self.url = f"http://127.0.0.1:{free_port()}"
        self.tokens: dict[str, str] = {}
        self.mqtt_devices: list[_MqttDevice] = []
        self.processes: dict[str, psutil.Process] = {}
        self.gateway: Service
        self.bridge: Service

    def topic(self, path: str) -> str:
        return {"direct": self.direct_topic, "http": self.http_topic}.get(path, self.mqtt_topic)

    def generator(self, path: str, batch: int) -> Callable[[threading.Event], Tally]:
        devices = [Device(name) for name in self.fleet]
        if path == "direct":
            return functools.partial(run_direct, self.settings, self.direct_topic, devices, batch)
        if path == "http":
            return functools.partial(run_http, self.url, devices, self.tokens, batch)
        for client in self.mqtt_devices:
            client.batch = batch
        return functools.partial(
            run_mqtt, self.settings, self.mqtt_topic, self.mqtt_devices, self.mqtt_in_flight, batch
        )

    def measure(self, path: str, batch: int) -> Measurement:
        """The path's generator for the warm-up, then measured, then stopped."""
        stop = threading.Event()
        generate = self.generator(path, batch)
        outcome: list[Tally] = []
        failure: list[BaseException] = []

        def generator() -> None:
            try:
                outcome.append(generate(stop))
            except BaseException as exc:  # raised again in the calling thread
                failure.append(exc)
                stop.set()

        found = Measurement(path, batch, len(self.fleet), 0.0)
        found.load_average_at_start = list(os.getloadavg())
        topic, timeout = self.topic(path), self.settings.kafka.timeout_s
        reader = consumer(self.settings.kafka)
        thread = threading.Thread(target=generator, name=f"generator-{path}")
        thread.start()
        try:
            # The warm-up pays for what a running service has paid already: connections,
            # the first requests through FastAPI and pydantic, the producers' metadata.
            stop.wait(self.warmup_s)
            first = _snapshot(reader, topic, timeout, self.processes)
            stop.wait(self.duration_s)
            last = _snapshot(reader, topic, timeout, self.processes)
        finally:
            stop.set()
            thread.join()
            reader.close()
        if failure:
            raise failure[0]
        _figures(found, outcome[0], first, last)
        to_log = _to_log_ms(self.settings, topic, first.ends, last.ends)
        found.to_log_samples = len(to_log)
        found.to_log_p50_ms, found.to_log_p99_ms = _p50_p99(to_log)
        return found

    @contextmanager
    def running(self, flags: list[str], say: Callable[[str], None]) -> Iterator[IngestBench]:
        """The topics, the fleet registered, the gateway and the bridge running with the
        global ``flags``, the MQTT devices connected; all removed again afterwards."""
        kafka, state = self.settings.kafka, self.settings.state_dir
        created = [self.direct_topic, self.mqtt_topic, f"{self.mqtt_topic}.dlq", self.http_topic]
        created += list(self.gateway_topics.values())
        kappaflow = [sys.executable, "-m", "kappaflow", *flags, "iot"]
        gateway_argv = [*kappaflow, "gateway", "--port", self.url.rsplit(":", 1)[1]]
        gateway_argv += ["--readings-topic", self.http_topic]
        gateway_argv += ["--events-topic", self.gateway_topics["events"]]
        gateway_argv += ["--dlq-topic", self.gateway_topics["dlq"]]
        gateway_argv += ["--registry-topic", self.gateway_topics["registry"]]
        bridge_argv = [*kappaflow, "bridge", "--mqtt-topic", f"{self.mqtt_prefix}/+/telemetry"]
        bridge_argv += ["--topic", self.mqtt_topic, "--dlq", f"{self.mqtt_topic}.dlq"]
        bridge_argv += ["--client-id", self.bridge_id]
        logs = state / "bench-iot-ingest"
        try:
            for topic in (self.direct_topic, self.mqtt_topic, self.http_topic):
                create_topic(kafka, topic, partitions=DEFAULT_PARTITIONS, configs=LOG_APPEND_TIME)
            # What `kappaflow iot register --fleet N` does: the state directory's tokens.
            self.tokens, _new = fleet_tokens(state / "iot" / "tokens.json", self.fleet)
            register(kafka, self.tokens, topic=self.gateway_topics["registry"])
            with (
                service("gateway", gateway_argv, logs / "gateway.log") as self.gateway,
                service("bridge", bridge_argv, logs / "bridge.log") as self.bridge,
            ):
                _wait_ready(self.gateway, self.bridge, self.url)
                say(f"gateway on {self.url}, bridge on {self.settings.mqtt.effective_url}")
                self.processes = _processes(self.settings, self.gateway, self.bridge)
                try:
                    for name in self.fleet:
                        topic = f"{self.mqtt_prefix}/{name}/telemetry"
                        self.mqtt_devices.append(_MqttDevice(self.settings, Device(name), topic))
                    yield self
                finally:
                    for client in self.mqtt_devices:
                        client.close()
        finally:
            _forget_session(self.settings, self.bridge_id)
            existing = {t["name"] for t in list_topics(kafka)}
            for topic in created:
                if topic in existing:
                    delete_topic(kafka, topic)


def run(
    settings: Settings,
    kappaflow_flags: list[str],
    *,
    devices: int,
    batches: list[int],
    warmup_s: float,
    duration_s: float,
    mqtt_in_flight: int = MQTT_IN_FLIGHT,
    out_dir: Path,
    say: Callable[[str], None],
) -> IngestBenchResult:
    """Every path at every batch size: at each, the direct producer first, then the
    gateway, then MQTT, so that each path is a minute, not a run, from its baseline.
    ``kappaflow_flags`` are the global flags the gateway and the bridge are run with."""
    bench = IngestBench(settings, devices, warmup_s, duration_s, mqtt_in_flight)
    result = IngestBenchResult(
        devices=devices,
        batches=batches,
        warmup_s=warmup_s,
        duration_s=duration_s,
        reading_bytes=len(Device(bench.fleet[0]).readings(1)[0]),
        mqtt_in_flight=mqtt_in_flight,
        machine=machine(),
        uptime_at_start=_uptime(),
    )
    with bench.running(kappaflow_flags, say):
        for batch in batches:
            for path in PATHS:
                bench.gateway.check()
                bench.bridge.check()
                found = bench.measure(path, batch)
                result.measurements.append(found)
                say(
                    f"{path} x{batch}: {found.kafka_rate:,.0f} readings/s into Kafka, "
                    f"response p50 {found.response_p50_ms} ms"
                )
        # The gateway's counts (it prints none when a signal stops it), the bridge's.
        result.gateway = httpx.get(f"{bench.url}/v1/health", timeout=5).json()
        result.bridge = bench.bridge.stop()
    for found in result.measurements:
        base = next(m for m in result.measurements if m.path == "direct" and m.batch == found.batch)
        if base.kafka_rate:
            found.ratio_to_direct = round(found.kafka_rate / base.kafka_rate, 3)
    result.machine["load_average_at_end"] = os.getloadavg()
    result.uptime_at_end = _uptime()
    write_json(out_dir / "result.json", result)
    (out_dir / "summary.md").write_text(summary(result))
    return result


def _wait_ready(gateway: Service, bridge: Service, url: str) -> None:
    def gateway_up() -> bool | None:
        gateway.check()
        with suppress(httpx.HTTPError):
            return True if httpx.get(f"{url}/v1/health", timeout=2).status_code == 200 else None
        return None

    def bridge_up() -> bool | None:
        bridge.check()
        # What the bridge says once subscribed.
        return True if "bridging " in bridge.log.read_text(errors="replace") else None

    wait_for(gateway_up, timeout=120, interval=0.2, what="the gateway")
    wait_for(bridge_up, timeout=120, interval=0.2, what="the bridge")


def _processes(settings: Settings, gateway: Service, bridge: Service) -> dict[str, psutil.Process]:
    found = {
        "generator": psutil.Process(),
        "gateway": psutil.Process(gateway.process.pid),
        "bridge": psutil.Process(bridge.process.pid),
    }
    for name, pid in (
        ("kafka", EmbeddedBroker(settings).status().pid if settings.kafka.embedded else None),
        ("mqtt broker", EmbeddedMqtt(settings).status().pid if settings.mqtt.embedded else None),
    ):
        if pid is not None:
            with suppress(psutil.Error):
                found[name] = psutil.Process(pid)
    return found


def _forget_session(settings: Settings, client_id: str) -> None:
    """End the bridge's persistent session at the broker: a clean connection under its id."""
    client = paho.Client(
        CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=True, protocol=paho.MQTTv311
    )
    with suppress(OSError):
        client.connect(*settings.mqtt.address, keepalive=10)
        client.loop(timeout=1.0)
        client.disconnect()


def _uptime() -> str:
    with suppress(OSError, subprocess.SubprocessError):
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


# The report.

COLUMNS = (
    "path",
    "batch",
    "readings/s into Kafka",
    "vs direct",
    "response p50/p99 ms",
    "send→log p50/p99 ms",
    "CPU generator/service/Kafka",
    "machine busy",
)


def rows(result: IngestBenchResult) -> list[list[str]]:
    found = []
    for m in result.measurements:
        service_cpu = {
            "http": m.cpu.get("gateway", 0.0),
            "mqtt": m.cpu.get("bridge", 0.0) + m.cpu.get("mqtt broker", 0.0),
        }.get(m.path)
        cpu = [m.cpu.get("generator", 0.0), service_cpu, m.cpu.get("kafka", 0.0)]
        found.append(
            [
                m.path,
                str(m.batch),
                f"{m.kafka_rate:,.0f}",
                "-" if m.path == "direct" else f"{m.ratio_to_direct or 0:.0%}",
                f"{m.response_p50_ms} / {m.response_p99_ms}",
                f"{m.to_log_p50_ms} / {m.to_log_p99_ms}",
                " / ".join("-" if c is None else f"{c:.2f}" for c in cpu),
                f"{m.machine_busy:.2f} of {result.machine.get('cpus')}",
            ]
        )
    return found


def summary(result: IngestBenchResult) -> str:
    info = result.machine
    lines = [
        "# IoT ingestion: readings per second and response time per path",
        "",
        f"{result.devices} devices, batches of {', '.join(map(str, result.batches))} readings "
        f"({result.reading_bytes} bytes each), {result.warmup_s:g} s warm-up then "
        f"{result.duration_s:g} s measured per path and batch; MQTT devices wait while "
        f"{result.mqtt_in_flight:,} of their readings are not in Kafka.",
        f"Machine: {info.get('cpus')} CPUs ({info.get('cpu_model')}), "
        f"{info.get('memory_gib')} GiB, {info.get('platform')}, Python {info.get('python')}.",
        f"Load: at start `{result.uptime_at_start}`; at end `{result.uptime_at_end}`.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
        *("| " + " | ".join(row) + " |" for row in rows(result)),
        "",
        "CPU: seconds per wall second (1.00 is one core); service: the gateway, or the "
        "bridge and the MQTT broker. Response: the HTTP answer (after Kafka's "
        "acknowledgement), the MQTT PUBACK (the broker's, before the bridge's), the direct "
        "producer's delivery report of a batch's last record.",
    ]
    errors = [f"{m.path} x{m.batch}: {m.errors}" for m in result.measurements if m.errors]
    lines += ["", "Errors: " + "; ".join(errors)] if errors else []
    return "\n".join(lines) + "\n"
