"""Revenue per country per minute in a PostgreSQL table, and each buyer's last order.

Orders as in revenue.py (JSON objects on the topic ``orders``; ``-P topic=...`` names
another). The table ``revenue_by_minute`` holds a row per country and minute, updated in
place as the minute's results change: provisional, then final, then corrected by a late
order. The table ``last_orders`` holds each buyer's latest order. Both are created on the
first batch, in the database of the settings (the embedded one: ``kappaflow postgres
start``). Run it with ``kappaflow jobs start revenue-table --app revenue_table:build``
from this folder, then ``psql postgresql://kappaflow@127.0.0.1:15432/kappaflow``.
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
        .aggregate("revenue", by="country", total=kf.sum("amount"), orders=kf.count())
    )
    revenue.to(kf.postgres(job.param("table", "revenue_by_minute")))
    orders.to(kf.postgres(job.param("last", "last_orders"), key="buyer"), name="last_orders")
