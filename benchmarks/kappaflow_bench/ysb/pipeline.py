"""``ysb``: the Yahoo Streaming Benchmark's job on Spark Structured Streaming.

Kafka -> parse JSON -> keep views -> (ad_id, event_time) -> join ad_id to campaign_id
(the table read from Redis when the job starts, a map in the plan) -> count per
campaign per 10-second event-time window -> Redis in the original layout, or a Kafka
topic.

Two ways to count (``aggregate``):

- ``batch`` (micro-batch mode with the Redis sink, the default there): as the original
  Spark job did, each micro-batch counts its own views per window and adds them to
  Redis, fenced by the batch id. Stateless: no state store to load and commit per batch.
- ``state``: Spark's streaming aggregation in update mode, its running counts in the
  state store; every window that changed is written with its running count. Real-time
  mode and the Kafka sink use this.

Modes:

- ``mode=microbatch``: micro-batches back to back; the windows a batch touched are
  collected on the driver and written in one Redis transaction.
- ``mode=realtime``: Spark 4.3's real-time mode; long-running tasks emit an updated
  window for every event. With the Redis sink they go to the topic ``<job>.windows``
  and a relay thread in the driver writes them to Redis as it polls them (relay.py
  says why not a foreach writer).

The event-time watermark (``watermark``, default 60 s) only bounds the state: in update
mode a window's count is written as it grows, never held back for the watermark.

Parameters: ``source``; ``mode`` (``microbatch`` or ``realtime``); ``sink`` (``redis``
or ``kafka``); ``dest`` (the topic, with ``sink=kafka``); ``aggregate``; ``watermark``;
``batch`` (real-time mode's batch duration, default 30s); ``starting_offsets``
(default ``earliest``).
"""

from __future__ import annotations

import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kappaflow.errors import JobError
from kappaflow.jobs.contract import JobContext, Pipeline
from kappaflow.kafka.topics import create_topic, topic_partitions
from kappaflow.spark.kafka_io import read_stream, write_stream
from kappaflow.timeutil import parse_duration
from kappaflow_bench.ysb.relay import WindowRelay
from kappaflow_bench.ysb.store import YSB_DB, WindowWriter, ad_campaigns, connect
from kappaflow_bench.ysb.workload import EVENT_SCHEMA, WINDOW_MS

MODES = ("microbatch", "realtime")
SINKS = ("redis", "kafka")
#: How long a real-time batch runs before Spark checkpoints and starts the next one
#: (parameter ``batch``). Every new batch launches its tasks again, which stalls output
#: for a while on a busy machine: longer batches mean fewer stalls, a longer replay
#: after a crash.
REALTIME_BATCH = "30s"


def run(ctx: JobContext) -> list[StreamingQuery]:
    source = ctx.param("source")
    mode = ctx.param("mode", "microbatch")
    sink = ctx.param("sink", "redis")
    if mode not in MODES:
        raise JobError(f"invalid mode {mode!r}: {' or '.join(MODES)}")
    if sink not in SINKS:
        raise JobError(f"invalid sink {sink!r}: {' or '.join(SINKS)}")
    watermark_s = parse_duration(ctx.param("watermark", "60s")).total_seconds()  # or KF501
    partitions = len(topic_partitions(ctx.settings.kafka, source))  # fails if it is missing
    redis_url = ctx.settings.redis.effective_url
    table = ad_campaigns(connect(redis_url))
    if not table:
        raise JobError("Redis holds no YSB ads: run the generator's setup first")
    raw = read_stream(
        ctx.spark, ctx.settings, source, starting_offsets=ctx.param("starting_offsets", "earliest")
    )
    aggregate = ctx.param(
        "aggregate", "batch" if (mode, sink) == ("microbatch", "redis") else "state"
    )
    if aggregate == "batch" and (mode, sink) != ("microbatch", "redis"):
        raise JobError("aggregate=batch needs mode=microbatch and sink=redis")
    if aggregate not in ("batch", "state"):
        raise JobError(f"invalid aggregate {aggregate!r}: batch or state")
    windowed = assign_windows(raw, table)
    counts = count_windows(windowed, watermark_s)
    output_mode = "update"
    if aggregate == "batch":
        writer = windowed.writeStream.foreachBatch(BatchDeltaWriter(redis_url, ctx.name))
        output_mode = "append"
    elif sink == "kafka":
        dest = ctx.param("dest")
        writer = write_stream(as_records(counts), ctx.settings, dest)
    elif mode == "realtime":
        relayed = f"{ctx.name}.windows"
        create_topic(ctx.settings.kafka, relayed, partitions=partitions, exist_ok=True)
        writer = write_stream(as_records(counts), ctx.settings, relayed)
        WindowRelay(ctx.settings.kafka, relayed, redis_url).start()
    else:
        writer = counts.writeStream.foreachBatch(BatchRedisWriter(redis_url))
    writer = (
        writer.queryName(ctx.name)
        .outputMode(output_mode)
        .option("checkpointLocation", str(ctx.checkpoint_dir / "ysb"))
    )
    if mode == "realtime":
        batch_s = parse_duration(ctx.param("batch", REALTIME_BATCH)).total_seconds()
        writer = writer.trigger(realTime=f"{batch_s} seconds")  # type: ignore[call-overload]
    else:
        writer = writer.trigger(processingTime="0 seconds")
    return [writer.start()]


def assign_windows(raw: DataFrame, table: dict[str, str]) -> DataFrame:
    """(campaign_id, window_start ms) of every view: parse, filter, project, join, bucket.

    The join is a lookup in a map literal of the 1,000 ads, compiled into the plan: the
    same inner join as a broadcast hash join (views of unknown ads are dropped), without
    broadcasting the table again in every micro-batch, a cost a short batch pays each time."""
    events = raw.select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")).select(
        "e.*"
    )
    campaigns = F.create_map(*[F.lit(part) for pair in sorted(table.items()) for part in pair])
    views = events.where(F.col("event_type") == "view").select(
        campaigns[F.col("ad_id")].alias("campaign_id"),
        (F.floor(F.col("event_time").cast("long") / WINDOW_MS) * WINDOW_MS).alias("window_start"),
    )
    return views.where(F.col("campaign_id").isNotNull())


def count_windows(windowed: DataFrame, watermark_s: float) -> DataFrame:
    """(campaign_id, window_start ms, seen_count) of every window that changed: Spark's
    streaming aggregation, its running counts in the job's state store."""
    with_time = windowed.select(
        "campaign_id", F.timestamp_millis(F.col("window_start")).alias("window")
    ).withWatermark("window", f"{int(watermark_s * 1000)} milliseconds")
    return (
        with_time.groupBy("campaign_id", "window")
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


class BatchDeltaWriter:
    """foreachBatch, as the original Spark job: count each micro-batch's views per window
    and add the counts to Redis, with the batch id as a fence so that a batch Spark runs
    again after a crash is not added twice. No state store: nothing to load or commit."""

    def __init__(self, redis_url: str, job: str) -> None:
        self.writer = WindowWriter(connect(redis_url, YSB_DB))
        self.job = job

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        rows = batch.groupBy("campaign_id", "window_start").count().collect()
        self.writer.add(
            ((r["campaign_id"], r["window_start"], r["count"]) for r in rows),
            time.time_ns() // 1_000_000,
            fence=(self.job, batch_id),
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


#: The YSB job's pipeline, started by reference: ``kappaflow_bench.ysb.pipeline:PIPELINE``.
PIPELINE = Pipeline(start=run)
