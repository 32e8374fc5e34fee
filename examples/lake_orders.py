"""Orders into the lake: a Delta Lake table partitioned by day and country.

Orders are JSON objects on the topic ``orders`` (``-P topic=...`` names another). Each
micro-batch becomes one version of the Delta table ``orders`` under the lake's root
(``<state_dir>/lake/<job>/orders``): Spark's tasks write the Parquet files, the driver
commits them in one Delta transaction marked with the batch id, exactly once. Run it
with ``kappaflow jobs start lake-orders --app lake_orders:build`` from this folder, then::

    kappaflow sql 'SELECT country, sum(amount) FROM "lake-orders".orders GROUP BY 1'
    kappaflow lake history lake-orders.orders
    kappaflow sql 'SELECT count(*) FROM "lake-orders".orders' --version lake-orders.orders=0
    kappaflow lake optimize lake-orders.orders

or read it with any Delta reader, such as delta-rs and DuckDB (docs/lake.md)::

    import duckdb, deltalake
    orders = deltalake.DeltaTable("<state_dir>/lake/lake-orders/orders").to_pyarrow_table()
    duckdb.sql("SELECT date, count(*) FROM orders GROUP BY 1")
"""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Order:
    order_id: str
    buyer: str
    country: str
    amount: float
    at: kf.EventTime


def build(job: kf.Job) -> None:
    orders = job.source(job.param("topic", "orders"), Order, key="buyer", id="order_id")
    orders.to(kf.lake("orders", partition_by="country", by_date="at"))
