"""The lake-orders job under the test harness; its Delta table read back by delta-rs and
DuckDB, at its latest version and at an earlier one, and compacted."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import duckdb
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import kappaflow as kf
from lake_orders import build


def order(order_id: str, country: str, amount: float, at: str) -> dict[str, Any]:
    buyer = "b" + order_id
    return {"order_id": order_id, "buyer": buyer, "country": country, "amount": amount, "at": at}


def test_orders_land_in_a_delta_table_that_other_engines_read(spark: SparkSession) -> None:
    batches = [
        [
            order("o1", "DE", 10.0, "2026-11-23T23:50:00Z"),
            order("o2", "FR", 7.5, "2026-11-23T23:55:00Z"),
        ],
        [order("o3", "DE", 5.0, "2026-11-24T00:10:00Z")],
        [order("o4", "DE", 2.5, "2026-11-24T00:20:00Z")],
    ]
    out = kf.testing.run(build, {"orders": batches}, spark=spark, name="lake-orders")
    root = str(out.lake_root / out.job / "orders")

    table = DeltaTable(root)
    assert table.metadata().partition_columns == ["date", "country"]
    con = duckdb.connect()
    con.register("orders", table.to_pyarrow_table())
    per_day = con.execute(
        "SELECT strftime(date, '%Y-%m-%d') AS day, count(*), sum(amount) FROM orders "
        "GROUP BY 1 ORDER BY 1"
    ).fetchall()
    con.close()
    assert per_day == [("2026-11-23", 2, 17.5), ("2026-11-24", 2, 7.5)]
    first = DeltaTable(root, version=0).to_pyarrow_table()
    assert sorted(first.column("order_id").to_pylist()) == ["o1", "o2"]

    before = table.version()
    # Compaction as a user runs it: `kappaflow lake optimize PATH`.
    compacted = subprocess.run(
        [sys.executable, "-m", "kappaflow", "lake", "optimize", root],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert compacted.returncode == 0, compacted.stderr
    assert DeltaTable(root).version() == before + 1  # 2026-11-24/DE had two files
    assert sorted(DeltaTable(root).to_pyarrow_table().column("order_id").to_pylist()) == [
        "o1",
        "o2",
        "o3",
        "o4",
    ]
