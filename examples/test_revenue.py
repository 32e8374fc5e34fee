"""The revenue job under the test harness: batches in, every output checked."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from revenue import build


def order(order_id: str, buyer: str, country: str, amount: float, at: str) -> dict[str, Any]:
    return {"order_id": order_id, "buyer": buyer, "country": country, "amount": amount, "at": at}


MINUTE_0 = "2026-11-23T10:00:00.000Z"


def test_revenue_per_country_with_a_correction_and_a_late_order(spark: SparkSession) -> None:
    batches: list[list[Any]] = [
        [
            order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z"),
            order("o2", "bob", "DE", 30.0, "2026-11-23T10:00:20Z"),
            order("o2", "bob", "DE", 30.0, "2026-11-23T10:00:20Z"),  # sent twice
            order("o3", "cy", "FR", 7.5, "2026-11-23T10:00:40Z"),
            order("o4", "dee", "FR", -1.0, "2026-11-23T10:00:41Z"),  # a refund: not revenue
            "{not json",
        ],
        # 10:01:15 moves the watermark to 10:01:05, past minute 0's end...
        [order("o5", "ada", "DE", 5.0, "2026-11-23T10:01:15Z")],
        # ... so in the next batch minute 0 becomes final.
        [order("o6", "gus", "FR", 2.0, "2026-11-23T10:01:20Z")],
        # Late, but within the allowed 5 minutes: corrects minute 0.
        [order("o9", "eve", "DE", 20.0, "2026-11-23T10:00:50Z")],
        # 10:07:00 moves the watermark past 10:01 + 5 min: minute 0 is forgotten...
        [order("o7", "bob", "FR", 1.0, "2026-11-23T10:07:00Z")],
        # ... so this order for it is too late.
        [order("o8", "fay", "DE", 99.0, "2026-11-23T10:00:59Z")],
    ]
    out = kf.testing.run(build, {"orders": batches}, spark=spark, name="revenue")

    de = [
        c for c in out.changes("revenue") if c["country"] == "DE" and c["window_start"] == MINUTE_0
    ]
    assert [c["kind"] for c in de] == ["provisional", "final", "correction"]
    assert de[0]["values"]["total"] == 40.0
    assert de[0]["values"]["orders"] == 2
    assert de[0]["values"]["buyers"] == 2
    assert de[2]["previous"] == de[1]["values"]
    assert de[2]["values"]["total"] == 60.0
    assert de[2]["values"]["mean"] == 20.0
    assert de[2]["values"]["buyers"] == 3

    current = out.current("revenue")
    assert current[("DE", MINUTE_0)]["values"]["total"] == 60.0
    assert current[("FR", MINUTE_0)]["values"]["total"] == 7.5
    assert current[("DE", MINUTE_0)]["final"] is True

    [late] = out.late
    assert late["key"] == {"country": "DE"}
    assert '"o8"' in late["event"]
    [dead] = out.dead_letters
    assert dead["value"] == b"{not json"
    assert dead["source_partition"] == 0 and dead["source_offset"] == 5

    lake = out.lake("revenue")
    assert {(r["country"], r["kind"]) for r in lake} >= {("DE", "final"), ("DE", "correction")}
