"""A job's state read back (jobs/state_read.py) from checkpoints of either window
operator, Python's or the engine's Java one: every aggregate's values equal those the
output wrote for the same windows, sessions too, and a stateful function's state and
timers are its dataclass's and the times it set."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from window_runs import run_job

import kappaflow as kf
from kappaflow.jobs.state_read import output_plans, output_state
from kappaflow.streams.output.backends import MemoryStore

MINUTE = 60_000


@dataclass
class Order:
    buyer: str
    country: str
    amount: float
    qty: int
    at: kf.EventTime


@dataclass
class Spent:
    total: float = 0.0
    orders: int = 0


@dataclass
class Spending:
    buyer: str
    total: float


@kf.stateful(state=Spent, output=Spending)
def spending(
    key: tuple[object, ...], events: list[Order], ctx: kf.StateContext[Spent]
) -> Iterator[Spending]:
    for order in events:
        ctx.state.total += order.amount
        ctx.state.orders += 1
    ctx.timers.clear()
    ctx.timers.at(max(o.at for o in events) + timedelta(minutes=30))
    yield Spending(str(key[0]), ctx.state.total)


def build(job: kf.Job) -> None:
    orders = job.source("orders", Order, watermark="1h")
    orders.window(tumbling="1m").aggregate(
        "revenue",
        by="country",
        n=kf.count(),
        qty=kf.sum("qty"),
        total=kf.sum("amount"),
        avg=kf.mean("amount"),
        low=kf.min("qty"),
        buyers=kf.approx_distinct("buyer"),
        median=kf.approx_quantiles("amount", [0.5, 0.9]),
    ).to(kf.store())
    orders.window(session="10m").aggregate(
        "visits", by=["buyer", "country"], n=kf.count(), top=kf.max("amount")
    ).to(kf.store())
    orders.process(spending, by="buyer", name="spending").to(kf.store())


def order(buyer: str, country: str, amount: float, qty: int, at_ms: int) -> dict[str, Any]:
    return {"buyer": buyer, "country": country, "amount": amount, "qty": qty, "at": at_ms}


BATCHES = [
    [order("b1", "DE", 10.0, 2, 1_000), order("b2", "DE", 5.5, 3, 2_000)],
    [order("b1", "FR", 7.5, 1, 3_000), order("b1", "DE", 2.0, 4, MINUTE + 1_000)],
]


def run(spark: SparkSession, home: Path, engine: str) -> MemoryStore:
    store, _ = run_job(spark, home, build, "orders", "orders", BATCHES, engine, plan=True)
    return store


def state(spark: SparkSession, root: Path, output: str, **kw: Any) -> list[dict[str, Any]]:
    plans = output_plans(spark, str(root))
    return list(output_state(spark, str(root / output), output, plans[output], **kw))


@pytest.mark.parametrize("engine", ["jvm", "python"])
def test_each_kind_of_state_reads_back_as_the_job_wrote_it(
    spark: SparkSession, tmp_path: Path, engine: str
) -> None:
    store = run(spark, tmp_path, engine)
    root = tmp_path / "checkpoints"
    assert set(output_plans(spark, str(root))) == {"revenue", "visits", "spending"}

    revenue = state(spark, root, "revenue")
    written = {
        (json.loads(key)[0], start): w["values"]
        for (key, start), w in store.windows["revenue"].items()
    }
    read = {(r["key"][0], r["window_start"]): r["values"] for r in revenue}
    assert len(read) == len(written) == 3
    assert sorted(read.values(), key=json.dumps) == sorted(written.values(), key=json.dumps)
    de = next(r for r in revenue if r["key"] == ["DE"] and r["window_start"].endswith("00:00.000Z"))
    assert (de["values"]["n"], de["values"]["qty"], de["values"]["total"]) == (2, 5, 15.5)
    assert de["values"]["buyers"] == 2 and de["values"]["low"] == 2
    # An integral column's sum stays an integer, as the output wrote it.
    assert isinstance(de["values"]["qty"], int) and isinstance(de["values"]["total"], float)
    assert {r["batch"] for r in revenue} == {1} and not de["final"]

    visits = state(spark, root, "visits")
    assert {tuple(r["key"]): r["values"] for r in visits} == {
        ("b1", "DE"): {"n": 2, "top": 10.0},
        ("b2", "DE"): {"n": 1, "top": 5.5},
        ("b1", "FR"): {"n": 1, "top": 7.5},
    }
    assert {r["kind"] for r in visits} == {"session"}
    assert sorted(w["values"]["n"] for w in store.windows["visits"].values()) == [1, 1, 2]

    spent = state(spark, root, "spending", key="b1")
    assert [(r["key"], r["state"], r["timers"]) for r in spent] == [
        (["b1"], {"total": 19.5, "orders": 3}, ["1970-01-01T00:31:01.000Z"])
    ]
