"""All embedded services at once: ``kappaflow up | down | status``.

Only what the settings leave embedded is touched: with an external Kafka cluster or an
external Redis configured, that service is reported as external and never started here.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kappaflow.kafka.broker import EmbeddedBroker
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings


@dataclass(frozen=True)
class ServiceRow:
    service: str
    state: str
    address: str
    pid: int | None

    def as_dict(self) -> dict[str, object]:
        return {
            "service": self.service,
            "state": self.state,
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


def down(settings: Settings, only: Collection[str] | None = None) -> list[str]:
    """Stop every embedded service (or those named in ``only``), Redis first (jobs write
    to it), then the broker."""
    done: list[str] = []
    if settings.redis.embedded and (only is None or "redis" in only):
        stopped = EmbeddedRedis(settings).stop()
        done.append(f"redis {'stopped' if stopped else 'was not running'}")
    if settings.kafka.embedded and (only is None or "kafka" in only):
        stopped = EmbeddedBroker(settings).stop()
        done.append(f"kafka {'stopped' if stopped else 'was not running'}")
    return done


def status(settings: Settings) -> list[ServiceRow]:
    rows: list[ServiceRow] = []
    if settings.kafka.embedded:
        broker = EmbeddedBroker(settings).status()
        rows.append(ServiceRow("kafka", broker.state.value, broker.bootstrap, broker.pid))
    else:
        rows.append(ServiceRow("kafka", "external", settings.kafka.bootstrap, None))
    if settings.redis.embedded:
        store = EmbeddedRedis(settings).status()
        rows.append(ServiceRow("redis", store.state.value, store.url, store.pid))
    else:
        rows.append(ServiceRow("redis", "external", settings.redis.effective_url, None))
    return rows
