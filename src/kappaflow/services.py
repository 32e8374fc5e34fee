"""All embedded services at once: ``kappaflow up | down | status``.

Only what the settings leave embedded is touched: with an external Kafka cluster or an
external Redis configured, that service is reported as external and never started here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, Literal

from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.procs import ProcState
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings

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
    """Start every embedded service that is not running; say what was done."""
    done: list[str] = []
    if settings.kafka.embedded:
        broker = EmbeddedBroker(settings)
        started = broker.start()
        done.append(f"kafka {'started' if started else 'already running'} on {broker.bootstrap}")
    if settings.redis.embedded:
        store = EmbeddedRedis(settings)
        started = store.start()
        done.append(f"redis {'started' if started else 'already running'} on {store.url}")
    return done


def down(settings: Settings) -> list[str]:
    """Stop every embedded service, Redis first (jobs write to it), then the broker."""
    done: list[str] = []
    if settings.redis.embedded:
        stopped = EmbeddedRedis(settings).stop()
        done.append(f"redis {'stopped' if stopped else 'was not running'}")
    if settings.kafka.embedded:
        stopped = EmbeddedBroker(settings).stop()
        done.append(f"kafka {'stopped' if stopped else 'was not running'}")
    return done


@contextmanager
def embedded_services(settings: Settings, say: Callable[[str], None]) -> Iterator[None]:
    """Start the embedded broker and Redis where they do not run, for the ``with`` block;
    then stop only those it started. A service that ran before keeps running."""
    started: list[EmbeddedBroker | EmbeddedRedis] = []
    try:
        if settings.kafka.embedded:
            broker = EmbeddedBroker(settings)
            if broker.start():
                started.append(broker)
                say(f"kafka started on {broker.bootstrap}")
        if settings.redis.embedded:
            store = EmbeddedRedis(settings)
            if store.start():
                started.append(store)
                say(f"redis started on {store.url}")
        yield
    finally:
        for service in reversed(started):
            service.stop()
            say(f"{'redis' if isinstance(service, EmbeddedRedis) else 'kafka'} stopped")


def status(settings: Settings) -> list[ServiceRow]:
    rows: list[ServiceRow] = []
    if settings.kafka.embedded:
        broker = EmbeddedBroker(settings).status()
        rows.append(ServiceRow("kafka", broker.state, broker.bootstrap, broker.pid))
    else:
        rows.append(ServiceRow("kafka", EXTERNAL, settings.kafka.bootstrap, None))
    if settings.redis.embedded:
        store = EmbeddedRedis(settings).status()
        rows.append(ServiceRow("redis", store.state, store.url, store.pid))
    else:
        rows.append(ServiceRow("redis", EXTERNAL, settings.redis.effective_url, None))
    return rows
