"""Versions of one job, for the savepoint tests (tests/test_savepoints.py): as first
deployed, with a stateless change Spark takes from a savepoint, and with changes it does
not take. Not part of kappaflow; the tests put this directory on the jobs' path."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

import kappaflow as kf


@dataclass
class Order:
    order_id: str
    buyer: str
    country: str
    amount: float
    at: kf.EventTime


def _orders(job: kf.Job) -> kf.Stream:
    return job.source(job.param("topic"), Order, key="buyer", watermark="1h")


def _revenue(orders: kf.Stream, topic: str | None = None) -> None:
    per_country = orders.where(F.col("amount") > 0).window(tumbling="1m")
    revenue = per_country.aggregate("revenue", by="country", total=kf.sum("amount"), n=kf.count())
    revenue.to(kf.topic(topic), kf.store(), kf.lake("revenue"))


def build(job: kf.Job) -> None:
    """Revenue per country and minute, to Kafka, the serving store and the lake."""
    _revenue(_orders(job))


def without_fr(job: kf.Job) -> None:
    """A filter added before the window: the state holds what it held, FR is left out."""
    _revenue(_orders(job).where(F.col("country") != "FR"))


def elsewhere(job: kf.Job) -> None:
    """FR left out, and the output published to the topic ``out`` instead of its own."""
    _revenue(_orders(job).where(F.col("country") != "FR"), job.param("out"))


def by_buyer(job: kf.Job) -> None:
    """The output keyed by buyer: its state no longer fits the savepoint's."""
    revenue = _orders(job).window(tumbling="1m").aggregate("revenue", by="buyer", n=kf.count())
    revenue.to(kf.topic(), kf.store(), kf.lake("revenue"))
