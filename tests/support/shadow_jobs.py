"""Versions of one job, for the shadow tests (tests/test_shadow.py): as deployed, with an
aggregate added (its state cannot take the live job's savepoint) and with a filter
changed (it can). Not part of kappaflow; the tests put this directory on the jobs' path."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

import kappaflow as kf


@dataclass
class Order:
    order_id: str
    country: str
    amount: float
    at: kf.EventTime


def _orders(job: kf.Job) -> kf.Stream:
    return job.source(
        job.param("topic"),
        Order,
        key="country",
        id="order_id",
        watermark="10s",
        allowed_lateness="30s",
    )


def build(job: kf.Job) -> None:
    """Orders and revenue per country and minute."""
    per_minute = _orders(job).where(F.col("amount") > 0).window(tumbling="1m")
    per_minute.aggregate("revenue", by="country", n=kf.count(), total=kf.sum("amount")).to(
        kf.topic(), kf.store()
    )


def with_biggest(job: kf.Job) -> None:
    """The same, with the biggest order of each minute added."""
    per_minute = _orders(job).where(F.col("amount") > 0).window(tumbling="1m")
    per_minute.aggregate(
        "revenue", by="country", n=kf.count(), total=kf.sum("amount"), biggest=kf.max("amount")
    ).to(kf.topic(), kf.store())


def from_three(job: kf.Job) -> None:
    """Orders under 3 left out."""
    per_minute = _orders(job).where(F.col("amount") >= 3).window(tumbling="1m")
    per_minute.aggregate("revenue", by="country", n=kf.count(), total=kf.sum("amount")).to(
        kf.topic(), kf.store()
    )
