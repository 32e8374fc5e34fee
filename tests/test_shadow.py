"""Shadow runs (jobs/shadows.py, diff.py, promote.py), for real and against an oracle.

A live job counts orders and revenue per country and minute (tests/support/shadow_jobs.py)
from a stream with disorder, a duplicate, a late event within the allowed lateness and one
beyond it. A shadow with a filter changed starts from a savepoint of it, and `jobs diff`
must report exactly the windows the filter changes; it is dropped. A shadow with an
aggregate added (its state cannot take the savepoint) replays the log, and `jobs diff`
must report the aggregate as added and every window equal. The live job is then stopped
behind the shadow, and `jobs promote` makes the shadow's version the live job: the live
topic must hold each (window, key) final exactly once, with the live version's values for
the windows it made final and the new version's for the others. The refusals run in this
process, on job folders written by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
import redis
from conftest import REPO, run_kappaflow
from live_jobs import send_json, stop_if_running, topic_values, wait_job

from kappaflow.api.app import create_app
from kappaflow.errors import KappaflowError
from kappaflow.jobs import shadows
from kappaflow.jobs.diff import job_diff
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.jobs.promote import positions, promote
from kappaflow.jobs.savepoints import checkpoint_path
from kappaflow.jobs.shadow_names import rename_outputs
from kappaflow.kafka.topics import create_topic, describe_topic
from kappaflow.settings import Settings
from kappaflow.streams.sinks import lake, postgres, store
from kappaflow.streams.sinks import topic as kafka_topic

ENV = {
    "PYTHONPATH": os.pathsep.join(
        [str(REPO / "tests" / "support"), os.environ.get("PYTHONPATH", "")]
    )
}


def order(oid: str, country: str, amount: float, at: str) -> dict[str, Any]:
    return {"order_id": oid, "country": country, "amount": amount, "at": f"2026-11-23T{at}Z"}


# Before the filtered shadow's savepoint: out of order, with a duplicate; the minute 10:00
# becomes final (watermark 10:01:20).
ROUND_1 = [
    order("o1", "DE", 10.0, "10:00:05"),
    order("o2", "FR", 5.0, "10:00:20"),
    order("o3", "DE", 2.0, "10:00:40"),
    order("o1", "DE", 10.0, "10:00:05"),
    order("o4", "DE", 1.0, "10:01:10"),
    order("o5", "FR", 3.0, "10:00:50"),
    order("o6", "FR", 7.0, "10:01:30"),
]
# Late within the allowed lateness: a correction of 10:00 DE.
LATE = [order("o7", "DE", 4.0, "10:00:30")]
# Small orders in 10:01, which the filter of 3 leaves out; IT has no other.
SMALL = [
    order("o11", "DE", 2.0, "10:01:40"),
    order("o12", "FR", 1.0, "10:01:50"),
    order("o13", "IT", 1.0, "10:01:45"),
]
# 10:01 becomes final (watermark 10:02:10).
ROUND_2 = [order("o8", "DE", 6.0, "10:02:10"), order("o9", "FR", 8.0, "10:02:20")]
# While the live job is stopped: 10:02 becomes final in the shadow only (watermark 10:03:10).
ROUND_3 = [order("o14", "DE", 5.0, "10:02:40"), order("o15", "FR", 2.0, "10:03:20")]
# After the promote: an order beyond the allowed lateness (to the late topic), then 10:03
# becomes final (watermark 10:04:20).
TOO_LATE = [order("o10", "FR", 100.0, "10:00:10")]
ROUND_4 = [order("o16", "DE", 1.0, "10:04:30")]


def oracle(orders: list[dict[str, Any]], *, biggest: bool) -> dict[tuple[str, str], Any]:
    """Each (minute, country)'s final values over ``orders``, each order counted once."""
    seen: set[str] = set()
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for o in orders:
        if o["order_id"] in seen:
            continue
        seen.add(o["order_id"])
        values = found.setdefault((o["at"][11:16], o["country"]), {"n": 0, "total": 0.0})
        values["n"] += 1
        values["total"] += o["amount"]
        if biggest:
            values["biggest"] = max(values.get("biggest", 0.0), o["amount"])
    return found


def minute(field: bytes | str) -> str:
    """A window start as the store's hash holds it (epoch ms), as HH:MM, UTC."""
    text = field.decode() if isinstance(field, bytes) else field
    return datetime.fromtimestamp(int(text) / 1000, UTC).strftime("%H:%M")


def watermark_ms(at: str) -> int:
    return int(datetime.fromisoformat(f"2026-11-23T{at}+00:00").timestamp() * 1000)


def settled(settings: Settings, job: str, topic: str, watermark: str) -> None:
    """Wait until ``job``'s output has committed a batch that read all of ``topic`` under
    a watermark of at least ``watermark``: the windows it closes are in its topic."""
    ends = {
        str(p["partition"]): p["high_offset"]
        for p in describe_topic(settings.kafka, topic)["partitions"]
    }
    want = watermark_ms(watermark)

    def reached() -> bool | None:
        at = positions(checkpoint_path(settings, job)).get("revenue")
        if at is None:
            return None
        _batch, mark, read = at
        done = all(read.get(topic, {}).get(p, -1) >= end for p, end in ends.items())
        return True if done and mark >= want else None

    wait_job(settings, job, reached, what=f"{job} to settle at {watermark}", timeout=300)


def run(settings: Settings, *args: str) -> str:
    """The command's output: its data (stdout), then its messages (stderr)."""
    result = run_kappaflow(settings, *args, env=ENV, timeout=600)
    assert result.code == 0, result.err
    return result.out + result.err


def windows(records: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    found: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        found.setdefault((r["window_start"][11:16], r["country"]), []).append(r)
    return found


async def api_get(settings: Settings, path: str) -> httpx.Response:
    """A GET of the service's API, in this process."""
    transport = httpx.ASGITransport(app=create_app(settings))
    async with httpx.AsyncClient(transport=transport, base_url="http://kappaflow") as client:
        return await client.get(path)


@pytest.fixture
def live(serving: Settings) -> Iterator[tuple[str, str]]:
    name, topic = f"shd-{uuid.uuid4().hex[:8]}", f"shd-orders-{uuid.uuid4().hex[:8]}"
    create_topic(serving.kafka, topic, partitions=2)
    try:
        yield name, topic
    finally:
        stop_if_running(serving, f"{name}.shadow")
        stop_if_running(serving, name)


@pytest.mark.long
@pytest.mark.timeout(3000)
def test_shadows_are_diffed_and_one_is_promoted_exactly_once(
    serving: Settings, live: tuple[str, str]
) -> None:
    name, topic = live
    shadow = f"{name}.shadow"
    app = ("-P", f"topic={topic}")
    run(serving, "jobs", "start", name, "--app", "shadow_jobs:build", *app)
    send_json(serving, topic, ROUND_1, key="country")
    settled(serving, name, topic, "10:01:20")

    # A filter changed: from a savepoint, where the live job made 10:00 final already.
    out = run(serving, "jobs", "shadow", name, "--app", "shadow_jobs:from_three", *app)
    assert f"shadow {shadow} of job {name} running, from savepoint shadow-" in out
    for sent, mark in ((LATE, "10:01:20"), (SMALL, "10:01:20"), (ROUND_2, "10:02:10")):
        send_json(serving, topic, sent, key="country")
        settled(serving, name, topic, mark)
        settled(serving, shadow, topic, mark)
    found = json.loads(run(serving, "jobs", "diff", name, "--json").splitlines()[0])
    [revenue] = found["outputs"]
    assert revenue["aggregates"] == {"common": ["n", "total"], "added": [], "removed": []}
    # 10:00 DE: corrected alike; 10:00 FR: final before the savepoint; 10:01 DE and FR: the
    # small orders left out; 10:01 IT: only small orders.
    assert revenue["windows"] == {
        "equal": 1,
        "different": 2,
        "only_live": 1,
        "only_shadow": 0,
        "pending": 0,
        "before_shadow": 1,
    }
    assert revenue["first_difference"] == {
        "window_start": "2026-11-23T10:01:00.000Z",
        "key": ["DE"],
        "aggregates": ["n", "total"],
        "live": {"n": 2, "total": 3.0},
        "shadow": {"n": 1, "total": 1.0},
    }
    assert [d["key"] for d in revenue["sample"]] == [["DE"], ["FR"]]
    assert revenue["sample"][1]["live"] == {"n": 2, "total": 8.0}
    assert revenue["sample"][1]["shadow"] == {"n": 1, "total": 7.0}
    answer = asyncio.run(api_get(serving, f"/v1/jobs/{name}/diff"))
    assert answer.status_code == 200
    assert answer.json()["outputs"] == found["outputs"]
    run(serving, "jobs", "shadow", name, "--stop")
    assert JobManager(serving).get_state(shadow) is JobState.ABSENT

    # An aggregate added: its state cannot take the savepoint; a replay of the log.
    out = run(serving, "jobs", "shadow", name, "--app", "shadow_jobs:with_biggest", *app)
    assert "with fresh state from its sources' start" in out and "aggregates" in out
    settled(serving, shadow, topic, "10:02:10")
    [revenue] = json.loads(run(serving, "jobs", "diff", name, "--json").splitlines()[0])["outputs"]
    assert revenue["aggregates"] == {"common": ["n", "total"], "added": ["biggest"], "removed": []}
    assert revenue["windows"]["equal"] == 5
    assert sum(revenue["windows"].values()) == 5
    assert revenue["first_difference"] is None

    # The live job stops behind: 10:02 becomes final in the shadow only.
    run(serving, "jobs", "stop", name)
    send_json(serving, topic, ROUND_3, key="country")
    settled(serving, shadow, topic, "10:03:10")
    out = run(serving, "jobs", "promote", name)
    assert f"job {name} runs shadow_jobs:with_biggest" in out
    jobs = JobManager(serving)
    assert jobs.get(name).pipeline == "shadow_jobs:with_biggest"
    assert jobs.get_state(shadow) is JobState.ABSENT
    assert not (jobs.job_dir(name) / shadows.SHADOW).exists()
    send_json(serving, topic, TOO_LATE, key="country")
    send_json(serving, topic, ROUND_4, key="country")
    settled(serving, name, topic, "10:04:20")

    # The oracle: each window final once; the live version's values where it made the
    # window final, the new version's elsewhere; the order beyond the lateness nowhere.
    before = ROUND_1 + LATE + SMALL + ROUND_2
    everything = before + ROUND_3 + ROUND_4
    old, new = oracle(before, biggest=False), oracle(everything, biggest=True)
    expected = {w: v for w, v in old.items() if w[0] in ("10:00", "10:01")}
    expected |= {w: v for w, v in new.items() if w[0] in ("10:02", "10:03")}
    records = windows(topic_values(serving, f"{name}.revenue"))
    finals = {
        w: [r for r in rs if r["kind"] == "final"]
        for w, rs in records.items()
        if any(r["kind"] == "final" for r in rs)
    }
    assert sorted(finals) == sorted(expected)
    assert {w: len(rs) for w, rs in finals.items()} == dict.fromkeys(expected, 1)
    last = {
        w: [r for r in rs if r["kind"] in ("final", "correction")][-1]["values"]
        for w, rs in records.items()
        if w in finals
    }
    assert last == expected
    # The live job never made 10:02 final: its finals came from the shadow's topic.
    assert "(2 records bridged;" in out
    store = redis.Redis.from_url(serving.redis.effective_url)
    held = {
        minute(field): json.loads(value)["values"]
        for field, value in store.hgetall(f'kf:{name}:revenue:w:["DE"]').items()
    }
    # The store: the shadow's windows merged over the live job's (the new version's
    # values, biggest included), agreeing with the oracle on what both compute.
    assert held["10:02"] == {"n": 2, "total": 11.0, "biggest": 6.0}
    for at, values in held.items():
        if (at, "DE") in expected:
            assert {a: values[a] for a in ("n", "total")} == {
                a: expected[(at, "DE")][a] for a in ("n", "total")
            }


# Refusals, on job folders written by hand.


def write_job(settings: Settings, name: str, *, plan: bool = True) -> Path:
    home = JobManager(settings).job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name=name, pipeline="jobs_x:build", params={}, state=JobState.STOPPED).save(
        home / "job.json"
    )
    if plan:
        (home / "plan.json").write_text('{"outputs": []}\n')
    return home


def write_checkpoint(settings: Settings, name: str, offset: int, watermark: int) -> None:
    query = checkpoint_path(settings, name) / "revenue"
    for log in ("offsets", "commits"):
        (query / log).mkdir(parents=True)
    (query / "offsets" / "0").write_text(
        f'v1\n{{"batchWatermarkMs":{watermark}}}\n{{"orders":{{"0":{offset}}}}}\n'
    )
    (query / "commits" / "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_a_shadow_is_refused_to_a_job_without_a_plan_or_with_one(offline: Settings) -> None:
    write_job(offline, "pipe", plan=False)
    with pytest.raises(KappaflowError) as refused:
        shadows.start(offline, "pipe", "jobs_x:build", {})
    assert refused.value.code == "KF791"
    home = write_job(offline, "twice")
    (home / shadows.SHADOW).write_text('{"job": "twice.shadow"}\n')
    with pytest.raises(KappaflowError) as refused:
        shadows.start(offline, "twice", "jobs_x:build", {})
    assert refused.value.code == "KF790"


def test_diff_and_promote_need_a_shadow(offline: Settings) -> None:
    write_job(offline, "alone")
    with pytest.raises(KappaflowError) as refused:
        job_diff(offline, "alone")
    assert refused.value.code == "KF792"
    with pytest.raises(KappaflowError) as refused:
        promote(offline, "alone")
    assert refused.value.code == "KF792"


def test_a_promote_to_a_stopped_shadow_behind_the_live_job_is_refused(
    offline: Settings,
) -> None:
    home = write_job(offline, "ahead")
    write_job(offline, "ahead.shadow")
    info = {"job": "ahead.shadow", "app": "jobs_x:build", "params": {}, "started_from": {}}
    (home / shadows.SHADOW).write_text(json.dumps(info))
    write_checkpoint(offline, "ahead", offset=10, watermark=60_000)
    write_checkpoint(offline, "ahead.shadow", offset=4, watermark=60_000)
    with pytest.raises(KappaflowError) as refused:
        promote(offline, "ahead")
    assert refused.value.code == "KF793"
    assert "is stopped behind the live job" in str(refused.value)
    # Nothing was touched: no savepoint of the live job.
    assert not (home / "savepoints").exists()
    # Caught up in offsets but not in watermark: still behind.
    (checkpoint_path(offline, "ahead.shadow") / "revenue" / "offsets" / "0").write_text(
        'v1\n{"batchWatermarkMs":1000}\n{"orders":{"0":10}}\n'
    )
    with pytest.raises(KappaflowError) as refused:
        promote(offline, "ahead")
    assert refused.value.code == "KF793"


def test_a_shadow_writes_where_no_consumer_of_the_live_job_reads() -> None:
    named = SimpleNamespace(
        name="revenue",
        sinks=(
            kafka_topic(),
            kafka_topic("paid", compact=True),
            store(),
            lake("revenue"),
            lake("/data/revenue"),
            lake("s3a://bucket/revenue/"),
        ),
    )
    rename_outputs(cast(Any, SimpleNamespace(outputs=[named])))
    # Named after the job: the shadow's by its name. Named outright: renamed.
    assert named.sinks == (
        kafka_topic(),
        kafka_topic("paid.shadow", compact=True),
        store(),
        lake("revenue"),
        lake("/data/revenue.shadow"),
        lake("s3a://bucket/revenue.shadow"),
    )
    shared = SimpleNamespace(name="orders", sinks=(postgres("orders"),))
    with pytest.raises(KappaflowError) as refused:
        rename_outputs(cast(Any, SimpleNamespace(outputs=[shared])))
    assert refused.value.code == "KF791"
