"""Revenue per country per minute, corrected when late orders arrive.

Orders are JSON objects on the topic ``orders`` (``-P topic=...`` names another)::

    {"order_id": "o-1", "buyer": "ada", "country": "DE", "amount": 12.5,
     "at": "2026-11-23T10:00:03Z"}

Per country and minute: the total, the mean order and the number of distinct buyers. A
minute's results are provisional until the watermark (10 s behind the latest order)
passes its end, then final; an order up to 5 minutes later than that corrects them, one
later still goes to the job's late topic. An order sent twice (same ``order_id``) counts
once. Run it with ``kappaflow jobs start revenue --app revenue:build`` from this folder.
"""

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


def build(job: kf.Job) -> None:
    orders = job.source(
        job.param("topic", "orders"),
        Order,
        key="buyer",
        id="order_id",
        watermark="10s",
        allowed_lateness="5m",
    )
    revenue = (
        orders.where(F.col("amount") > 0)
        .window(tumbling="1m")
        .aggregate(
            "revenue",
            by="country",
            total=kf.sum("amount"),
            mean=kf.mean("amount"),
            buyers=kf.approx_distinct("buyer"),
            orders=kf.count(),
        )
    )
    revenue.to(kf.topic(), kf.store(), kf.lake("revenue"))
