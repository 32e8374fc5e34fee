"""Helpers for the tests that run jobs against the real broker: sending JSON records,
reading what a topic committed, and waiting for a running job to get somewhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from confluent_kafka import Producer

from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

T = TypeVar("T")


def send_json(
    settings: Settings, topic: str, values: Sequence[dict[str, Any] | bytes], *, key: str
) -> None:
    """Each value as a record: a dict as JSON keyed by its field ``key``, bytes as they
    are, without a key."""
    producer = Producer(settings.kafka.client_config())
    for value in values:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode()
        record_key = None if isinstance(value, bytes) else str(value[key]).encode()
        producer.produce(topic, key=record_key, value=raw)
    assert producer.flush(30) == 0


def topic_values(
    settings: Settings, topic: str, *, at_least: int = 0, timeout: float = 60
) -> list[dict[str, Any]]:
    """The JSON values of ``topic`` as a read_committed consumer sees them, once there
    are ``at_least`` of them: a job writes its serving store before it commits its Kafka
    transaction, so what the store shows may not be readable from the topic yet."""

    def values() -> list[dict[str, Any]]:
        return [
            json.loads(m.value() or b"{}")
            for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
        ]

    if at_least <= 0:
        return values()
    return wait_for(
        lambda: found if len(found := values()) >= at_least else None,
        timeout=timeout,
        interval=0.5,
        what=f"{at_least} records in {topic}",
    )


def wait_job(
    settings: Settings, job: str, probe: Callable[[], T | None], *, what: str, timeout: float = 180
) -> T:
    """What ``probe`` returns once it is not None; fails at once, with the end of the
    job's log, if the job failed."""
    jobs = JobManager(settings)

    def reached() -> T | None:
        if jobs.get_state(job) == "failed":
            raise AssertionError(f"{job} failed:\n" + "\n".join(jobs.log_lines(job, 30)))
        return probe()

    return wait_for(reached, timeout=timeout, interval=0.5, what=what)


def stop_if_running(settings: Settings, job: str) -> None:
    """Stop ``job`` if it still runs: a test that failed half-way leaves no driver behind."""
    jobs = JobManager(settings)
    if jobs.get_state(job) == "running":
        jobs.stop(job)
