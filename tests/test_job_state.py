"""Reading a job's state (`kappaflow jobs state`, jobs/state_read.py), for real.

One job (tests/support/state_jobs.py: a window of every aggregate, sessions and a
stateful function with a timer) runs on the broker and Redis. Its state is read while it
runs, and must equal what its outputs published for the same windows and keys; then from
a savepoint taken before more orders came, which must still show the state as it was.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from conftest import REPO, error_line, run_kappaflow
from live_jobs import send_json, stop_if_running, topic_values, wait_job
from service import serve

from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings

pytestmark = [pytest.mark.long, pytest.mark.timeout(1200)]

ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
    )
}


def order(
    oid: str, buyer: str, country: str, amount: float, qty: int, second: int
) -> dict[str, Any]:
    at = f"2026-11-23T10:00:{second:02d}Z"
    return {
        "order_id": oid,
        "buyer": buyer,
        "country": country,
        "amount": amount,
        "qty": qty,
        "at": at,
    }


FIRST = [
    order("o1", "b1", "DE", 10.0, 2, 1),
    order("o2", "b2", "DE", 5.0, 3, 2),
    order("o3", "b1", "FR", 7.5, 1, 3),
]
LATER = [order("o4", "b3", "DE", 1.0, 4, 4)]


@dataclass(frozen=True)
class Running:
    name: str
    topic: str


def state_rows(settings: Settings, *args: str) -> list[dict[str, Any]]:
    result = run_kappaflow(settings, "jobs", "state", *args, env=ENV, timeout=300)
    assert result.code == 0, result.err
    return [json.loads(line) for line in result.out.splitlines() if line.strip()]


def latest(settings: Settings, topic: str, field: str, at_least: int) -> dict[str, dict[str, Any]]:
    """The last record of each ``field`` value in ``topic`` (read_committed)."""
    found: dict[str, dict[str, Any]] = {}
    for record in topic_values(settings, topic, at_least=at_least):
        found[str(record[field])] = record
    return found


@pytest.fixture(scope="module")
def running(serving: Settings) -> Iterator[Running]:
    job = Running(f"st-{uuid.uuid4().hex[:8]}", f"st-orders-{uuid.uuid4().hex[:8]}")
    create_topic(serving.kafka, job.topic, partitions=1)
    result = run_kappaflow(
        serving,
        "jobs",
        "start",
        job.name,
        "--app",
        "state_jobs:build",
        "-P",
        f"topic={job.topic}",
        env=ENV,
        timeout=360,
    )
    assert result.code == 0, result.err
    try:
        send_json(serving, job.topic, FIRST, key="buyer")
        yield job
    finally:
        stop_if_running(serving, job.name)


def wait_state(settings: Settings, job: Running, output: str, check: Any) -> list[dict[str, Any]]:
    """The output's state rows once ``check`` holds for them."""
    last: list[str] = []

    def probe() -> list[dict[str, Any]] | None:
        result = run_kappaflow(settings, "jobs", "state", job.name, output, env=ENV, timeout=300)
        last[:] = [result.err if result.code else result.out]
        if result.code != 0:
            return None
        rows = [json.loads(line) for line in result.out.splitlines() if line.strip()]
        return rows if check(rows) else None

    try:
        return wait_job(settings, job.name, probe, what=f"{job.name}'s {output} state", timeout=300)
    except Exception as exc:
        raise AssertionError(f"{exc}; `jobs state` last said: {last}") from exc


def test_a_running_jobs_state_equals_what_its_outputs_published(
    serving: Settings, running: Running
) -> None:
    revenue = wait_state(
        serving,
        running,
        "revenue",
        lambda rows: {r["key"][0]: r["values"]["n"] for r in rows} == {"DE": 2, "FR": 1},
    )
    published = latest(serving, f"{running.name}.revenue", "country", at_least=2)
    assert {r["key"][0]: r["values"] for r in revenue} == {
        c: published[c]["values"] for c in ("DE", "FR")
    }
    de = next(r for r in revenue if r["key"] == ["DE"])
    assert de["values"]["total"] == 15.0 and de["values"]["qty"] == 5 and de["values"]["top"] == 3
    assert de["values"]["buyers"] == 2 and de["values"]["avg"] == 7.5
    assert (de["kind"], de["window_start"], de["window_end"]) == (
        "window",
        "2026-11-23T10:00:00.000Z",
        "2026-11-23T10:01:00.000Z",
    )
    assert de["final"] is False and de["version"] == published["DE"]["version"]

    visits = wait_state(serving, running, "visits", lambda rows: len(rows) == 2)
    sessions = {r["key"][0]: r for r in visits}
    assert {b: s["values"] for b, s in sessions.items()} == {"b1": {"n": 2}, "b2": {"n": 1}}
    assert sessions["b1"]["kind"] == "session"

    spending = wait_state(serving, running, "spending", lambda rows: len(rows) == 2)
    held = {r["key"][0]: r for r in spending}
    assert {b: r["state"] for b, r in held.items()} == {
        "b1": {"total": 17.5, "orders": 2},
        "b2": {"total": 5.0, "orders": 1},
    }
    assert held["b1"]["timers"] == ["2026-11-23T10:30:03.000Z"]
    assert held["b2"]["timers"] == ["2026-11-23T10:30:02.000Z"]


def test_one_key_or_a_savepoints_state_and_what_is_refused(
    serving: Settings, running: Running
) -> None:
    wait_state(serving, running, "revenue", lambda rows: len(rows) == 2)
    only = state_rows(serving, running.name, "revenue", "--key", "DE")
    assert [r["key"] for r in only] == [["DE"]]

    result = run_kappaflow(
        serving, "jobs", "savepoint", running.name, "--as", "two", env=ENV, timeout=360
    )
    assert result.code == 0, result.err
    send_json(serving, running.topic, LATER, key="buyer")
    wait_state(
        serving,
        running,
        "revenue",
        lambda rows: {r["key"][0]: r["values"]["n"] for r in rows} == {"DE": 3, "FR": 1},
    )
    saved = state_rows(serving, running.name, "revenue", "--at", "two", "--key", "DE")
    assert [r["values"]["n"] for r in saved] == [2]

    unknown = run_kappaflow(serving, "jobs", "state", running.name, "nope", env=ENV, timeout=300)
    assert "no output 'nope'" in error_line(unknown, "KF629", 1)
    missing = run_kappaflow(serving, "jobs", "state", "never-started", env=ENV, timeout=120)
    error_line(missing, "KF601", 1)


def test_the_service_answers_the_same_state_and_json_errors(
    serving: Settings, running: Running
) -> None:
    wait_state(serving, running, "spending", lambda rows: len(rows) >= 2)
    read = state_rows(serving, running.name, "spending", "--key", "b1")
    with serve(serving) as client:
        answer = client.get(
            f"/v1/jobs/{running.name}/state",
            params={"output": "spending", "key": "b1"},
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["items"] == read and len(read) == 1
        unknown = client.get(
            f"/v1/jobs/{running.name}/state", params={"output": "nope"}, timeout=300
        )
        assert (unknown.status_code, unknown.json()["code"]) == (404, "KF629")
        never = client.get("/v1/jobs/never-started/state", timeout=60)
        assert (never.status_code, never.json()["code"]) == (404, "KF601")
