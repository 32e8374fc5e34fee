"""The IoT demo: a fleet streams through the HTTP gateway and MQTT, the application's jobs
run, and the terminal shows the fleet, its readings, open alerts and the models, live.

It starts the embedded services, registers the fleet, runs the gateway and the two MQTT
bridges (readings and events) in this process, starts the application's two jobs (the
cleaning, training, alerting and device-state streams in one driver, and the real-time
scorer in a driver of its own), and runs the simulator live: devices of even number send
over HTTP, odd over MQTT. Ctrl-C (or the end of ``duration``) stops the simulator, then
the jobs, the bridges, the gateway, and the services it started.
"""

from __future__ import annotations

import contextlib
import functools
import json
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import uvicorn
from confluent_kafka import OFFSET_END, TopicPartition
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from kappaflow import services
from kappaflow.api.server import EmbeddedApi
from kappaflow.errors import JobError, JobNotFoundError, JobStartError, KappaflowError
from kappaflow.iot.alerts import explanation
from kappaflow.iot.feed import LabelsFile, feed
from kappaflow.iot.gateway import Gateway, GatewayConfig, create_app
from kappaflow.iot.registry import Registry, fleet_tokens, register
from kappaflow.iot.senders import GatewaySink, MqttSink, SplitSink
from kappaflow.iot.simulator import FleetConfig, Simulation, device_names
from kappaflow.jobs.manager import ACTIVE_STATES, START_TIMEOUT_S, JobManager
from kappaflow.jobs.removal import remove_job
from kappaflow.kafka.clients import consumer
from kappaflow.kafka.topics import (
    COMPACTED,
    DEFAULT_PARTITIONS,
    create_topic,
    delete_topic,
    list_topics,
)
from kappaflow.mqtt.bridge import MqttBridge
from kappaflow.procs import free_port, port_in_use
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.streams.output.backends import read_latest
from kappaflow.waiting import wait_for

#: The demo's topics: the application's, under a prefix of their own, so that the demo
#: starts from nothing each time without touching the application's own topics.
PREFIX = "demo."
RAW, EVENTS, CLEAN = f"{PREFIX}telemetry.raw", f"{PREFIX}devices.events", f"{PREFIX}telemetry.clean"
MODELS, SCORES, ALERTS = f"{PREFIX}models", f"{PREFIX}scores", f"{PREFIX}alerts"
STATUS, REGISTRY, DLQ = (
    f"{PREFIX}devices.status",
    f"{PREFIX}devices.registry",
    f"{PREFIX}gateway.dlq",
)
#: The application as two jobs: ``kappaflow.iot.app`` runs the cleaning, training,
#: alerting and device-state streams in one Spark driver (with its parts' parameters), and
#: the real-time scorer (``kappaflow.iot.realtime``) scores each raw reading the cleaning
#: job would pass, milliseconds after it reaches Kafka.
JOB, SCORER = "demo-iot", "demo-iot-score"
PARAMS = {
    "parts": "clean,train,alerts,devices",
    "clean.source": RAW,
    "clean.dest": CLEAN,
    "clean.registry": REGISTRY,
    "train.source": CLEAN,
    "train.dest": MODELS,
    "alerts.source": SCORES,
    "alerts.dest": ALERTS,
    "devices.events": EVENTS,
    "devices.source": CLEAN,
    "devices.status": STATUS,
}
SCORER_PARAMS = {
    "readings": "raw",
    "source": RAW,
    "models": MODELS,
    "dest": SCORES,
    "registry": REGISTRY,
}
JOBS: tuple[tuple[str, str, dict[str, str]], ...] = (
    (JOB, "kappaflow.iot.app:build", PARAMS),
    (SCORER, "kappaflow.iot.realtime:PIPELINE", SCORER_PARAMS),
)
GATEWAY_PORT = 8088
#: Anomalies a day per device and metric: many, so that alerts come within minutes.
ANOMALIES_PER_DAY = 48.0


@dataclass
class Outputs:
    """The ``models`` and ``scores`` topics followed: how many series have a model, the
    newest version, and how many readings were scored and how long after their event
    time (the score record's Kafka timestamp less the reading's ``time``)."""

    keys: set[bytes] = field(default_factory=set)
    version: int = 0
    model: str = "-"
    scored: int = 0
    #: (when it was seen, monotonic; event time to score, ms) of the latest scores.
    lags: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=20_000))

    def lag_p50(self, window_s: float = 10.0) -> float | None:
        """The median event-to-score time of the scores seen in the last ``window_s``."""
        since = time.monotonic() - window_s
        # Seen in order: what is older than the window goes from the left (the follower
        # appends on the right meanwhile, which a deque allows).
        while self.lags and self.lags[0][0] < since:
            self.lags.popleft()
        recent = [lag for _, lag in list(self.lags)]
        return statistics.median_high(recent) if recent else None

    def take(self, topic: str, key: bytes, value: dict[str, Any], timestamp_ms: int) -> None:
        if topic == MODELS:
            self.keys.add(key)
            if int(value.get("version", 0)) >= self.version:
                self.version = int(value["version"])
                self.model = str(value.get("model", "-"))
            return
        self.scored += 1
        event = datetime.fromisoformat(str(value["time"]))
        self.lags.append((time.monotonic(), timestamp_ms - event.timestamp() * 1000.0))


def _follow(settings: Settings, outputs: Outputs, stop: threading.Event) -> None:
    client = consumer(settings.kafka, **{"enable.partition.eof": False})
    try:
        topics = (MODELS, SCORES)
        found = wait_for(
            lambda: (
                listed
                if all(t in (listed := client.list_topics(timeout=5).topics) for t in topics)
                else None
            ),
            timeout=600,
            what="the models and scores topics",
        )
        client.assign(
            [
                TopicPartition(t, p, 0 if t == MODELS else OFFSET_END)
                for t in topics
                for p in found[t].partitions
            ]
        )
        while not stop.is_set():
            message = client.poll(0.5)
            if message is None or message.error() is not None or message.value() is None:
                continue
            _kind, timestamp_ms = message.timestamp()
            value = json.loads(message.value() or b"{}")
            outputs.take(message.topic() or "", message.key() or b"", value, timestamp_ms)
    except Exception:
        return
    finally:
        client.close()


@contextlib.contextmanager
def _in_thread(target: Callable[[threading.Event], Any], name: str) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=60)


@contextlib.contextmanager
def _gateway(settings: Settings, port: int) -> Iterator[Gateway]:
    config = GatewayConfig(readings_topic=RAW, events_topic=EVENTS, dlq_topic=DLQ)
    gateway = Gateway(settings.kafka, Registry(settings.kafka, REGISTRY), config)
    server = uvicorn.Server(
        uvicorn.Config(create_app(gateway), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    wait_for(lambda: server.started or None, timeout=120, what="the gateway")
    try:
        yield gateway
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@contextlib.contextmanager
def _dashboard(settings: Settings, say: Callable[[str], None]) -> Iterator[None]:
    """The kappaflow service, for its dashboard, unless it runs; stopped after if started
    here. A service that cannot start (its port taken) is said, and the demo goes on."""
    service = EmbeddedApi(settings)
    try:
        started = service.start()
    except KappaflowError as exc:
        say(f"no dashboard: {exc}")
        yield
        return
    say(f"dashboard on {service.url}/")
    try:
        yield
    finally:
        if started:
            service.stop()


def run_iot_demo(
    settings: Settings,
    console: Console,
    *,
    devices: int,
    rate: float,
    duration_s: float | None,
    port: int = GATEWAY_PORT,
    overrides: SettingsOverrides | None = None,
    config_file: Path | None = None,
) -> dict[str, Any]:
    """Run the application until Ctrl-C or ``duration_s``; what was sent and seen.
    ``overrides`` and ``config_file`` (the command's global options) reach the job."""
    say = console.print
    jobs = JobManager(settings)
    if port == 0 or port_in_use("127.0.0.1", port):
        port = free_port()
    with services.embedded_services(settings, say):
        tokens, _new = fleet_tokens(
            settings.state_dir / "iot" / "tokens.json", device_names(devices)
        )
        _fresh(settings, jobs)
        register(settings.kafka, tokens, topic=REGISTRY)
        say(f"{devices} devices registered")
        with contextlib.ExitStack() as stack:
            gateway = stack.enter_context(_gateway(settings, port))
            url = f"http://127.0.0.1:{port}"
            say(f"gateway on {url}")
            for topic, kafka_topic, client in (
                ("devices/+/telemetry", RAW, "kappaflow-demo-telemetry"),
                ("devices/+/events", EVENTS, "kappaflow-demo-events"),
            ):
                bridge = MqttBridge(settings, topic, kafka_topic, client_id=client)
                stack.enter_context(_in_thread(bridge.run, f"bridge {topic}"))
            say("MQTT bridges running")
            stack.enter_context(_dashboard(settings, say))
            started: list[str] = []
            stack.callback(_stop_jobs, jobs, started, say)
            launch = functools.partial(
                jobs.start, wait=False, overrides=overrides, config_file=config_file
            )
            _start_jobs(settings, jobs, started, say, launch)
            outputs = Outputs()
            stack.enter_context(
                _in_thread(lambda stop: _follow(settings, outputs, stop), "outputs")
            )
            return _stream(
                settings, jobs, console, url, gateway, tokens, outputs, devices, rate, duration_s
            )


def _fresh(settings: Settings, jobs: JobManager) -> None:
    """What a previous demo left: its jobs (stopped, then removed with their checkpoints
    and serving keys) and its topics."""
    for name, _app, _params in JOBS:
        if jobs.get_state(name) in ACTIVE_STATES:
            jobs.stop(name)
        with contextlib.suppress(JobNotFoundError):
            remove_job(settings, name)
    existing = {t["name"] for t in list_topics(settings.kafka)}
    for topic in sorted(existing):
        if topic.startswith((PREFIX, "demo-iot")):
            delete_topic(settings.kafka, topic)


def _start_jobs(
    settings: Settings,
    jobs: JobManager,
    started: list[str],
    say: Callable[[str], None],
    launch: Callable[[str, str, dict[str, str]], object],
) -> None:
    """Start the jobs side by side: their drivers take most of a minute each to start.
    A job refuses to start on a topic that does not exist, so the topics one job writes
    and another reads are created first, as the writer would create them."""
    kafka = settings.kafka
    for topic in (CLEAN, SCORES):
        create_topic(kafka, topic, partitions=DEFAULT_PARTITIONS, exist_ok=True)
    create_topic(
        kafka, MODELS, partitions=DEFAULT_PARTITIONS, configs=dict(COMPACTED), exist_ok=True
    )
    for name, app, params in JOBS:
        launch(name, app, params)
        started.append(name)
    say(f"starting jobs {', '.join(started)} ...")
    for name in started:
        wait_for(
            functools.partial(_running, jobs, name),
            timeout=START_TIMEOUT_S * 2,
            interval=0.5,
            what=f"job {name} to run",
        )
        say(f"job {name} running")


def _running(jobs: JobManager, name: str) -> bool | None:
    state = jobs.get_state(name)
    if state in ("failed", "stopped"):
        raise JobStartError(f"job {name} {state}: " + " ".join(jobs.log_lines(name, 3)))
    return True if state == "running" else None


def _stop_jobs(jobs: JobManager, names: list[str], say: Callable[[str], None]) -> None:
    for name in reversed(names):
        with contextlib.suppress(Exception):
            jobs.stop(name)
            say(f"job {name} stopped")


def _check_running(jobs: JobManager) -> None:
    """A job that failed ends the demo, with the end of its log."""
    for name, _app, _params in JOBS:
        if jobs.get_state(name) != "running":
            lines = " | ".join(jobs.log_lines(name, 5))
            raise JobError(f"job {name} is {jobs.get_state(name)}: {lines}")


def _stream(
    settings: Settings,
    jobs: JobManager,
    console: Console,
    url: str,
    gateway: Gateway,
    tokens: dict[str, str],
    outputs: Outputs,
    devices: int,
    rate: float,
    duration_s: float | None,
) -> dict[str, Any]:
    config = FleetConfig(devices=devices, rate=rate, seed=11, anomalies_per_day=ANOMALIES_PER_DAY)
    begin = time.time()
    simulation = Simulation(config, begin)
    http = GatewaySink(url, tokens)
    mqtt = MqttSink(*settings.mqtt.address)
    sink = SplitSink(http, mqtt)
    labels = LabelsFile(settings.state_dir / "iot" / "demo-labels.jsonl")
    stop = threading.Event()
    until = begin + duration_s if duration_s is not None else None
    sender = threading.Thread(
        target=feed,
        args=(simulation, sink, labels),
        kwargs={"until": until, "live": True, "stop": stop, "step_s": 0.5},
        name="devices",
        daemon=True,
    )
    sender.start()
    store = redis_client(settings)
    seen: dict[str, Any] = {}
    rates: list[tuple[float, int]] = []
    try:
        with Live(console=console, refresh_per_second=1) as live:
            while sender.is_alive():
                _check_running(jobs)
                seen = _look(store, gateway)
                sent = http.sent.acknowledged + mqtt.sent.acknowledged
                rates.append((time.monotonic(), sent))
                rates[:] = [r for r in rates if r[0] >= time.monotonic() - 10]
                live.update(_view(seen, outputs, http, mqtt, rates))
                sender.join(timeout=1.0)
    except KeyboardInterrupt:
        console.print("stopping ...")
    finally:
        stop.set()
        sender.join(timeout=60)
        store.close()
    return {
        "http": http.sent.to_json(),
        "mqtt": mqtt.sent.to_json(),
        "online": seen.get("online", 0),
        "open_alerts": len(seen.get("alerts", [])),
        "models": len(outputs.keys),
        "model_version": outputs.version,
        "scored": outputs.scored,
    }


def _look(store: Any, gateway: Gateway) -> dict[str, Any]:
    with contextlib.suppress(Exception):
        status = read_latest(store, JOB, "status")
        alerts = read_latest(store, JOB, "alerts")
        opened = [a for a in alerts.values() if a.get("open")]
        opened.sort(key=lambda a: str(a.get("time")), reverse=True)
        return {
            "online": sum(1 for s in status.values() if s.get("status") == "online"),
            "known": len(status),
            "alerts": opened,
            "gateway": gateway.stats()["counts"],
        }
    return {}


def _view(
    seen: dict[str, Any],
    outputs: Outputs,
    http: GatewaySink,
    mqtt: MqttSink,
    rates: list[tuple[float, int]],
) -> Group:
    (t0, n0), (t1, n1) = rates[0], rates[-1]
    per_s = (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0
    head = Table.grid(padding=(0, 3))
    head.add_row(
        f"devices online [bold]{seen.get('online', 0)}[/] of {seen.get('known', 0)} seen",
        f"readings/s [bold]{per_s:,.0f}[/]",
        f"HTTP {http.sent.acknowledged:,} · MQTT {mqtt.sent.acknowledged:,} acknowledged",
    )
    lag = outputs.lag_p50()
    head.add_row(
        f"open alerts [bold]{len(seen.get('alerts', []))}[/]",
        f"models [bold]{len(outputs.keys)}[/] series",
        f"latest model version [bold]{outputs.version}[/] ({outputs.model})",
    )
    head.add_row(
        f"scored [bold]{outputs.scored:,}[/]",
        "event → score p50 " + (f"[bold]{lag / 1000:.2f} s[/]" if lag is not None else "-"),
        f"scores topic: {SCORES}",
    )
    alerts = Table(title="open alerts (newest first)", title_justify="left")
    for column in ("device", "metric", "rule", "since", "seen and expected"):
        alerts.add_column(column)
    for a in seen.get("alerts", [])[:10]:
        alerts.add_row(
            str(a.get("device")),
            str(a.get("metric")),
            ", ".join(a.get("open", [])),
            str(a.get("time", ""))[11:19],
            (explanation(a) or str(a.get("reason", "")))[:70],
        )
    counts = seen.get("gateway", {})
    foot = (
        f"gateway: {counts.get('accepted', 0):,} accepted, {counts.get('rejected', 0):,} "
        f"dead-lettered · alerts topic: {ALERTS} · Ctrl-C stops everything"
    )
    return Group(head, alerts, foot)
