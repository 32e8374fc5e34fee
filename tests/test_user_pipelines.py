"""A pipeline written against Spark with JobContext alone, as docs/jobs.md shows one:
it reads and writes Kafka through the context, and the topic it owns goes with the job."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

from conftest import RunCli
from live_jobs import send_json, stop_if_running, wait_job

from kappaflow.kafka.records import StartAt, read_records
from kappaflow.kafka.topics import list_topics
from kappaflow.settings import Settings

SUPPORT = Path(__file__).resolve().parent / "support"


def _values(settings: Settings, topic: str) -> list[str]:
    return [
        (m.value() or b"").decode()
        for m in read_records(settings.kafka, topic, start=StartAt(beginning=True))
    ]


def test_a_users_pipeline_reads_writes_and_owns_topics_through_its_context(
    cli: RunCli, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    source, dest = new_topic(), f"pages-{uuid.uuid4().hex[:8]}"
    job = f"pages-{uuid.uuid4().hex[:8]}"
    env = {"PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")])}
    params = ("-P", f"source={source}", "-P", f"dest={dest}")
    try:
        started = cli(
            "jobs", "start", job, "--pipeline", "user_pipeline:PIPELINE", *params, env=env
        )
        assert started.code == 0, started.err
        events: list[dict[str, object]] = [
            {"page": "/a", "id": 1},
            {"page": "/b", "id": 2},
            {"id": 3},
        ]
        send_json(kafka, source, events, key="id")

        def pages() -> tuple[list[str], list[str]] | None:
            found = sorted(_values(kafka, dest)), _values(kafka, f"{job}.dlq")
            return found if len(found[0]) == 2 and len(found[1]) == 1 else None

        written, dead = wait_job(kafka, job, pages, what="the pages and the dead letter")
        assert written == ["/A", "/B"]
        assert [json.loads(d) for d in dead] == [{"id": 3}]
    finally:
        stop_if_running(kafka, job)
    removed = cli("jobs", "remove", job)
    assert removed.code == 0, removed.err
    names = {t["name"] for t in list_topics(kafka.kafka)}
    # The dead-letter topic was the job's own; the destination was only written to.
    assert f"{job}.dlq" not in names
    assert dest in names
