"""The examples end to end: each job runs on the real broker, Spark and Redis (in the
test's Spark session) and gives what its test under the harness gives."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import kappaflow as kf
from alarm import build as alarm
from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.kafka.topics import create_topic
from kappaflow.serving.client import redis_prefix
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_read import read_arrow
from kappaflow.waiting import wait_for
from orders import build as orders
from test_alarm import BATCHES, alerts

pytestmark = pytest.mark.integration

Probe = Callable[[list[dict[str, Any]]], bool]


def wait_values(settings: Settings, topic: str, done: Probe, what: str) -> list[dict[str, Any]]:
    """The committed values of ``topic`` once ``done`` holds for them."""

    def found() -> list[dict[str, Any]] | None:
        values = topic_values(settings, topic)
        return values if done(values) else None

    return wait_for(found, timeout=120, interval=0.5, what=what)


@pytest.fixture
def running() -> Iterator[list[StreamingQuery]]:
    """The queries a test starts, stopped at its end whatever happened."""
    queries: list[StreamingQuery] = []
    yield queries
    for query in queries:
        query.stop()


def test_orders_take_the_table_as_it_is_into_revenue_per_category(
    spark: SparkSession,
    serving: Settings,
    new_topic: Callable[..., str],
    running: list[StreamingQuery],
) -> None:
    orders_topic = new_topic()
    products = f"products-{uuid.uuid4().hex[:8]}"
    create_topic(serving.kafka, products, configs={"cleanup.policy": "compact"})
    name = f"orders-{uuid.uuid4().hex[:8]}"
    changelog = f"{name}.revenue"

    def order(order_id: str, sku: str, quantity: int, second: int) -> dict[str, Any]:
        at = f"2026-11-23T10:00:{second:02d}Z"
        return {"order_id": order_id, "sku": sku, "quantity": quantity, "at": at}

    def latest(values: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {v["category"]: v["values"] for v in values}

    send_json(serving, products, [{"sku": "tea", "category": "drinks", "price": 4.5}], key="sku")
    params = {"orders": orders_topic, "products": products}
    running += start_app(orders, JobContext(name, params, spark, serving))
    send_json(serving, orders_topic, [order("o1", "tea", 2, 5)], key="sku")
    wait_values(serving, changelog, lambda v: "drinks" in latest(v), "tea's first revenue")
    # A new price reaches the orders after it; o1 again is a duplicate; a mug is unknown.
    send_json(serving, products, [{"sku": "tea", "category": "drinks", "price": 5.0}], key="sku")
    send_json(
        serving,
        orders_topic,
        [order("o2", "tea", 1, 20), order("o1", "tea", 2, 5), order("o3", "mug", 1, 30)],
        key="sku",
    )
    values = wait_values(
        serving, changelog, lambda v: len(latest(v)) == 2, "the unknown product's revenue"
    )
    drinks = [v for v in values if v["category"] == "drinks"]
    assert [(v["kind"], v["values"], v["previous"]) for v in drinks] == [
        ("provisional", {"revenue": 9.0, "orders": 1}, None),
        ("provisional", {"revenue": 14.0, "orders": 2}, {"revenue": 9.0, "orders": 1}),
    ]
    assert latest(values)["unknown"] == {"revenue": 0.0, "orders": 1}

    store = redis.Redis.from_url(serving.redis.effective_url, decode_responses=True)
    prefix = redis_prefix(name, "revenue")
    [held] = store.hgetall(prefix + 'w:["drinks"]').values()
    assert json.loads(held)["values"] == {"revenue": 14.0, "orders": 2}
    stats = store.hgetall(prefix + "stats")
    assert (int(stats["events"]), int(stats["duplicates"])) == (3, 1)


def test_the_alarm_on_the_broker_raises_and_resolves_as_under_the_harness(
    spark: SparkSession,
    serving: Settings,
    new_topic: Callable[..., str],
    running: list[StreamingQuery],
) -> None:
    readings = new_topic()
    name = f"alarm-{uuid.uuid4().hex[:8]}"
    topic = f"{name}.overheating"
    running += start_app(alarm, JobContext(name, {"topic": readings}, spark, serving))

    def count(n: int) -> Probe:
        return lambda values: len(values) >= n

    send_json(serving, readings, BATCHES[0], key="device")
    wait_values(serving, topic, count(1), "the first incident")
    # The batch's readings, and d2's reading that moves the watermark past d1's silence
    # after them (on another partition it could otherwise come first).
    *second, silence = BATCHES[1]
    send_json(serving, readings, second, key="device")
    wait_values(serving, topic, count(3), "the second incident")
    send_json(serving, readings, [silence], key="device")
    found = wait_values(serving, topic, count(4), "the silence's resolution")

    harness = kf.testing.run(alarm, {"readings": BATCHES}, spark=spark, name="alarm")
    assert [(a["device"], a["kind"], a["at"], a["reason"]) for a in found] == alerts(harness)
    [late] = topic_values(serving, f"{name}.late", at_least=1)
    assert late["key"] == {"device": "d1"} and late["reason"] == harness.late[0]["reason"]
    lake = read_arrow(f"{serving.lake_root}/{name}/alerts")
    assert sorted(lake.column("kind").to_pylist()) == ["raised", "raised", "resolved", "resolved"]
