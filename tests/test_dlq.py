"""Dead letters redriven: ``kappaflow dlq show`` lists a job's dead letters with their
reasons, ``kappaflow dlq replay --fix`` sends them back through the job's source exactly
once (through a SIGKILL of the replay too), and the job's accounting shows them moving
from dead letters to counted. On the real broker and a real Spark session."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import REPO, RunCli, error_line
from dlq_jobs import CALLS_FILE, KILL_AT, Order, orders_per_country, passed_on
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.api.app import create_app
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.dead_letters import dead_letters, replay
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.status import outputs_status
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.settings import Settings
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.runtime import Build
from kappaflow.streams.schema import compile_schema
from kappaflow.waiting import wait_for

PATH = os.pathsep.join(
    [str(REPO / "tests" / "support"), str(REPO / "examples"), os.environ.get("PYTHONPATH", "")]
)
HOUR = "2026-11-23T10"


def order(oid: str, buyer: str, country: str, amount: Any, at: str) -> dict[str, Any]:
    return {"order_id": oid, "buyer": buyer, "country": country, "amount": amount, "at": at}


def text(value: dict[str, Any]) -> bytes:
    """A record sent as bytes (send_json keys dicts by a field; these go unkeyed)."""
    return json.dumps(value).encode()


@pytest.fixture
def run_job(spark: SparkSession, kafka: Settings) -> Iterator[Callable[[Build, str], str]]:
    """Start a job in the test's Spark session; stopped at the end of the test."""
    started: list[StreamingQuery] = []

    def run(build: Build, topic: str) -> str:
        name = f"dlq-{uuid.uuid4().hex[:8]}"
        started.extend(start_app(build, JobContext(name, {"topic": topic}, spark, kafka)))
        return name

    yield run
    for query in started:
        query.stop()


def totals(settings: Settings, job: str, output: str, **wanted: int) -> dict[str, Any]:
    """The output's accounting once it has reached ``wanted`` (each at least)."""

    def reached() -> dict[str, Any] | None:
        found: dict[str, Any] = outputs_status(settings, job).get(output, {})
        return found if all(found.get(k, 0) >= v for k, v in wanted.items()) else None

    return wait_for(reached, timeout=180, interval=0.5, what=f"{job}.{output} to reach {wanted}")


def dlq(cli: RunCli, *args: str, env: dict[str, str] | None = None) -> Any:
    return cli("dlq", *args, env={"PYTHONPATH": PATH, **(env or {})})


def get(settings: Settings, path: str) -> httpx.Response:
    """``GET path`` of the service's application, in this process."""

    async def asked() -> httpx.Response:
        transport = httpx.ASGITransport(app=create_app(settings))
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.get(path)

    return asyncio.run(asked())


def replays_in(settings: Settings, topic: str) -> list[str]:
    """The ``kf-replay-of`` header of each replayed record ``topic`` committed."""
    found = []
    for message in read_records(settings.kafka, topic, start=StartAt(beginning=True)):
        headers = dict(message.headers() or [])
        replayed = headers.get("kf-replay-of")
        if isinstance(replayed, bytes):
            found.append(replayed.decode())
    return found


@pytest.mark.long
def test_dead_letters_are_shown_fixed_replayed_and_counted_once(
    serving: Settings, kafka: Settings, new_topic: Callable[..., str], cli: RunCli, run_job: Any
) -> None:
    topic = new_topic()
    good = [
        order("o1", "ada", "DE", 10.0, f"{HOUR}:00:05Z"),
        order("o2", "bob", "FR", 5.0, f"{HOUR}:10:00Z"),
        order("o3", "cy", "DE", 2.5, f"{HOUR}:20:00Z"),
    ]
    bad = [
        text(order("o4", "dee", "DE", "12,50", f"{HOUR}:25:00Z")),  # mended by the fix
        text(order("o5", "eve", "FR", 1.0, "2026-11-23 10:30:00")),  # mended: no zone
        b"{not json",  # passed over by the fix
        text(order("o6", "fay", "DE", "lots", f"{HOUR}:40:00Z")),  # still bad
    ]
    send_json(kafka, topic, [*good, *bad], key="buyer")
    job = run_job(orders_per_country, topic)
    before = totals(kafka, job, "per_country", events=3, dead_letters=4)
    assert (before["events"], before["dead_letters"]) == (3, 4)
    assert "dead_letters_replayed" not in before

    shown = dlq(cli, "show", job, "--json")
    assert shown.code == 0, shown.err
    listed = [json.loads(line) for line in shown.lines()]
    letters = sorted(listed, key=lambda letter: letter["source_offset"])
    assert [letter["reason"] for letter in letters] == [
        "field 'amount' is not a number",
        "time field 'at' is not epoch milliseconds or ISO-8601 with a zone",
        "not valid JSON",
        "field 'amount' is not a number",
    ]
    assert [letter["value"] for letter in letters] == [b.decode() for b in bad]
    assert {letter["source_topic"] for letter in letters} == {topic}
    assert [letter["source_offset"] for letter in letters] == [3, 4, 5, 6]
    assert not any(letter["replayed"] for letter in letters)
    # The HTTP API (here its application, in this process, on the serving store) too.
    answer = get(serving, f"/v1/jobs/{job}/dead-letters?pending=true")
    assert answer.status_code == 200
    assert answer.json()["items"] == listed
    missing = get(serving, "/v1/jobs/no-such-job/dead-letters")
    assert (missing.status_code, missing.json()["code"]) == (404, "KF770")

    replayed = dlq(cli, "replay", job, "--fix", "fix_orders:fix")

    assert replayed.code == 0, replayed.err
    assert json.loads(replayed.out) == {
        "job": job,
        "read": 4,
        "replayed": 3,
        "skipped": 1,
        "unroutable": 0,
        "transactions": 1,
    }
    after = totals(kafka, job, "per_country", events=5, dead_letters_replayed=3)
    # Two dead letters moved to counted; the one still bad is a dead letter again.
    assert (after["events"], after["dead_letters"]) == (5, 5)
    assert (after["dead_letters_replayed"], after["replays_dead_again"]) == (3, 1)
    changes = topic_values(kafka, f"{job}.per_country")
    last = {c["country"]: c for c in sorted(changes, key=lambda c: c["version"])}
    assert last["DE"]["values"] == {"orders": 3, "total": 25.0}
    assert last["FR"]["values"] == {"orders": 2, "total": 6.0}
    by_value = {letter["value"]: f"{letter['partition']}:{letter['offset']}" for letter in letters}
    assert sorted(replays_in(kafka, topic)) == sorted(
        by_value[b.decode()] for b in (bad[0], bad[1], bad[3])
    )
    # Every dead letter there was is passed; the new one is not yet.
    now = dead_letters(kafka, job)
    shown_before = {(letter["partition"], letter["offset"]) for letter in letters}
    assert all(d.replayed for d in now if (d.partition, d.offset) in shown_before)
    [new] = [d for d in now if (d.partition, d.offset) not in shown_before]
    assert (new.reason, new.replayed, new.value) == (
        "field 'amount' is not a number",
        False,
        bad[3],
    )
    assert new.source_offset is not None and new.source_offset > 6
    assert new.replay_of == by_value[bad[3].decode()]


@pytest.mark.long
def test_a_replay_killed_midway_and_run_again_sends_each_dead_letter_once(
    kafka: Settings, new_topic: Callable[..., str], cli: RunCli, run_job: Any, tmp_path: Path
) -> None:
    topic = new_topic()
    good = [order(f"g{i}", "ada", "DE", 1.0, f"{HOUR}:00:0{i}Z") for i in range(2)]
    mendable = [text(order(f"m{i}", "bob", "FR", f"{i},5", f"{HOUR}:01:00Z")) for i in range(6)]
    still_bad = text(order("x1", "cy", "FR", "lots", f"{HOUR}:02:00Z"))
    send_json(kafka, topic, [*good, *mendable, still_bad], key="buyer")
    job = run_job(passed_on, topic)
    totals(kafka, job, "passed", events=2, dead_letters=7)

    calls = tmp_path / "calls"
    crash = {CALLS_FILE: str(calls), KILL_AT: "4"}
    killed = dlq(cli, "replay", job, "--fix", "dlq_jobs:crashes", "--chunk", "2", env=crash)

    # Killed at the fourth dead letter: the first transaction (two) committed, the
    # second (one sent, in the open) not.
    assert killed.code == -signal.SIGKILL, killed.err
    assert calls.read_text() == "4"
    assert sorted(d.replayed for d in dead_letters(kafka, job)) == [False] * 5 + [True] * 2
    # A fix that fails replays nothing of its transaction.
    wrong = dlq(cli, "replay", job, "--fix", "dlq_jobs:returns_text")
    assert "the fix returned str for dead letter" in error_line(wrong, "KF772", 1)
    letters = dead_letters(kafka, job)
    assert sorted(d.replayed for d in letters) == [False] * 5 + [True] * 2

    # Run again, through the job API: the rest, once.
    report = replay(kafka, job, fix=_fix())

    assert (report.read, report.replayed, report.skipped) == (5, 5, 0)
    assert sorted(replays_in(kafka, topic)) == sorted(f"{d.partition}:{d.offset}" for d in letters)
    after = totals(kafka, job, "passed", events=8, dead_letters_replayed=7)
    assert (after["events"], after["dead_letters"], after["replays_dead_again"]) == (8, 8, 1)
    passed = topic_values(kafka, f"{job}.passed", at_least=8)
    assert sorted(p["order_id"] for p in passed) == sorted(
        ["g0", "g1", *(f"m{i}" for i in range(6))]
    )
    assert sorted(p["amount"] for p in passed if p["buyer"] == "bob") == [
        0.5,
        1.5,
        2.5,
        3.5,
        4.5,
        5.5,
    ]
    # The one still bad is a dead letter again, naming the dead letter it replayed.
    seen = {(d.partition, d.offset) for d in letters}
    [again] = [d for d in dead_letters(kafka, job) if (d.partition, d.offset) not in seen]
    [x1] = [d for d in letters if d.value == still_bad]
    assert (again.replay_of, again.replayed) == (f"{x1.partition}:{x1.offset}", False)
    # Nothing is left to send twice: a replay without a fix passes only the new one.
    last = replay(kafka, job)
    assert (last.read, last.replayed) == (1, 1)
    assert sorted(replays_in(kafka, topic)) == sorted(
        f"{d.partition}:{d.offset}" for d in [*letters, again]
    )


def _fix() -> Any:
    from fix_orders import fix

    return fix


def test_misuse_is_one_line_with_a_code(kafka: Settings, cli: RunCli) -> None:
    missing = f"no-job-{uuid.uuid4().hex[:6]}"
    assert "no dead-letter topic" in error_line(dlq(cli, "show", missing), "KF770", 1)
    assert "no dead-letter topic" in error_line(dlq(cli, "replay", missing), "KF770", 1)
    unknown = dlq(cli, "replay", missing, "--fix", "no_such_module_xyz:fix")
    assert "cannot import" in error_line(unknown, "KF771", 2)
    assert "MODULE:FUNCTION" in error_line(
        dlq(cli, "replay", missing, "--fix", "fix_orders"), "KF771", 2
    )
    no_function = dlq(cli, "replay", missing, "--fix", "fix_orders:nothing")
    assert "no function 'nothing'" in error_line(no_function, "KF771", 2)
    error_line(dlq(cli, "replay", missing, "--chunk", "0"), "KF001", 2)


def test_the_guide_shows_the_example_fix_as_it_is() -> None:
    """docs/dead-letters.md shows examples/fix_orders.py's function, which its test runs."""
    guide = (REPO / "docs" / "dead-letters.md").read_text()
    [shown] = guide.split("```python\n")[1:]
    example = (REPO / "examples" / "fix_orders.py").read_text()
    assert shown.split("```")[0] in example


def test_a_job_reads_its_own_replays_and_leaves_other_jobs_out(spark: SparkSession) -> None:
    """Two jobs reading one topic: a dead letter replayed for one is the other's to leave
    out, or it would count it twice (it took the record, or dead-lettered it, already)."""

    def record(offset: int, headers: list[tuple[str, bytes]]) -> tuple[Any, ...]:
        value = text(order(f"o{offset}", "ada", "DE", 1.0, f"{HOUR}:00:00Z"))
        at = datetime(2026, 11, 23, tzinfo=UTC)
        return (None, value, "orders", 0, offset, at, 0, headers)

    schema = (
        "key binary, value binary, topic string, partition int, offset long, "
        "timestamp timestamp, timestampType int, headers array<struct<key:string,value:binary>>"
    )
    raw = spark.createDataFrame(
        [
            record(0, []),
            record(1, [("kf-replay-job", b"revenue"), ("kf-replay-of", b"2:17")]),
            record(2, [("kf-replay-job", b"other"), ("kf-replay-of", b"0:3")]),
            record(3, [("trace", b"x")]),
        ],
        schema,
    )
    parsed = parse_records(
        raw, compile_schema(Order), time="at", keys=["buyer"], replays_of="revenue"
    )
    rows = sorted(parsed.select("_kf_offset", "_kf_replay").collect())
    assert [tuple(r) for r in rows] == [(0, None), (1, "2:17"), (3, None)]


def test_a_windowed_job_counts_replays_without_reading_its_source_twice(
    spark: SparkSession, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    """Replays are counted by the Java window operator, which sends a replayed record out
    as a replay row: each micro-batch's plan scans the source once, not once more to find
    the replays."""
    topic = new_topic()
    send_json(kafka, topic, [order("o1", "ada", "DE", 1.0, f"{HOUR}:00:05Z")], key="buyer")
    name = f"dlq-{uuid.uuid4().hex[:8]}"
    queries = start_app(orders_per_country, JobContext(name, {"topic": topic}, spark, kafka))
    try:
        [query] = queries

        def planned() -> str | None:
            # The plan of the last micro-batch (a placeholder text before the first).
            plan = str(query._jsq.explainInternal(False))
            return plan if "Scan" in plan else None

        plan = wait_for(planned, timeout=180, interval=0.5, what="a micro-batch's plan")
    finally:
        for query in queries:
            query.stop()
    assert plan.count("KafkaScan") == 1, plan
