"""Jobs on the job API that the tests start by reference: some wrong on purpose.

Not part of kappaflow; the tests put this directory on the path of the CLI and of the
jobs' drivers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import kappaflow as kf
from revenue import Order


def revenue_by_buyer(job: kf.Job) -> None:
    """The revenue example's output ``revenue`` keyed by buyer instead of country: its
    state no longer fits the example's checkpoint."""
    orders = job.source(job.param("topic", "orders"), Order, key="buyer", id="order_id")
    per_buyer = orders.window(tumbling="1m").aggregate("revenue", by="buyer", n=kf.count())
    per_buyer.to(kf.topic())


def raises(job: kf.Job) -> None:
    raise RuntimeError("the reference table is not there")


def declares_nothing(job: kf.Job) -> None:
    job.source("orders", Order)


def unknown_column(job: kf.Job) -> None:
    orders = job.source("orders", Order)
    orders.window(tumbling="1m").aggregate("x", by="region", n=kf.count()).to(kf.topic())


def redis_for_records(job: kf.Job) -> None:
    job.source("orders", Order).to(kf.store())


@dataclass
class Untyped:
    payload: dict  # type: ignore[type-arg]
    at: kf.EventTime


def schema_does_not_compile(job: kf.Job) -> None:
    job.source("orders", Untyped).to(kf.topic("out"))


@dataclass
class Tick:
    n: int
    at: kf.EventTime


@dataclass
class Passed:
    count: int = 0


def fails_once_as_if_a_worker_missed_its_start(job: kf.Job) -> None:
    """Passes ticks on; its function's first call fails as Spark does when a Python
    process it started does not connect back in time, and writes ``marker`` so that the
    next call passes."""
    marker = Path(job.param("marker"))

    @kf.stateful(state=Passed, output=Tick)
    def passing(
        key: tuple[object, ...], events: list[Tick], ctx: kf.StateContext[Passed]
    ) -> Iterator[Tick]:
        if not marker.exists():
            marker.write_text("failed once")
            raise RuntimeError("Python worker failed to connect back.")
        ctx.state.count += len(events)
        yield from events

    ticks = job.source(job.param("source"), Tick, key="n", time="at")
    ticks.process(passing, by="n", name="passed").to(kf.topic(job.param("dest")))
