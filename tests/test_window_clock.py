"""The engine's window operator on the executors' clock (``Windows.aggregateRealTime``),
as real-time mode runs it: a window becomes final once the clock is the delay past its
end and is forgotten the lateness after that, without any watermark moving; an event
for a window the clock has closed is late.

Run here in micro-batches, where Spark fires processing-time timers at each batch's
timestamp and keeps scheduling batches while timers are pending: the operator's logic
is the same as in a real-time batch, which checks its timers after each row."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

import kappaflow.streams.aggregates as kf
from kappaflow.streams.ops.windowing import aggregate_windows
from kappaflow.waiting import wait_for
from test_jvm_windows import _SQL, EVENTS

SIZE_MS = 1_000


def _event(shop: str, amount: int, at_ms: int, offset: int) -> dict[str, Any]:
    return {
        "shop": shop,
        "amount": amount,
        "price": float(amount),
        "user": "u",
        "id": None,
        "_kf_time": at_ms,
        "_kf_partition": 0,
        "_kf_offset": offset,
        "_kf_reason": None,
        "_kf_value": None,
    }


def _clock_rows(
    spark: SparkSession,
    tmp_path: Path,
    events: list[dict[str, Any]],
    *,
    delay_ms: int,
    lateness_ms: int,
) -> list[dict[str, Any]]:
    folder = tmp_path / "events"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(events, schema=EVENTS), folder / "part-000.parquet")
    ddl = ", ".join(f"{f.name} {_SQL[f.type]}" for f in EVENTS)
    stream = spark.readStream.schema(ddl).parquet(str(folder))
    out = aggregate_windows(
        stream,
        keys=["shop"],
        aggregates={"n": kf.count(), "total": kf.sum("amount")},
        size_ms=SIZE_MS,
        slide_ms=None,
        watermark_ms=delay_ms,
        lateness_ms=lateness_ms,
        id_column=None,
        real_time=True,
    )
    seen: list[dict[str, Any]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        seen.extend(r.asDict() for r in frame.collect())

    query = (
        out.writeStream.outputMode("update")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .foreachBatch(collect)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(
            lambda: True if sum(r["held"] for r in seen if r["kind"] == "closed") <= -2 else None,
            timeout=120,
            interval=0.1,
            what="the window to close on the clock",
        )
    finally:
        query.stop()
    return seen


def test_a_window_becomes_final_and_closes_on_the_clock_and_later_events_are_late(
    spark: SparkSession, tmp_path: Path
) -> None:
    now = int(time.time() * 1000)
    # A window that ends a second or two from now, so the clock has not passed it when the
    # first batch runs; an event from an hour ago, whose window the clock has closed.
    start = (now // SIZE_MS + 2) * SIZE_MS
    delay_ms, lateness_ms = 500, 300
    events = [
        _event("a", 3, start + 10, 0),
        _event("a", 4, start + 20, 1),
        _event("b", 5, start + 30, 2),
        _event("a", 1, now - 3_600_000, 3),
    ]
    began = time.time() * 1000
    rows = _clock_rows(spark, tmp_path, events, delay_ms=delay_ms, lateness_ms=lateness_ms)
    ended = time.time() * 1000
    assert not [r for r in rows if r["kind"] == "stats"]
    late = [r for r in rows if r["kind"] == "late"]
    assert [(r["key"], r["src_offset"]) for r in late] == [('["a"]', 3)]
    assert "too late" in late[0]["reason"]
    ours = [r for r in rows if r["window_start"] == start]
    provisional = {r["key"]: r["values"] for r in ours if r["kind"] == "provisional"}
    assert provisional == {'["a"]': '{"n":2,"total":7}', '["b"]': '{"n":1,"total":5}'}
    final = [r for r in ours if r["kind"] == "final"]
    assert sorted((r["key"], r["values"], r["version"]) for r in final) == [
        ('["a"]', '{"n":2,"total":7}', 2),
        ('["b"]', '{"n":1,"total":5}', 2),
    ]
    # Final once the clock (less the delay) passed the end; closed the lateness later.
    end = start + SIZE_MS
    assert all(r["watermark"] >= end for r in final)
    assert max(began, end + delay_ms) <= ended
    # One per group of the window (the keys are sharded), forgetting its keys.
    closed = [r for r in ours if r["kind"] == "closed"]
    assert closed and sum(r["held"] for r in closed) == -2
    assert all(r["watermark"] >= end + lateness_ms for r in closed)
    kinds = [r["kind"] for r in ours]
    assert kinds.index("final") < kinds.index("closed")
