"""All embedded services at once: ``kappaflow up | down | status``.

Only what the settings leave embedded is touched: with an external Kafka cluster, Redis,
MQTT broker or PostgreSQL configured, that service is reported as external and never
started here. The embedded PostgreSQL is started by its own command (``kappaflow postgres
start``: only jobs with a ``kf.postgres()`` sink need it); ``down`` stops it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

from kappaflow.api.server import EmbeddedApi
from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.kafka.connect import ConnectWorker
from kappaflow.kafka.mirror import Mirror
from kappaflow.mqtt.broker import EmbeddedMqtt
from kappaflow.postgresql.server import EmbeddedPostgres, redacted
from kappaflow.procs import ProcState
from kappaflow.registry.service import EmbeddedRegistry
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings
from kappaflow.spark.standalone import StandaloneCluster

#: A service kappaflow does not run: configured to be reached at an address.
EXTERNAL: Final = "external"


@dataclass(frozen=True)
class ServiceRow:
    service: str
    state: ProcState | Literal["external"]
    address: str
    pid: int | None

    def as_dict(self) -> dict[str, object]:
        return {
            "service": self.service,
            "state": str(self.state),
            "address": self.address,
            "pid": self.pid,
        }


def up(settings: Settings) -> list[str]:
    """Start every embedded service that is not running, then the kappaflow service; say
    what was done."""
    done: list[str] = []
    if settings.kafka.embedded:
        broker = EmbeddedBroker(settings)
        started = broker.start()
        done.append(f"kafka {'started' if started else 'already running'} on {broker.bootstrap}")
    if settings.redis.embedded:
        store = EmbeddedRedis(settings)
        started = store.start()
        done.append(f"redis {'started' if started else 'already running'} on {store.url}")
    if settings.mqtt.embedded:
        mqtt = EmbeddedMqtt(settings)
        started = mqtt.start()
        done.append(f"mqtt {'started' if started else 'already running'} on {mqtt.url}")
    api = EmbeddedApi(settings)
    started = api.start()
    done.append(f"api {'started' if started else 'already running'} on {api.url}")
    return done


def down(settings: Settings) -> list[str]:
    """Stop the kappaflow service and every embedded service: a Spark standalone cluster
    MirrorMaker and the Kafka Connect worker where they run (`kappaflow spark start`,
    `kappaflow mirror start`, `kappaflow connect start`), the schema registry
    (`kappaflow registry start`),
    the MQTT broker (it feeds Kafka through the bridge), then Redis (jobs write to it),
    then the Kafka broker."""
    done: list[str] = []
    stopped = EmbeddedApi(settings).stop()
    done.append(f"api {'stopped' if stopped else 'was not running'}")
    # A cluster's daemons that do not run are not said: most machines run none.
    done += [line for line in StandaloneCluster(settings).stop() if line.endswith(" stopped")]
    mirror = Mirror(settings)
    if mirror.process.status().state is ProcState.RUNNING and mirror.stop():
        done.append("mirror stopped")
    # Before PostgreSQL and Kafka, which it reads and writes.
    worker = ConnectWorker(settings)
    if worker.process.status().state is ProcState.RUNNING and worker.stop():
        done.append("connect stopped")
    # Before Kafka, where it keeps its schemas.
    schemas = EmbeddedRegistry(settings)
    if schemas.process.status().state is ProcState.RUNNING and schemas.stop():
        done.append("registry stopped")
    if settings.mqtt.embedded:
        stopped = EmbeddedMqtt(settings).stop()
        done.append(f"mqtt {'stopped' if stopped else 'was not running'}")
    # Started by its own command (`kappaflow postgres start`), not by `up`: said when it ran.
    if settings.postgres.embedded and EmbeddedPostgres(settings).stop():
        done.append("postgres stopped")
    if settings.redis.embedded:
        stopped = EmbeddedRedis(settings).stop()
        done.append(f"redis {'stopped' if stopped else 'was not running'}")
    if settings.kafka.embedded:
        stopped = EmbeddedBroker(settings).stop()
        done.append(f"kafka {'stopped' if stopped else 'was not running'}")
    return done


@contextmanager
def embedded_services(settings: Settings, say: Callable[[str], None]) -> Iterator[None]:
    """Start the embedded services where they do not run, for the ``with`` block; then
    stop only those it started. A service that ran before keeps running."""
    started: list[tuple[str, EmbeddedBroker | EmbeddedRedis | EmbeddedMqtt]] = []
    try:
        if settings.kafka.embedded:
            broker = EmbeddedBroker(settings)
            if broker.start():
                started.append(("kafka", broker))
                say(f"kafka started on {broker.bootstrap}")
        if settings.redis.embedded:
            store = EmbeddedRedis(settings)
            if store.start():
                started.append(("redis", store))
                say(f"redis started on {store.url}")
        if settings.mqtt.embedded:
            mqtt = EmbeddedMqtt(settings)
            if mqtt.start():
                started.append(("mqtt", mqtt))
                say(f"mqtt started on {mqtt.url}")
        yield
    finally:
        for name, service in reversed(started):
            service.stop()
            say(f"{name} stopped")


def status(settings: Settings) -> list[ServiceRow]:
    rows: list[ServiceRow] = []
    if settings.kafka.embedded:
        nodes = EmbeddedBroker(settings).statuses()
        for node in nodes:
            name = "kafka" if len(nodes) == 1 else f"kafka-{node.node}"
            rows.append(ServiceRow(name, node.state, node.bootstrap, node.pid))
    else:
        rows.append(ServiceRow("kafka", EXTERNAL, settings.kafka.bootstrap, None))
    if settings.redis.embedded:
        store = EmbeddedRedis(settings).status()
        rows.append(ServiceRow("redis", store.state, store.url, store.pid))
    else:
        rows.append(ServiceRow("redis", EXTERNAL, settings.redis.effective_url, None))
    if settings.mqtt.embedded:
        mqtt = EmbeddedMqtt(settings).status()
        rows.append(ServiceRow("mqtt", mqtt.state, mqtt.url, mqtt.pid))
    else:
        rows.append(ServiceRow("mqtt", EXTERNAL, settings.mqtt.effective_url, None))
    api = EmbeddedApi(settings).status()
    rows.append(ServiceRow("api", api.state, api.url, api.pid))
    if settings.postgres.embedded:
        database = EmbeddedPostgres(settings).status()
        if database.state is ProcState.RUNNING:
            rows.append(ServiceRow("postgres", database.state, database.url, database.pid))
    else:
        rows.append(
            ServiceRow("postgres", EXTERNAL, redacted(settings.postgres.effective_dsn), None)
        )
    # What runs only once started by its own command: listed while it runs.
    cluster = StandaloneCluster(settings)
    for daemon in cluster.status().daemons:
        if daemon.state is ProcState.RUNNING:
            address = cluster.master_url if daemon.name == "master" else ""
            rows.append(ServiceRow(f"spark-{daemon.name}", daemon.state, address, daemon.pid))
    mirror = Mirror(settings)
    copying = mirror.process.status()
    if copying.state is ProcState.RUNNING:
        plan = mirror.plan()
        address = f"to {plan.backup}" if plan is not None else ""
        rows.append(ServiceRow("mirror", copying.state, address, copying.pid))
    worker = ConnectWorker(settings)
    capturing = worker.process.status()
    if capturing.state is ProcState.RUNNING:
        rows.append(ServiceRow("connect", capturing.state, worker.url, capturing.pid))
    if settings.registry.embedded:
        schemas = EmbeddedRegistry(settings)
        serving_schemas = schemas.process.status()
        if serving_schemas.state is ProcState.RUNNING:
            rows.append(
                ServiceRow("registry", serving_schemas.state, schemas.url, serving_schemas.pid)
            )
    else:
        rows.append(ServiceRow("registry", EXTERNAL, settings.registry.url, None))
    return rows
