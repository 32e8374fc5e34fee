"""``ysb``: the Yahoo Streaming Benchmark's job on Spark Structured Streaming.

Kafka -> parse JSON -> keep views -> (ad_id, event_time) -> join ad_id to campaign_id
(the table read from Redis when the job starts, broadcast to every task) -> count per
campaign per 10-second event-time window -> Redis in the original layout, or a Kafka
topic.

Both modes run the same plan: a streaming aggregation in update mode, whose updated
windows are written as they change, each with its running count.

- ``mode=microbatch``: micro-batches back to back; each batch's updated windows are
  collected on the driver and written in one pipelined Redis round trip.
- ``mode=realtime``: Spark 4.3's real-time mode; long-running tasks emit an updated
  window for every event, and a foreach writer on the executors coalesces them and
  writes Redis every ``flush_ms`` (the original engines flush every second).

The event-time watermark (``watermark``, default 60 s) only bounds the state: in update
mode a window's count is written as it grows, never held back for the watermark.

Parameters: ``source``; ``mode`` (``microbatch`` or ``realtime``); ``sink`` (``redis``
or ``kafka``); ``dest`` (the topic, with ``sink=kafka``); ``watermark``; ``flush_ms``;
``batch`` (real-time mode's batch duration, default 30s); ``starting_offsets``
(default ``earliest``).
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kappaflow.errors import JobError
from kappaflow.kafka.topics import topic_partitions
from kappaflow.pipelines.base import JobContext, Pipeline, register
from kappaflow.spark.kafka_io import read_stream, write_stream
from kappaflow.timeutil import parse_duration
from kappaflow.ysb.store import YSB_DB, WindowWriter, ad_campaigns, connect
from kappaflow.ysb.workload import EVENT_SCHEMA, WINDOW_MS

MODES = ("microbatch", "realtime")
SINKS = ("redis", "kafka")
#: How long a real-time batch runs before Spark checkpoints and starts the next one
#: (parameter ``batch``). Every new batch launches its tasks again, which stalls output
#: for a while on a busy machine: longer batches mean fewer stalls, a longer replay
#: after a crash.
REALTIME_BATCH = "30s"


@register("ysb")
def ysb() -> Pipeline:
    return run


def run(ctx: JobContext) -> list[StreamingQuery]:
    source = ctx.param("source")
    mode = ctx.param("mode", "microbatch")
    sink = ctx.param("sink", "redis")
    if mode not in MODES:
        raise JobError(f"invalid mode {mode!r}: {' or '.join(MODES)}")
    if sink not in SINKS:
        raise JobError(f"invalid sink {sink!r}: {' or '.join(SINKS)}")
    try:
        watermark_s = parse_duration(ctx.param("watermark", "60s")).total_seconds()
        flush_ms = int(ctx.param("flush_ms", "20"))
    except ValueError as exc:
        raise JobError(f"invalid parameter: {exc}") from None
    topic_partitions(ctx.settings.kafka, source)  # fails clearly if the topic is missing
    redis_url = ctx.settings.redis.effective_url
    table = ad_campaigns(connect(redis_url))
    if not table:
        raise JobError("Redis holds no YSB ads: run the generator's setup first")
    raw = read_stream(
        ctx.spark, ctx.settings, source, starting_offsets=ctx.param("starting_offsets", "earliest")
    )
    counts = build(ctx.spark, raw, table, watermark_s)
    if sink == "kafka":
        dest = ctx.param("dest")
        writer = write_stream(as_records(counts), ctx.settings, dest)
    elif mode == "realtime":
        writer = counts.writeStream.foreach(RedisForeachWriter(redis_url, flush_ms))
    else:
        writer = counts.writeStream.foreachBatch(BatchRedisWriter(redis_url))
    writer = (
        writer.queryName(ctx.name)
        .outputMode("update")
        .option("checkpointLocation", str(ctx.checkpoint_dir / "ysb"))
    )
    if mode == "realtime":
        batch_s = parse_duration(ctx.param("batch", REALTIME_BATCH)).total_seconds()
        writer = writer.trigger(realTime=f"{batch_s} seconds")  # type: ignore[call-overload]
    else:
        writer = writer.trigger(processingTime="0 seconds")
    return [writer.start()]


def build(
    spark: SparkSession, raw: DataFrame, table: dict[str, str], watermark_s: float
) -> DataFrame:
    """(campaign_id, window_start ms, seen_count) of every window that changed."""
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select(
        "e.*"
    )
    views = events.where(F.col("event_type") == "view").select("ad_id", "event_time")
    campaigns = spark.createDataFrame(sorted(table.items()), "ad_id STRING, campaign_id STRING")
    joined = views.join(F.broadcast(campaigns), "ad_id")
    start = F.floor(F.col("event_time").cast("long") / WINDOW_MS) * WINDOW_MS
    windows = joined.select("campaign_id", F.timestamp_millis(start).alias("window")).withWatermark(
        "window", f"{int(watermark_s * 1000)} milliseconds"
    )
    return (
        windows.groupBy("campaign_id", "window")
        .agg(F.count(F.lit(1)).alias("seen_count"))
        .select(
            "campaign_id",
            F.unix_millis(F.col("window")).alias("window_start"),
            "seen_count",
        )
    )


def as_records(counts: DataFrame) -> DataFrame:
    """Kafka records keyed by campaign: ``{"campaign_id", "window_start", "window_end",
    "seen_count"}``, one per update of a window."""
    return counts.select(
        F.col("campaign_id").alias("key"),
        F.to_json(
            F.struct(
                "campaign_id",
                "window_start",
                (F.col("window_start") + WINDOW_MS).alias("window_end"),
                "seen_count",
            )
        ).alias("value"),
    )


class BatchRedisWriter:
    """foreachBatch: a micro-batch's updated windows, written from the driver."""

    def __init__(self, redis_url: str) -> None:
        self.writer = WindowWriter(connect(redis_url, YSB_DB))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.collect()
        if rows:
            self.writer.write(
                ((r["campaign_id"], r["window_start"], r["seen_count"]) for r in rows),
                time.time_ns() // 1_000_000,
            )


class RedisForeachWriter:
    """foreach for real-time mode: runs on the executors, once per partition and batch.

    Every event updates its window and Spark hands over the updated row at once; writing
    each to Redis would be a round trip per view, so rows are coalesced per window and
    flushed when ``flush_ms`` has passed since the last write, and at the batch's end.
    """

    def __init__(self, redis_url: str, flush_ms: int) -> None:
        self.redis_url = redis_url
        self.flush_ns = flush_ms * 1_000_000
        self._writer: WindowWriter | None = None
        self._pending: dict[tuple[str, int], int] = {}
        self._last = 0

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self._writer = WindowWriter(connect(self.redis_url, YSB_DB))
        self._pending = {}
        self._last = time.monotonic_ns()
        return True

    def process(self, row: Row) -> None:
        self._pending[(row["campaign_id"], row["window_start"])] = row["seen_count"]
        now = time.monotonic_ns()
        if now - self._last >= self.flush_ns:
            self._flush()
            self._last = now

    def close(self, error: Any) -> None:
        self._flush()

    def _flush(self) -> None:
        if self._pending and self._writer is not None:
            self._writer.write(
                ((c, w, n) for (c, w), n in self._pending.items()), time.time_ns() // 1_000_000
            )
            self._pending = {}
