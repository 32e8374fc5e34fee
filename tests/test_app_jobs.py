"""Jobs on the job API, for real: the revenue example (examples/revenue.py) on the
broker, Spark, Redis and the lake; removal, plans, joins, transactions that take turns and
restarts (through SIGKILLs: test_app_crashes.py).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import Producer
from conftest import REPO, RunCli, error_line
from faults import CRASH_AT, CRASH_RECORD
from live_jobs import send_json, stop_if_running, topic_values, wait_job
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.errors import KappaflowError
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.manager import JobManager
from kappaflow.jobs.status import outputs_status
from kappaflow.kafka.topics import create_topic, list_topics
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_read import read_arrow
from kappaflow.waiting import wait_for
from revenue import build as revenue

SUPPORT = REPO / "tests" / "support"
EXAMPLES = REPO / "examples"
PATH = os.pathsep.join([str(SUPPORT), str(EXAMPLES), os.environ.get("PYTHONPATH", "")])


def order(oid: str, buyer: str, country: str, amount: float, at: str) -> dict[str, Any]:
    return {"order_id": oid, "buyer": buyer, "country": country, "amount": amount, "at": at}


def status(cli: RunCli, job: str) -> dict[str, Any]:
    result = cli("jobs", "status", job, "--json")
    assert result.code == 0, result.err
    found: dict[str, Any] = json.loads(result.out)
    return found


def wait_totals(cli: RunCli, settings: Settings, job: str, **wanted: int) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        revenue = status(cli, job)["outputs"].get("revenue", {})
        return revenue if all(revenue.get(k, -1) >= v for k, v in wanted.items()) else None

    return wait_job(settings, job, reached, what=f"{job} to reach {wanted}")


@pytest.fixture
def job_name(serving: Settings) -> Iterator[str]:
    name = f"revenue-{uuid.uuid4().hex[:8]}"
    yield name
    stop_if_running(serving, name)


def start(cli: RunCli, job: str, topic: str, crash: str | None, record: Path) -> None:
    reference = ["--pipeline", "faults:REVENUE_WITH_CRASH"] if crash else ["--app", "revenue:build"]
    env = {"PYTHONPATH": PATH, CRASH_AT: crash or "", CRASH_RECORD: str(record)}
    result = cli("jobs", "start", job, *reference, "-P", f"topic={topic}", env=env)
    assert result.code == 0, result.err


@pytest.mark.long
def test_a_removed_job_begins_from_nothing(
    cli: RunCli,
    serving: Settings,
    spark: SparkSession,
    new_topic: Callable[..., str],
    job_name: str,
    tmp_path: Path,
) -> None:
    """``jobs remove`` forgets the checkpoint, the commit markers, the Redis keys, the lake
    table and the job's topics; started again (here in the test's Spark session), the job
    publishes, stores and writes its first batch anew (a marker, a stats hash or a
    manifest left behind would skip it)."""
    topic = new_topic()
    first: list[dict[str, Any] | bytes] = [
        order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z"),
        b"{not json",
    ]
    send_json(serving, topic, first, key="buyer")
    start(cli, job_name, topic, None, tmp_path / "crash.json")
    wait_totals(cli, serving, job_name, events=1, dead_letters=1)
    assert cli("jobs", "stop", job_name).code == 0
    store = redis.Redis.from_url(serving.redis.effective_url)
    lake = Path(f"{serving.lake_root}/{job_name}/revenue")
    checkpoint = Path(serving.checkpoint_location) / job_name
    owned = {f"{job_name}.{t}" for t in ("revenue", "late", "dlq", "commits")}
    assert owned <= {t["name"] for t in list_topics(serving.kafka)}
    assert list(store.scan_iter(f"kf:{job_name}:*")) and lake.is_dir() and checkpoint.is_dir()

    removed = cli("jobs", "remove", job_name)

    assert removed.code == 0, removed.err
    assert removed.err.endswith("1 lake table and 4 topics\n"), removed.err
    assert not owned & {t["name"] for t in list_topics(serving.kafka)}
    assert list(store.scan_iter(f"kf:{job_name}:*")) == []
    assert not lake.exists() and not checkpoint.exists()
    assert JobManager(serving).get_state(job_name) == "absent"
    assert "no job" in error_line(cli("jobs", "remove", job_name), "KF601", 1)

    send_json(serving, topic, [order("o2", "bob", "DE", 5.0, "2026-11-23T10:00:10Z")], key="buyer")
    queries = start_app(revenue, JobContext(job_name, {"topic": topic}, spark, serving))
    try:
        wait_for(
            lambda: topic_values(serving, f"{job_name}.revenue") or None,
            timeout=120,
            what="the first change of the job started again",
        )
    finally:
        for query in queries:
            query.stop()
    [change] = topic_values(serving, f"{job_name}.revenue")
    assert (change["version"], change["values"]["total"]) == (1, 15.0)
    assert store.hget(f"kf:{job_name}:revenue:stats", "events") == b"2"
    rows = read_arrow(str(lake)).to_pylist()
    assert [(r["version"], r["total"]) for r in rows] == [(1, 15.0)]


def _iso(millis: int) -> str:
    from kappaflow.timeutil import from_epoch_ms, iso

    return iso(from_epoch_ms(millis))


def test_check_prints_the_plan(cli: RunCli, new_topic: Callable[..., str]) -> None:
    topic = new_topic()
    result = cli(
        "jobs",
        "check",
        "--app",
        "revenue:build",
        "-P",
        f"topic={topic}",
        "--json",
        env={"PYTHONPATH": PATH},
    )
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    [source] = plan["sources"]
    assert (source["topic"], source["topic_exists"], source["id"]) == (topic, True, "order_id")
    assert (source["watermark_ms"], source["allowed_lateness_ms"]) == (10_000, 300_000)
    [output] = plan["outputs"]
    assert output["by"] == ["country"] and output["window"]["size_ms"] == 60_000
    assert [next(iter(s)) for s in output["sinks"]] == ["kafka", "redis", "parquet"]
    assert plan["restart"] == "compatible"


@dataclass
class JoinedOrder:
    order_id: str
    sku: str
    at: kf.EventTime


@dataclass
class Product:
    sku: str
    category: str


@dataclass
class Payment:
    order_id: str
    paid: float
    at: kf.EventTime


def orders_joined(job: kf.Job) -> None:
    orders = job.source(job.param("orders"), JoinedOrder, key="sku")
    products = job.table(job.param("products"), Product, key="sku")
    orders.join(products).to(kf.topic(job.param("enriched")))
    payments = job.source(job.param("payments"), Payment).select("order_id", "paid")
    paid = orders.join(payments, on="order_id", within="1m", how="inner")
    paid.select("order_id", "paid").to(kf.topic(job.param("paid")))


def test_joins_on_the_broker_see_the_table_as_it_is(
    spark: SparkSession, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    """An update of the reference table reaches the orders processed after it; two
    streams join exactly within their range."""
    orders, payments = new_topic(), new_topic()
    products = f"products-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.kafka, products, configs={"cleanup.policy": "compact"})
    topics = {out: f"{out}-{uuid.uuid4().hex[:8]}" for out in ("enriched", "paid")}
    producer = Producer(kafka.kafka.client_config())

    def put(topic: str, key: str, value: dict[str, Any] | None) -> None:
        data = None if value is None else json.dumps(value).encode()
        producer.produce(topic, key=key.encode(), value=data)
        assert producer.flush(30) == 0

    def wait_records(topic: str, n: int) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]] | None:
            values = topic_values(kafka, topic)
            return values if len(values) >= n else None

        return wait_for(
            found,
            timeout=60,
            interval=0.3,
            what=f"{n} records in {topic}",
        )

    put(products, "tea", {"sku": "tea", "category": "drinks"})
    params = {"orders": orders, "products": products, "payments": payments, **topics}
    name = f"joins-{uuid.uuid4().hex[:8]}"
    queries = start_app(orders_joined, JobContext(name, params, spark, kafka))
    try:
        put(orders, "tea", {"order_id": "o1", "sku": "tea", "at": "2026-11-23T10:00:00Z"})
        put(payments, "o1", {"order_id": "o1", "paid": 4.0, "at": "2026-11-23T10:00:30Z"})
        wait_records(topics["enriched"], 1)
        # The table changes; an order sent after it must see the new category.
        put(products, "tea", {"sku": "tea", "category": "herbal"})
        put(orders, "tea", {"order_id": "o2", "sku": "tea", "at": "2026-11-23T10:00:50Z"})
        # 70 s after o2: outside the 1-minute range, never a match.
        put(payments, "o2", {"order_id": "o2", "paid": 5.0, "at": "2026-11-23T10:02:00Z"})
        wait_records(topics["enriched"], 2)
        put(orders, "tea", {"order_id": "o3", "sku": "tea", "at": "2026-11-23T10:01:00Z"})
        put(payments, "o3", {"order_id": "o3", "paid": 6.0, "at": "2026-11-23T10:01:10Z"})
        wait_records(topics["enriched"], 3)
        # A tombstone deletes the row: an order sent after it finds no category.
        put(products, "tea", None)
        put(orders, "tea", {"order_id": "o4", "sku": "tea", "at": "2026-11-23T10:01:20Z"})
        enriched = wait_records(topics["enriched"], 4)
        paid = wait_records(topics["paid"], 2)
        # An hour behind both streams: Spark's join drops it; kappaflow reports it late.
        put(payments, "o0", {"order_id": "o0", "paid": 1.0, "at": "2026-11-23T09:00:00Z"})
        [late] = wait_records(f"{name}.late", 1)
        # The join's status counts the records of both its streams: 4 orders, 4 payments
        # (once the output's status has recorded the batch that read the late payment).
        joined = wait_for(
            lambda: (lambda o: o if o.get("late", 0) >= 1 else None)(
                outputs_status(kafka, name).get(topics["paid"], {})
            ),
            timeout=30,
            what="the join's status to record the late payment",
        )
    finally:
        for query in queries:
            query.stop()
    assert joined["events_read"] == 4 + 4
    # A null column is left out of the record.
    assert [(r["order_id"], r.get("category")) for r in enriched] == [
        ("o1", "drinks"),
        ("o2", "herbal"),
        ("o3", "herbal"),
        ("o4", None),
    ]
    assert sorted(paid, key=lambda r: r["order_id"]) == [
        {"order_id": "o1", "paid": 4.0},
        {"order_id": "o3", "paid": 6.0},
    ]
    assert (late["source_topic"], late["source_offset"], late["key"]) == (
        payments,
        3,
        {"order_id": "o0"},
    )
    assert late["reason"] == f"behind the watermark of the join of {orders!r} with {payments!r}"


def passed_on_from_latest(job: kf.Job) -> None:
    orders = job.source(job.param("orders"), JoinedOrder, key="sku", start="latest")
    orders.to(kf.topic(job.param("out")), name="passed")


def test_events_read_count_from_where_a_job_started_and_go_on_after_a_restart(
    spark: SparkSession, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    """A job that starts at the source's latest offsets has read what came after, not
    the offsets before it: through a restart, the events read equal those accounted."""
    source = new_topic(partitions=2)

    def orders(first: int, n: int) -> list[dict[str, Any]]:
        at = "2026-11-23T10:00:00Z"
        return [
            {"order_id": f"o{i}", "sku": f"s{i % 3}", "at": at} for i in range(first, first + n)
        ]

    send_json(kafka, source, orders(0, 5), key="sku")
    ctx = JobContext(
        f"latest-{uuid.uuid4().hex[:8]}", {"orders": source, "out": new_topic()}, spark, kafka
    )

    def passed(events: int) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            found = outputs_status(kafka, ctx.name).get("passed", {})
            return found if found.get("events", 0) >= events else None

        return wait_for(reached, timeout=90, interval=0.5, what=f"{events} events passed")

    def accounted(status: dict[str, Any]) -> int:
        return sum(status[k] for k in ("events", "duplicates", "late", "dead_letters"))

    [query] = start_app(passed_on_from_latest, ctx)
    try:
        # The query's first trigger fixes its start at the latest offsets.
        wait_for(lambda: query.lastProgress, timeout=90, what="the query's first trigger")
        send_json(kafka, source, orders(5, 4), key="sku")
        first = passed(4)
    finally:
        query.stop()
    assert first["events_read"] == 4 == accounted(first)
    # Sent while the job is stopped, and after it starts again: read from where it was.
    send_json(kafka, source, orders(9, 2), key="sku")
    [query] = start_app(passed_on_from_latest, ctx)
    try:
        send_json(kafka, source, orders(11, 1), key="sku")
        after = passed(7)
    finally:
        query.stop()
    assert after["events_read"] == 7 == accounted(after)


def test_a_job_whose_table_topic_is_missing_does_not_start(
    spark: SparkSession, kafka: Settings, new_topic: Callable[..., str]
) -> None:
    missing = f"products-{uuid.uuid4().hex[:8]}"
    params = {
        "orders": new_topic(),
        "products": missing,
        "payments": new_topic(),
        "enriched": "enriched",
        "paid": "paid",
    }
    with pytest.raises(KappaflowError) as raised:
        start_app(orders_joined, JobContext(f"joins-{uuid.uuid4().hex[:8]}", params, spark, kafka))
    assert raised.value.code == "KF404"
    assert f"reads topic {missing!r}, which does not exist" in str(raised.value)


def test_check_shows_the_joined_table(cli: RunCli, new_topic: Callable[..., str]) -> None:
    orders, products = new_topic(), f"products-{uuid.uuid4().hex[:8]}"
    result = cli(
        *("jobs", "check", "--app", "orders:build"),
        *("-P", f"orders={orders}", "-P", f"products={products}"),
        env={"PYTHONPATH": PATH, "COLUMNS": "200"},
    )
    assert result.code == 0, result.err
    assert f"table {products}  (topic does not exist yet): compacted topic, Product" in result.out
    assert f"joined left with table {products} on ['sku']" in result.out


@dataclass
class Tick:
    n: int
    at: kf.EventTime


def two_topic_outputs(job: kf.Job) -> None:
    ticks = job.source(job.param("source"), Tick, key="n", time="at")
    ticks.to(kf.topic(job.param("all")))
    ticks.where(F.col("n") % 2 == 0).to(kf.topic(job.param("even")))
    # Two more, so that four transactions want the producer each batch.
    ticks.where(F.col("n") % 3 == 0).to(kf.topic(job.param("all") + "-3"))
    ticks.where(F.col("n") % 5 == 0).to(kf.topic(job.param("all") + "-5"))


def test_outputs_publishing_side_by_side_take_turns_in_the_job_transactions(
    spark: SparkSession, serving: Settings
) -> None:
    """Each output's query publishes from its own thread through the job's one
    transactional producer: transactions must not overlap."""
    name = f"turns-{uuid.uuid4().hex[:8]}"
    source, every, even = (f"{name}-{part}" for part in ("in", "all", "even"))
    create_topic(serving.kafka, source, partitions=2)
    params = {"source": source, "all": every, "even": even}
    queries = start_app(two_topic_outputs, JobContext(name, params, spark, serving))
    try:
        for round_ in range(6):
            ticks = [{"n": round_ * 4000 + i, "at": 1_764_151_200_000 + i} for i in range(4000)]
            send_json(serving, source, ticks, key="n")
            wanted = (round_ + 1) * 4000

            def published(wanted: int = wanted) -> bool | None:
                failed = [q.exception() for q in queries if not q.isActive]
                assert not failed, failed
                return len(topic_values(serving, every)) >= wanted or None

            wait_for(published, timeout=120, interval=0.2, what=f"round {round_} published")
        wait_for(
            lambda: len(topic_values(serving, even)) >= 12_000 or None,
            timeout=120,
            what="the even ticks",
        )
        assert all(q.isActive for q in queries), [q.exception() for q in queries]
    finally:
        for query in queries:
            query.stop()
    assert sorted(v["n"] for v in topic_values(serving, every)) == list(range(24_000))
    assert sorted(v["n"] for v in topic_values(serving, even)) == list(range(0, 24_000, 2))


def test_a_query_that_fails_as_a_late_python_worker_does_is_restarted(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], job_name: str, tmp_path: Path
) -> None:
    source, dest = new_topic(), f"{job_name}-out"
    marker = tmp_path / "failed-once"
    reference = "jobs_under_test:fails_once_as_if_a_worker_missed_its_start"
    params = ["-P", f"source={source}", "-P", f"dest={dest}", "-P", f"marker={marker}"]
    started = cli("jobs", "start", job_name, "--app", reference, *params, env={"PYTHONPATH": PATH})
    assert started.code == 0, started.err
    try:
        ticks = [{"n": n, "at": 1_764_151_200_000 + n} for n in range(20)]
        send_json(serving, source, ticks, key="n")
        passed = wait_job(
            serving,
            job_name,
            lambda: found if len(found := topic_values(serving, dest)) >= 20 else None,
            what="every tick passed after the restart",
        )
        log = "\n".join(JobManager(serving).log_lines(job_name, 400))
    finally:
        stop_if_running(serving, job_name)
    assert marker.read_text() == "failed once"
    assert "restarting its queries from their checkpoints (1 of 3)" in log
    assert sorted(v["n"] for v in passed) == list(range(20))
