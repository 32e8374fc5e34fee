"""Joins on the job API under the test harness: a stream with a reference table (from a
compacted topic or from Parquet) and two streams within a time range."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.cli.plan import show_plan
from kappaflow.errors import KappaflowError
from kappaflow.spark.checkpoint import batch_watermark
from kappaflow.streams.output.writer import join_watermark
from kappaflow.streams.runtime import declare, describe
from kappaflow.testing import BatchFiles


@dataclass
class Order:
    order_id: str
    buyer: str
    amount: float
    at: kf.EventTime


@dataclass
class Payment:
    order_id: str
    paid: float
    at: kf.EventTime


def paid_orders(job: kf.Job) -> None:
    orders = job.source("orders", Order, key="buyer")
    payments = job.source("payments", Payment, key="order_id").select(
        "order_id", "paid", F.col("at").alias("paid_at")
    )
    joined = orders.join(payments, on="order_id", within="10m")
    joined.select("order_id", "buyer", "paid", "paid_at").to(kf.topic("paid"))


def test_two_streams_join_within_the_range(spark: SparkSession) -> None:
    orders = [
        [
            {"order_id": "o1", "buyer": "ada", "amount": 10.0, "at": "2026-11-23T10:00:00Z"},
            {"order_id": "o2", "buyer": "bob", "amount": 20.0, "at": "2026-11-23T10:00:00Z"},
        ],
        [{"order_id": "o3", "buyer": "ada", "amount": 5.0, "at": "2026-11-23T10:30:00Z"}],
        [],
    ]
    payments = [
        [
            {"order_id": "o1", "paid": 10.0, "at": "2026-11-23T10:09:00Z"},  # within 10 min
            {"order_id": "o2", "paid": 20.0, "at": "2026-11-23T10:11:00Z"},  # too far apart
            '{"order_id": "o3"}',
        ],
        [{"order_id": "o3", "paid": 5.0, "at": "2026-11-23T10:25:00Z"}],
        [],
    ]
    out = kf.testing.run(paid_orders, {"orders": orders, "payments": payments}, spark=spark)

    # A left join: o2, whose payment came too late to match, is output once the
    # watermark passes its time + 10 minutes, with no payment (null fields are left out).
    paid = sorted(out.records("paid"), key=lambda r: r["order_id"])
    assert paid == [
        {"order_id": "o1", "buyer": "ada", "paid": 10.0, "paid_at": "2026-11-23T10:09:00.000Z"},
        {"order_id": "o2", "buyer": "bob"},
        {"order_id": "o3", "buyer": "ada", "paid": 5.0, "paid_at": "2026-11-23T10:25:00.000Z"},
    ]
    # Keyed by the left source's key: the result is the left stream's records.
    assert sorted(out.keys("paid")) == [["ada"], ["ada"], ["bob"]]
    [dead] = out.dead_letters
    assert dead["source_topic"] == "payments"
    assert dead["error"] == "missing field 'paid'"


def test_events_behind_a_stream_joins_watermark_go_to_the_late_topic(
    spark: SparkSession,
) -> None:
    orders = [
        [{"order_id": "o1", "buyer": "ada", "amount": 10.0, "at": "2026-11-23T10:00:00Z"}],
        [{"order_id": "o2", "buyer": "bob", "amount": 20.0, "at": "2026-11-23T11:00:00Z"}],
        [{"order_id": "o4", "buyer": "cy", "amount": 40.0, "at": "2026-11-23T12:00:00Z"}],
        # Behind the watermark the join judges this batch by: 11:00 less 10 s.
        [{"order_id": "o3", "buyer": "ada", "amount": 5.0, "at": "2026-11-23T10:30:00Z"}],
        [],
    ]
    payments = [
        [{"order_id": "o1", "paid": 10.0, "at": "2026-11-23T10:05:00Z"}],
        [{"order_id": "o2", "paid": 20.0, "at": "2026-11-23T11:01:00Z"}],
        [{"order_id": "o4", "paid": 40.0, "at": "2026-11-23T12:00:00Z"}],
        [
            {"order_id": "o9", "paid": 9.0, "at": "2026-11-23T10:20:00Z"},  # behind it too
            {"order_id": "o5", "paid": 5.0, "at": "2026-11-23T11:30:00Z"},  # not behind
        ],
        [],
    ]
    out = kf.testing.run(paid_orders, {"orders": orders, "payments": payments}, spark=spark)

    assert sorted(r["order_id"] for r in out.records("paid")) == ["o1", "o2", "o4"]
    late = [
        (r["source_topic"], r["source_offset"], r["key"], r["event_time"], r["watermark"])
        for r in out.late
    ]
    assert late == [
        ("orders", 3, {"order_id": "o3"}, "2026-11-23T10:30:00.000Z", "2026-11-23T10:59:50.000Z"),
        ("payments", 3, {"order_id": "o9"}, "2026-11-23T10:20:00.000Z", "2026-11-23T10:59:50.000Z"),
    ]
    assert [json.loads(r["event"])["order_id"] for r in out.late] == ["o3", "o9"]
    assert {r["reason"] for r in out.late} == {
        "behind the watermark of the join of 'orders' with 'payments'"
    }
    assert out.keys("job.late") == [["o3"], ["o9"]]
    assert out.stats("paid")["late"] == 2
    # Exactly the rows Spark's join dropped by its watermark, as its progress counts them.
    dropped = sum(
        operator["numRowsDroppedByWatermark"]
        for progress in out.progress["job.paid"]
        for operator in progress["stateOperators"]
    )
    assert dropped == 2


def test_the_watermark_a_batch_ran_with_is_read_from_its_offset_log_entry() -> None:
    entry = (
        'v1\n{"batchWatermarkMs":1795297473806,"batchTimestampMs":1795297480000,'
        '"conf":{}}\n{"orders":{"0":4}}\n'
    )
    assert batch_watermark(entry) == 1795297473806
    # An entry without the metadata line, or without a watermark: none yet, as in Spark.
    assert batch_watermark('v1\n{"batchTimestampMs":1}\n{"orders":{"0":4}}\n') == 0
    assert batch_watermark("v1\n") == 0


def test_the_join_watermark_comes_from_the_batch_before(
    spark: SparkSession, tmp_path: Path
) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    (offsets / "4").write_text('v1\n{"batchWatermarkMs":1000,"conf":{}}\n{"t":{"0":1}}\n')
    assert join_watermark(spark, str(tmp_path), 5) == 1000
    assert join_watermark(spark, str(tmp_path), 0) == 0
    # A checkpoint whose offset log lost the entry: one clear error, not a Java trace.
    with pytest.raises(KappaflowError) as caught:
        join_watermark(spark, str(tmp_path), 7)
    assert caught.value.code == "KF615"
    assert str(caught.value).startswith(f"cannot read {tmp_path}/offsets/6 for the stream join")


@dataclass
class Product:
    sku: str
    category: str
    price: float


@dataclass
class Sale:
    sku: str
    price: float
    at: kf.EventTime


def _sales(job: kf.Job) -> kf.Stream:
    return job.source("sales", Sale, key="sku")


def clash(job: kf.Job) -> None:
    _sales(job).join(job.table("products", Product, key="sku")).to(kf.topic())


def no_column(job: kf.Job) -> None:
    _sales(job).join(job.table("products", Product, key="sku"), on="category").to(kf.topic())


def outer(job: kf.Job) -> None:
    products = job.table("products", Product, key="sku").select("category")
    _sales(job).join(products, how="outer").to(kf.topic())


def no_within(job: kf.Job) -> None:
    _sales(job).join(job.source("orders", Order), on="sku").to(kf.topic())


def windows(job: kf.Job) -> None:
    sales = _sales(job)
    per_sku = sales.window(tumbling="1m").aggregate("n", by="sku", n=kf.count())
    sales.join(per_sku).to(kf.topic())  # type: ignore[arg-type]


def join_after(job: kf.Job) -> None:
    orders = job.source("orders", Order, key="buyer")
    payments = job.source("payments", Payment).select("order_id", "paid")
    joined = orders.join(payments, on="order_id", within="1m")
    refunds = job.source("refunds", Payment).select("order_id", F.col("paid").alias("back"))
    joined.join(refunds, on="order_id", within="1m").to(kf.topic())


def paid_per_buyer(job: kf.Job) -> None:
    orders = job.source("orders", Order, key="buyer")
    payments = job.source("payments", Payment).select("order_id", "paid")
    joined = orders.join(payments, on="order_id", within="10m", how="inner")
    per_hour = joined.window(tumbling="1h")
    per_hour.aggregate("paid", by="buyer", n=kf.count(), total=kf.sum("paid")).to(kf.topic())


def test_a_window_after_a_join_of_two_streams_runs_on_the_joins_watermark(
    spark: SparkSession,
) -> None:
    orders = [
        [
            {"order_id": "o1", "buyer": "ada", "amount": 10.0, "at": "2026-11-23T10:00:00Z"},
            {"order_id": "o2", "buyer": "bob", "amount": 20.0, "at": "2026-11-23T10:00:00Z"},
        ],
        [{"order_id": "o3", "buyer": "ada", "amount": 5.0, "at": "2026-11-23T10:30:00Z"}],
        [{"order_id": "o9", "buyer": "zed", "amount": 5.0, "at": "2026-11-23T13:30:00Z"}],
        [],
    ]
    payments = [
        [
            {"order_id": "o1", "paid": 10.0, "at": "2026-11-23T10:09:00Z"},
            {"order_id": "o2", "paid": 20.0, "at": "2026-11-23T10:05:00Z"},
        ],
        [{"order_id": "o3", "paid": 5.0, "at": "2026-11-23T10:25:00Z"}],
        [{"order_id": "o9", "paid": 1.0, "at": "2026-11-23T13:31:00Z"}],
        [],
    ]
    out = kf.testing.run(paid_per_buyer, {"orders": orders, "payments": payments}, spark=spark)

    changes = [
        (c["buyer"], c["window_start"][11:16], c["kind"], c["values"]) for c in out.changes("paid")
    ]
    # The join's rows are windowed as they come; once the join's watermark (its inputs'
    # watermarks, less the 10 minutes a match may be apart) passes 11:00, the 10:00
    # windows are final. 13:30 moves it there.
    assert changes == [
        ("ada", "10:00", "provisional", {"n": 1, "total": 10.0}),
        ("bob", "10:00", "provisional", {"n": 1, "total": 20.0}),
        ("ada", "10:00", "provisional", {"n": 2, "total": 15.0}),
        ("zed", "13:00", "provisional", {"n": 1, "total": 1.0}),
        ("ada", "10:00", "final", {"n": 2, "total": 15.0}),
        ("bob", "10:00", "final", {"n": 1, "total": 20.0}),
    ]
    assert out.stats("paid")["events"] == 4 and out.late == []


@dataclass
class PaidOrder:
    order_id: str
    buyer: str
    amount: float
    paid: float
    at: datetime


@dataclass
class Spent:
    buyer: str
    orders: int
    total: float


@dataclass
class Running:
    orders: int = 0
    total: float = 0.0


@kf.stateful(state=Running, output=Spent)
def spending(
    key: tuple[Any, ...], events: list[PaidOrder], ctx: kf.StateContext[Running]
) -> Iterator[Spent]:
    for event in events:
        ctx.state.orders += 1
        ctx.state.total += event.paid
        yield Spent(key[0], ctx.state.orders, ctx.state.total)


def spending_per_buyer(job: kf.Job) -> None:
    orders = job.source("orders", Order, key="buyer")
    payments = job.source("payments", Payment).select("order_id", "paid")
    joined = orders.join(payments, on="order_id", within="10m", how="inner")
    joined.process(spending, by="buyer", record=PaidOrder).to(kf.topic("spent"))


def test_a_stateful_function_after_a_join_of_two_streams(spark: SparkSession) -> None:
    orders = [
        [
            {"order_id": "o1", "buyer": "ada", "amount": 10.0, "at": "2026-11-23T10:00:00Z"},
            {"order_id": "o2", "buyer": "bob", "amount": 20.0, "at": "2026-11-23T10:00:00Z"},
        ],
        [{"order_id": "o3", "buyer": "ada", "amount": 5.0, "at": "2026-11-23T10:30:00Z"}],
    ]
    payments = [
        [{"order_id": "o1", "paid": 10.0, "at": "2026-11-23T10:09:00Z"}],
        [{"order_id": "o3", "paid": 4.0, "at": "2026-11-23T10:25:00Z"}],
    ]
    inputs = {"orders": orders, "payments": payments}
    out = kf.testing.run(spending_per_buyer, inputs, spark=spark)
    assert out.records("spent") == [
        {"buyer": "ada", "orders": 1, "total": 10.0},
        {"buyer": "ada", "orders": 2, "total": 14.0},
    ]


@pytest.mark.parametrize(
    ("build", "code", "message"),
    [
        (clash, "KF753", "both have a column 'price'"),
        (no_column, "KF752", "the stream of 'sales' has no column 'category'"),
        (outer, "KF751", "how='outer', expected 'left' or 'inner'"),
        (no_within, "KF751", "give within=..."),
        (windows, "KF751", "join(): Table is not a stream or a table from job.table()"),
        (join_after, "KF754", "a join with the stream of 'refunds' cannot follow the join"),
    ],
)
def test_a_wrong_join_is_refused_when_declared(
    spark: SparkSession, build: Any, code: str, message: str
) -> None:
    empty: list[list[Any]] = [[]]
    inputs = {
        "sales": empty,
        "products": empty,
        "orders": empty,
        "payments": empty,
        "refunds": empty,
    }
    with pytest.raises(KappaflowError) as raised:
        kf.testing.run(build, inputs, spark=spark)
    assert raised.value.code == code
    assert message in str(raised.value)


def test_a_parquet_table_renamed_and_joined_inner_and_in_the_plan(
    spark: SparkSession,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"sku": "tea", "category": "drinks", "price": 4.0},
                {"sku": "cake", "category": "food", "price": 3.0},
            ]
        ),
        catalog / "part-0.parquet",
    )

    def priced(job: kf.Job) -> None:
        products = job.table_from_lake(str(catalog), key="sku").select(
            "category", F.col("price").alias("list_price")
        )
        sales = _sales(job).join(products, how="inner")
        sales.select("sku", "category", "price", "list_price").to(kf.topic("priced"))

    sales = [
        [
            {"sku": "tea", "price": 3.5, "at": 1_700_000_000_000},
            {"sku": "mug", "price": 9.0, "at": 1_700_000_001_000},  # not in the table
        ]
    ]
    out = kf.testing.run(priced, {"sales": sales}, spark=spark)
    assert out.records("priced") == [
        {"sku": "tea", "category": "drinks", "price": 3.5, "list_price": 4.0}
    ]

    reader = BatchFiles(tmp_path / "sources")
    reader.write("sales", [[]])
    reader.write("orders", [[]])
    reader.write("payments", [[]])
    plan = describe(declare(priced, "priced", {}, spark, reader))
    assert plan["tables"] == [
        {"table": str(catalog), "kafka": False, "schema": "parquet", "key": ["sku"]}
    ]
    [output] = plan["outputs"]
    assert output["joins"] == [
        {"kind": "table", "with": str(catalog), "on": ["sku"], "how": "inner", "within_ms": None}
    ]
    both = describe(declare(paid_orders, "paid", {}, spark, reader))
    assert both["outputs"][0]["joins"][0]["within_ms"] == 600_000

    plan.update(checkpoint="/tmp/x", restart="compatible")
    for source in plan["sources"]:
        source["topic_exists"] = True
    for table in plan["tables"]:
        table["topic_exists"] = True
    monkeypatch.setenv("COLUMNS", "200")
    capsys.readouterr()
    show_plan(plan)
    text = capsys.readouterr().out
    assert f"table {catalog}: parquet, key ['sku']" in text
    assert f"output priced from sales joined inner with table {catalog} on ['sku']" in text
