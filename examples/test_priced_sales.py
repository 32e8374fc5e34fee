"""The priced-sales job under the test harness: a products table from Debezium's change
events (examples/priced_sales.py)."""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from kappaflow.testing import Record
from priced_sales import build


def change(op: str, row: dict[str, Any]) -> Record:
    before, after = (row, None) if op == "d" else (None, row)
    envelope = {"before": before, "after": after, "op": op, "ts_ms": 0, "source": {}}
    return Record(envelope, key=json.dumps({"sku": row["sku"]}))


def test_sales_are_priced_from_the_table_as_its_changes_left_it(spark: SparkSession) -> None:
    products = [
        [change("r", {"sku": "tea", "name": "Tea", "price": "4.00"})],
        [change("u", {"sku": "tea", "name": "Tea", "price": "4.50"})],
        [
            change("c", {"sku": "mug", "name": "Mug", "price": "9.00"}),
            change("d", {"sku": "mug"}),
            Record(None, key=json.dumps({"sku": "mug"})),
        ],
    ]
    sales = [
        [
            {"sale_id": "s1", "sku": "tea", "at": "2026-11-23T10:00:00Z"},
            {"sale_id": "s2", "sku": "mug", "at": "2026-11-23T10:00:01Z"},
        ]
    ]
    out = kf.testing.run(build, {"shop.public.products": products, "sales": sales}, spark=spark)
    priced = sorted(out.records("priced"), key=lambda r: str(r["sale_id"]))
    assert [(r["sale_id"], r.get("price")) for r in priced] == [("s1", "4.50"), ("s2", None)]
