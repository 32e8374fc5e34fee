"""Session windows for real: the web sessions example (examples/web_sessions.py) on the
broker, Spark and Redis, where a late view bridges two visits and the serving store
drops the visit merged away."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import redis
from conftest import RunCli
from live_jobs import send_json, stop_if_running, topic_values, wait_job

from kappaflow.settings import Settings
from test_app_jobs import PATH, status


def view(view_id: str, visitor: str, hh_mm: str) -> dict[str, Any]:
    at = f"2026-11-23T{hh_mm}:00Z"
    return {"view_id": view_id, "visitor": visitor, "path": "/", "seconds": 1, "at": at}


def test_a_bridging_view_merges_two_visits_in_redis_and_the_changelog(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic(partitions=2)
    job = f"web-{uuid.uuid4().hex[:8]}"

    def send_and_wait(views: list[dict[str, Any]], events: int) -> None:
        send_json(serving, topic, views, key="visitor")

        def reached() -> bool | None:
            visits = status(cli, job)["outputs"].get("visits", {})
            return True if visits.get("events", 0) >= events else None

        wait_job(serving, job, reached, what=f"{job} to count {events} views")

    result = cli(
        "jobs", "start", job, "--app", "web_sessions:build", "-P", f"topic={topic}",
        env={"PYTHONPATH": PATH},
    )  # fmt: skip
    assert result.code == 0, result.err
    try:
        # Each send waits for its views to be counted, so each is a batch of its own.
        send_and_wait([view("v1", "ada", "10:00"), view("v2", "bob", "10:05")], 2)
        send_and_wait([view("v3", "ada", "10:50")], 3)
        send_and_wait([view("v4", "ada", "10:25")], 4)  # within 30 minutes of both
    finally:
        stop_if_running(serving, job)

    store = redis.Redis.from_url(serving.redis.effective_url)
    held = store.hgetall(f'kf:{job}:visits:w:["ada"]')
    ten = 1_795_428_000_000  # 2026-11-23T10:00:00Z
    assert list(held) == [str(ten).encode()]
    assert json.loads(held[str(ten).encode()])["values"]["views"] == 3
    assert json.loads(held[str(ten).encode()])["end"] == ten + 80 * 60_000  # 10:50 + 30 min

    ada = [c for c in topic_values(serving, f"{job}.visits") if c["visitor"] == "ada"]
    assert [(c["window_start"][11:16], c["kind"], c["values"]) for c in ada] == [
        ("10:00", "provisional", {"views": 1, "pages": 1, "seconds": 1}),
        ("10:50", "provisional", {"views": 1, "pages": 1, "seconds": 1}),
        # 10:50 moved the watermark to 10:49, past the first visit's end.
        ("10:00", "final", {"views": 1, "pages": 1, "seconds": 1}),
        ("10:00", "correction", {"views": 3, "pages": 1, "seconds": 3}),
        ("10:50", "correction", None),
    ]
    assert ada[4]["previous"] == ada[1]["values"]
