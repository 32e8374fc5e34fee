"""A job with state of each kind, for the state-reading tests (tests/test_job_state.py):
a window of every aggregate, sessions, and a stateful function with a timer. Not part of
kappaflow; the tests put this directory on the jobs' path."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import kappaflow as kf


@dataclass
class Order:
    order_id: str
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
    orders: int


@kf.stateful(state=Spent, output=Spending)
def spending(
    key: tuple[object, ...], events: list[Order], ctx: kf.StateContext[Spent]
) -> Iterator[Spending]:
    """Each buyer's running total; a reminder 30 minutes after their last order."""
    for order in events:
        ctx.state.total += order.amount
        ctx.state.orders += 1
    ctx.timers.clear()
    ctx.timers.at(max(o.at for o in events) + timedelta(minutes=30))
    yield Spending(str(key[0]), ctx.state.total, ctx.state.orders)


def build(job: kf.Job) -> None:
    """Revenue per country and minute (every aggregate), visits per buyer (sessions) and
    spending per buyer (a stateful function)."""
    orders = job.source(job.param("topic"), Order, key="buyer", watermark="1h")
    orders.window(tumbling="1m").aggregate(
        "revenue",
        by="country",
        n=kf.count(),
        qty=kf.sum("qty"),
        total=kf.sum("amount"),
        avg=kf.mean("amount"),
        top=kf.max("qty"),
        low=kf.min("amount"),
        buyers=kf.approx_distinct("buyer"),
        median=kf.approx_quantiles("amount", [0.5]),
    ).to(kf.topic(), kf.store())
    orders.window(session="10m").aggregate("visits", by="buyer", n=kf.count()).to(kf.topic())
    orders.process(spending, by="buyer", name="spending").to(kf.topic())
