"""A job on the job API through SIGKILLs in a batch's writes: the revenue example
(examples/revenue.py) with three sinks (Kafka, Redis, the lake), crashed after the lake's
write and after the commit, gives every result once. (A file of its own: the test runs
for minutes, and the suite's workers take whole files.)"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import RunCli, error_line
from live_jobs import send_json, topic_values

from kappaflow.jobs.manager import JobManager
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_read import read_arrow
from kappaflow.streams.output.writer import STEPS
from kappaflow.waiting import wait_for
from test_app_jobs import (
    PATH,
    _iso,
    job_name,  # noqa: F401 (a fixture, the job's name: see its use)
    order,
    start,
    wait_totals,
)

pytestmark = pytest.mark.long

#: Where this job crashes; the counting job's test crashes the same batch writer at the
#: other steps after a write (test_count_recovery.py).
CRASH_STEPS = ["after-lake", "after-kafka"]


def test_every_step_after_a_write_is_crashed_at_by_one_of_the_two_tests() -> None:
    from test_count_recovery import CRASH_STEPS as COUNTING

    assert sorted([*CRASH_STEPS, *COUNTING]) == sorted(set(STEPS) - {"before-store"})


def test_a_job_with_three_sinks_through_crashes(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
    tmp_path: Path,
) -> None:
    topic = new_topic(partitions=2)
    first = [
        order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z"),
        order("o2", "bob", "DE", 30.0, "2026-11-23T10:00:20Z"),
        order("o2", "bob", "DE", 30.0, "2026-11-23T10:00:20Z"),
        order("o3", "cy", "FR", 7.5, "2026-11-23T10:00:40Z"),
    ]
    send_json(serving, topic, [*first, b"{not json"], key="buyer")
    record = tmp_path / "crash.json"
    jobs = JobManager(serving)
    start(cli, job_name, topic, f"{CRASH_STEPS[0]}:1", record)
    wait_totals(cli, serving, job_name, events=3, duplicates=1, dead_letters=1)
    # A batch and its re-run crash one step after another: with the serving store and
    # the lake written, then with the transaction committed (test_count_recovery.py
    # crashes the same writer inside its open transaction); the last start has no fault,
    # and runs the batch once more.
    send_json(serving, topic, [order("o5", "ada", "DE", 5.0, "2026-11-23T10:01:15Z")], key="buyer")
    steps = [*CRASH_STEPS, None]
    for step, following in itertools.pairwise(steps):
        wait_for(
            lambda: True if jobs.get_state(job_name) == "crashed" else None,
            timeout=180,
            what=f"the crash at {step}",
        )
        crashed = json.loads(record.read_text())
        assert (crashed["step"], crashed["output"]) == (step, "revenue")
        assert crashed["batch"] >= 1
        start(cli, job_name, topic, f"{following}:1" if following else None, record)
    later = [
        order("o6", "gus", "FR", 2.0, "2026-11-23T10:01:20Z"),
        order("o9", "eve", "DE", 20.0, "2026-11-23T10:00:50Z"),  # a correction
        order("o7", "bob", "FR", 1.0, "2026-11-23T10:07:00Z"),
    ]
    send_json(serving, topic, later, key="buyer")
    wait_totals(cli, serving, job_name, events=7)
    too_late = order("o8", "fay", "DE", 99.0, "2026-11-23T10:00:59Z")
    send_json(serving, topic, [too_late], key="buyer")
    totals = wait_totals(cli, serving, job_name, events=7, late=1)

    # Accounting: every record read is passed, dropped as a duplicate, late or dead.
    counted = (totals["events"], totals["duplicates"], totals["late"], totals["dead_letters"])
    assert counted == (7, 1, 1, 1)
    assert totals["events_read"] == 10 == sum(counted)

    # Redis holds each window's final values, computed here without the engine.
    store = redis.Redis.from_url(serving.redis.effective_url)
    held = {
        (json.loads(key.decode().rsplit(":w:", 1)[1])[0], int(start)): json.loads(value)
        for key in store.scan_iter(f"kf:{job_name}:revenue:w:*")
        for start, value in store.hgetall(key).items()
    }
    minute = 1_795_428_000_000  # 2026-11-23T10:00:00Z
    totals_by_window = {k: v["values"]["total"] for k, v in held.items()}
    assert totals_by_window == {
        ("DE", minute): 60.0,
        ("DE", minute + 60_000): 5.0,
        ("FR", minute): 7.5,
        ("FR", minute + 60_000): 2.0,
        ("FR", minute + 420_000): 1.0,
    }
    assert held[("DE", minute)]["values"]["buyers"] == 3

    # The changelog: no change published twice or lost, each after the one before.
    changes = topic_values(serving, f"{job_name}.revenue")
    identities = [(c["country"], c["window_start"], c["version"]) for c in changes]
    assert len(identities) == len(set(identities)), "a change was published twice"
    history: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for change in changes:
        history[(change["country"], change["window_start"])].append(change)
    for versions in history.values():
        assert [c["version"] for c in versions] == list(range(1, len(versions) + 1))
        for before, after in itertools.pairwise(versions):
            assert after["previous"] == before["values"]
    assert {k: v[-1]["values"]["total"] for k, v in history.items()} == {
        (country, _iso(start)): total for (country, start), total in totals_by_window.items()
    }

    # The lake holds each change once, as the changelog does.
    lake = read_arrow(f"{serving.lake_root}/{job_name}/revenue").to_pylist()
    rows = [(r["country"], r["version"], r["kind"], r["total"]) for r in lake]
    assert sorted(rows) == sorted(
        (c["country"], c["version"], c["kind"], c["values"]["total"]) for c in changes
    )

    [late] = topic_values(serving, f"{job_name}.late", at_least=1)
    assert json.loads(late["event"])["order_id"] == "o8"
    [dead] = topic_values(serving, f"{job_name}.dlq", at_least=1)
    assert dead["error"] == "not valid JSON"

    # A restart that changes what the output's state holds is refused, with what changed.
    check = cli(
        "jobs",
        "check",
        job_name,
        "--app",
        "jobs_under_test:revenue_by_buyer",
        "-P",
        f"topic={topic}",
        env={"PYTHONPATH": PATH},
    )
    assert "by: ['country'] -> ['buyer']" in error_line(check, "KF735", 1)
