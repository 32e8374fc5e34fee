"""Revenue per product category per minute: orders enriched from a products table.

Orders are JSON objects on the topic ``orders``::

    {"order_id": "o-1", "sku": "tea", "quantity": 3, "at": "2026-11-23T10:00:03Z"}

Products live on the compacted topic ``products``, keyed by sku, one record per change
(a null value deletes the product)::

    {"sku": "tea", "category": "drinks", "price": 4.5}

Each order takes its product's category and price as the table is when the order is
processed, so a new price applies from the next orders on. An order for a product the
table does not have counts under ``"unknown"``, with no revenue. Run it with
``kappaflow jobs start orders --app orders:build`` from this folder.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import functions as F

import kappaflow as kf


@dataclass
class Order:
    order_id: str
    sku: str
    quantity: int
    at: kf.EventTime


@dataclass
class Product:
    sku: str
    category: str
    price: float


def build(job: kf.Job) -> None:
    orders = job.source(job.param("orders", "orders"), Order, key="sku", id="order_id")
    products = job.table(job.param("products", "products"), Product, key="sku")
    enriched = (
        orders.join(products, how="left")
        .with_column("category", F.coalesce(F.col("category"), F.lit("unknown")))
        .with_column("revenue", F.coalesce(F.col("quantity") * F.col("price"), F.lit(0.0)))
    )
    per_category = enriched.window(tumbling="1m").aggregate(
        "revenue", by="category", revenue=kf.sum("revenue"), orders=kf.count()
    )
    per_category.to(kf.topic(), kf.store())
