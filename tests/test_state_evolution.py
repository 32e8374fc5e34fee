"""State that evolves through a savepoint (jobs/evolution.py), for real.

A job (tests/support/evolve_jobs.py) counts readings per site in 10-second windows, with
disorder and late events, and keeps a count per device in a stateful function's state.
It is saved, then started from the savepoint with a sum added to its windows and a field
with a default added to its state: the count goes on exact against an oracle across the
restart, the sum equals the oracle over the events after the savepoint, and the windows
open at the switch say their sum started at the savepoint; the device counts go on. Then
the state's new field narrowed (float to int) is refused, naming the field, and
``--reset-state`` goes through it: that output's state starts afresh while the window
counts keep theirs. The jobs run in this process, on the tests' Spark session.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis
from conftest import Result, error_line, settings_env
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession

import kappaflow.cli
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.jobs.pipeline import load_build
from kappaflow.jobs.restarts import failures, restartable
from kappaflow.jobs.restore import restore
from kappaflow.jobs.savepoints import checkpoint_path
from kappaflow.kafka.topics import create_topic
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for

# Three runs of the job, two savepoints and five checks: over a minute.
pytestmark = [pytest.mark.long, pytest.mark.timeout(900)]

#: More restarts than a job's driver makes (jobs/restarts.py): the test's three runs start
#: a stateful function's Python worker each, on a machine shared with other suites.
RESTARTS = 8

T0 = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)


def reading(rid: str, device: str, site: str, value: int, second: int) -> dict[str, Any]:
    at = (T0 + timedelta(seconds=second)).isoformat().replace("+00:00", "Z")
    return {"reading_id": rid, "device": device, "site": site, "value": value, "at": at}


# Before the savepoint: out of order; the watermark (5 s behind) ends at 20 s, so the
# windows 0-10 and 10-20 are final (correctable for a minute) and 20-30 is open.
BEFORE = [
    reading("a1", "d1", "s1", 1, 1),
    reading("a2", "d2", "s2", 2, 3),
    reading("a3", "d1", "s1", 4, 12),
    reading("a4", "d2", "s1", 8, 2),
    reading("a5", "d2", "s2", 16, 14),
    reading("a6", "d1", "s1", 32, 25),
]
# After it: the open window gets an event for a key it holds and one for a new key, a
# final window a correction, a new window its first event.
AFTER = [
    reading("b1", "d1", "s1", 3, 27),
    reading("b2", "d2", "s2", 5, 28),
    reading("b3", "d2", "s1", 7, 8),
    reading("b4", "d1", "s2", 11, 35),
]
# The watermark moves to 95 s; then an event for window 0-10, forgotten by then: late.
ONWARD = [reading("c1", "d1", "s1", 13, 100)]
TOO_LATE = [reading("c2", "d9", "s1", 1000, 5)]


@dataclass(frozen=True)
class Job:
    name: str
    topic: str

    @property
    def params(self) -> dict[str, str]:
        return {"topic": self.topic}

    def app(self, version: str) -> tuple[str, ...]:
        return ("--app", f"evolve_jobs:{version}", "-P", f"topic={self.topic}")


@pytest.fixture
def job(serving: Settings) -> Job:
    job = Job(f"ev-{uuid.uuid4().hex[:8]}", f"ev-readings-{uuid.uuid4().hex[:8]}")
    create_topic(serving.kafka, job.topic, partitions=1)
    home = JobManager(serving).job_dir(job.name)
    home.mkdir(parents=True)
    record = JobRecord(job.name, "evolve_jobs:build", job.params, state=JobState.STOPPED)
    record.save(home / "job.json")
    return job


def in_process(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: Settings,
    *args: str,
) -> Result:
    """The `kappaflow` command in this process, on the tests' Spark session."""
    for key, value in settings_env(settings).items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = kappaflow.cli.main(list(args))
    out = capsys.readouterr()
    return Result(code, out.out, out.err)


def stats(settings: Settings, job: Job) -> dict[str, int]:
    store = redis.Redis.from_url(settings.redis.effective_url)
    found = store.hgetall(f"kf:{job.name}:counts:stats")
    return {k.decode(): int(float(v)) for k, v in found.items() if k in (b"events", b"late")}


def taken(settings: Settings, job: Job, before: int) -> Callable[[], bool | None]:
    """Whether the window counts took an event (counted or late) since they had ``before``."""
    return lambda: True if sum(stats(settings, job).values()) > before else None


def run(
    spark: SparkSession,
    settings: Settings,
    job: Job,
    version: str,
    rounds: list[list[dict[str, Any]]],
    *,
    devices: dict[str, int],
) -> None:
    """Run ``version`` of the job, sending each of ``rounds`` once the one before is
    counted (each a batch of its own), until the device counts reach ``devices``. Queries
    that fail for a reason a restart cures start again from their checkpoints, as a job's
    driver starts them (jobs/restarts.py)."""
    build = load_build(f"evolve_jobs:{version}")
    context = JobContext(job.name, job.params, spark, settings)
    queries = start_app(build, context)
    restarts = 0

    def until(probe: Callable[[], bool | None], what: str) -> None:
        nonlocal queries, restarts

        def reached() -> bool | None:
            nonlocal queries, restarts
            failed = failures(queries)
            if failed and restartable(failed) and restarts < RESTARTS:
                restarts += 1
                for query in queries:
                    query.stop()
                queries = start_app(build, context)
            elif failed:
                raise AssertionError(f"{job.name} failed: {failed}")
            return probe()

        wait_for(reached, timeout=180, interval=0.5, what=what)

    try:
        for records in rounds:
            before = sum(stats(settings, job).values())
            send_json(settings, job.topic, records, key="device")
            until(taken(settings, job, before), f"{job.name} to take {records[0]['reading_id']}")

        def counted() -> bool | None:
            last = last_values(topic_values(settings, f"{job.name}.seen"), ("device",))
            found = {k[0]: v["readings"] for k, v in last.items()}
            return True if all(found.get(d) == n for d, n in devices.items()) else None

        until(counted, "the device counts")
        # Each batch committed: a savepoint's state is as of its last committed batch, and
        # a batch planned but not committed runs again after a restart, with the new code.
        for query in queries:
            query.processAllAvailable()
    finally:
        for query in queries:
            query.stop()


def last_values(records: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple[Any, ...], Any]:
    """Each key's last record (a window's: its values)."""
    found: dict[tuple[Any, ...], Any] = {}
    for r in records:
        found[tuple(r[k] for k in keys)] = r.get("values", r)
    return found


def window(second: int) -> str:
    start = T0 + timedelta(seconds=second - second % 10)
    return start.strftime("%Y-%m-%dT%H:%M:%S.000Z")


def oracle(events: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for e in events:
        second = int((datetime.fromisoformat(e["at"]) - T0).total_seconds())
        slot = found.setdefault((e["site"], window(second)), {"n": 0, "values": []})
        slot["n"] += 1
        slot["values"].append(e["value"])
    return found


def test_an_aggregate_and_a_state_field_added_through_a_savepoint(
    job: Job,
    serving: Settings,
    spark: SparkSession,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def kappaflow(*args: str) -> Result:
        return in_process(monkeypatch, capsys, serving, *args)

    run(spark, serving, job, "build", [BEFORE[:3], BEFORE[3:]], devices={"d1": 3, "d2": 3})
    saved = kappaflow("jobs", "savepoint", job.name, "--as", "before")
    assert saved.code == 0, saved.err

    checked = kappaflow(
        "jobs", "check", job.name, *job.app("with_sum"), "--from-savepoint", "before"
    )
    assert checked.code == 0, checked.err
    assert "taken: output counts: aggregate total added" in checked.out
    assert "taken: output seen: state field peak: float added" in checked.out
    assert "state of output counts: migrated" in checked.out
    assert "state of output seen: migrated" in checked.out

    restore(serving, job.name, "evolve_jobs:with_sum", job.params, "before", spark=spark)
    run(spark, serving, job, "with_sum", [AFTER, ONWARD, TOO_LATE], devices={"d1": 6, "d2": 5})
    assert stats(serving, job)["late"] == 1

    records = topic_values(serving, f"{job.name}.counts")
    last = last_values(records, ("site", "window_start"))
    counted = oracle(BEFORE + AFTER + ONWARD)
    summed = oracle(AFTER + ONWARD)
    held = set(oracle(BEFORE))
    # The count goes on exact across the restart, for every window and key.
    assert {k: v["n"] for k, v in last.items()} == {k: v["n"] for k, v in counted.items()}
    switch = window(20)  # the savepoint's watermark: 20 s
    for key, values in last.items():
        if key in summed:
            # The sum covers the events after the savepoint...
            assert values["total"] == sum(summed[key]["values"]), key
        # ... and a window its state held says its sum started there.
        if key in held and "total" in values:
            assert values["_partial_since"] == {"total": switch}, key
        else:
            assert "_partial_since" not in values, key
    # Windows only the new version saw are whole, and say nothing.
    assert ("s2", window(35)) in summed and ("s2", window(35)) not in held

    # The state's new field narrowed: refused, naming it; --reset-state goes through.
    saved = kappaflow("jobs", "savepoint", job.name, "--as", "with-sum")
    assert saved.code == 0, saved.err
    narrowed = job.app("narrowed")
    refused = kappaflow("jobs", "check", job.name, *narrowed, "--from-savepoint", "with-sum")
    line = error_line(refused, "KF622", 1)
    assert "output 'seen': state field peak: float -> int" in line
    assert "counts" not in line
    reset = ("--from-savepoint", "with-sum", "--reset-state", "seen")
    checked = kappaflow("jobs", "check", job.name, *narrowed, *reset)
    assert checked.code == 0, checked.err
    assert "state of output seen: reset" in checked.out
    assert "state of output counts: kept" in checked.out
    wrong = kappaflow(
        "jobs",
        "check",
        job.name,
        *narrowed,
        "--from-savepoint",
        "with-sum",
        "--reset-state",
        "nope",
    )
    assert "has no output 'nope'" in error_line(wrong, "KF915", 1)

    restore(
        serving,
        job.name,
        "evolve_jobs:narrowed",
        job.params,
        "with-sum",
        spark=spark,
        reset=("seen",),
    )
    root = checkpoint_path(serving, job.name)
    assert not (root / "seen").exists() and (root / "counts").is_dir()
    # The device state starts afresh from the source's start: it reads every d1 event
    # again; the window counts go on from theirs.
    more = [reading("d1", "d1", "s2", 2, 101)]
    d1 = sum(1 for e in BEFORE + AFTER + ONWARD + more if e["device"] == "d1")
    run(spark, serving, job, "narrowed", [more], devices={"d1": d1})
    last = last_values(topic_values(serving, f"{job.name}.counts"), ("site", "window_start"))
    assert last[("s2", window(101))] == {"n": 1, "total": 2}
    assert last[("s1", window(25))]["n"] == counted[("s1", window(25))]["n"]
