"""The orders job under the test harness: orders enriched from a products table."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.testing import Record
from orders import build


def order(order_id: str, sku: str, quantity: int, at: str) -> dict[str, Any]:
    return {"order_id": order_id, "sku": sku, "quantity": quantity, "at": at}


def product(sku: str, category: str, price: float) -> Record:
    return Record({"sku": sku, "category": category, "price": price}, key=sku)


def test_revenue_per_category_from_the_products_table(spark: SparkSession) -> None:
    # The harness serves a table with all its batches applied, in order: the last
    # record per key wins and a null value deletes the key.
    products = [
        [product("tea", "drinks", 4.0), product("cake", "food", 3.0)],
        [product("tea", "drinks", 4.5), product("mug", "kitchen", 9.0)],
        [Record(None, key="mug"), b"{not json"],
    ]
    orders = [
        [
            order("o1", "tea", 2, "2026-11-23T10:00:05Z"),
            order("o2", "cake", 1, "2026-11-23T10:00:10Z"),
            order("o3", "mug", 1, "2026-11-23T10:00:20Z"),  # deleted from the table
        ],
        # Moves the watermark past 10:01: minute 0 becomes final in the next batch.
        [order("o4", "tea", 1, "2026-11-23T10:01:30Z")],
        [],
    ]
    out = kf.testing.run(build, {"orders": orders, "products": products}, spark=spark)

    final = {
        c["category"]: c["values"]
        for c in out.changes("revenue")
        if c["kind"] == "final" and c["window_start"] == "2026-11-23T10:00:00.000Z"
    }
    assert final == {
        "drinks": {"revenue": 9.0, "orders": 1},
        "food": {"revenue": 3.0, "orders": 1},
        "unknown": {"revenue": 0.0, "orders": 1},
    }
    [dead] = out.dead_letters
    assert dead["source_topic"] == "products"
    assert dead["value"] == b"{not json"
