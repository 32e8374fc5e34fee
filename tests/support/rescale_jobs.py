"""The job the rescaling test (tests/test_rescale.py) runs at 4 partitions, then at 2:
revenue per country and minute, deduplicated by order id, corrected for a minute after
the watermark, to Kafka, the serving store and the lake. Not part of kappaflow; the
test puts this directory on the path."""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Order:
    order_id: str
    country: str
    amount: float
    at: kf.EventTime


def build(job: kf.Job) -> None:
    orders = job.source(
        job.param("topic"),
        Order,
        key="country",
        id="order_id",
        watermark="10s",
        allowed_lateness="1m",
    )
    revenue = orders.window(tumbling="1m").aggregate(
        "revenue", by="country", total=kf.sum("amount"), n=kf.count()
    )
    revenue.to(kf.topic(), kf.store(), kf.lake("revenue"))
