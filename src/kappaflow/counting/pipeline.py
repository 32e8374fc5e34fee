"""The ``count`` pipeline: Kafka → parse → windows → state machine → Redis and Kafka.

Spark keeps the offsets and the state (RocksDB) in the job's checkpoint; the batch writer
makes every output exactly once (see sink.py). The event-time watermark is declared on a
column that is dropped before the stateful operator: Spark still computes the watermark
and fires the timers by it, but no longer drops rows behind it before the operator sees
them, so the operator can count them as corrections or report them as late.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from kappaflow.counting import realtime
from kappaflow.counting.arrow_ipc import PACKED_SCHEMA, PackedProcessor
from kappaflow.counting.events import assign_windows, parse_events
from kappaflow.counting.lifecycle import topics_of
from kappaflow.counting.preagg import FOLDED_SCHEMA, PreAggregator
from kappaflow.counting.rows import DEAD_WINDOW, SHARDS
from kappaflow.counting.sessions import SessionCounter
from kappaflow.counting.sink import BatchWriter, StepHook
from kappaflow.counting.spec import QUERY, REALTIME_PART, CountSpec
from kappaflow.counting.store import CountStore
from kappaflow.counting.windows import WindowCounter
from kappaflow.jobs.pipeline import JobContext, Part, Pipeline
from kappaflow.kafka.topics import create_topic, topic_partitions
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings
from kappaflow.spark.kafka_io import read_stream


def parts(params: Mapping[str, str], settings: Settings) -> list[Part]:
    """With ``--realtime``, the real-time query runs in a driver process of its own.

    Beside the micro-batch query in one JVM it stalled: a micro-batch's tasks, its
    garbage and the shared task scheduler held it up, so under load it fell seconds
    behind (docs/benchmarks/counting.md measures both)."""
    spec = CountSpec.from_params(dict(params))
    if not spec.realtime:
        return []
    partitions = len(topic_partitions(settings.kafka, spec.source))
    return [Part(REALTIME_PART, realtime.spark_settings(settings, partitions))]


def start(ctx: JobContext, on_step: StepHook | None = None) -> list[StreamingQuery]:
    """Start the job's counting query (or, in its real-time part, the real-time query).

    ``on_step`` is called at each step of every batch's writes (sink.STEPS); the
    fault-injection tests pass one, kappaflow's pipeline none."""
    spec = CountSpec.from_params(dict(ctx.params))
    kafka = ctx.settings.kafka
    partitions = len(topic_partitions(kafka, spec.source))
    topics = topics_of(ctx.name)
    if ctx.part == REALTIME_PART:
        return [
            realtime.start(
                ctx.spark,
                ctx.settings,
                spec,
                f"{ctx.name}.realtime",
                topics["counts"],
                str(ctx.checkpoint_dir / "realtime"),
                partitions,
            )
        ]
    for name in (topics["counts"], topics["late"], topics["dlq"]):
        create_topic(kafka, name, partitions=partitions, exist_ok=True)
    create_topic(
        kafka, topics["commits"], partitions=1, exist_ok=True, configs={"cleanup.policy": "compact"}
    )
    store = CountStore(redis_client(ctx.settings), ctx.name)
    output = build(read_stream(ctx.spark, ctx.settings, spec.source), spec)
    writer = (
        output.writeStream.queryName(ctx.name)
        .outputMode("update")
        .option("checkpointLocation", str(ctx.checkpoint_dir / QUERY))
        .foreachBatch(BatchWriter(ctx.settings, ctx.name, spec, store, on_step))
    )
    writer = (
        writer.trigger(availableNow=True)
        if spec.available_now
        else writer.trigger(processingTime="0 seconds")
    )
    return [writer.start()]


def build(raw: DataFrame, spec: CountSpec) -> DataFrame:
    """Everything the batch writer gets: changes, statistics, late and dead records.

    One pass over the source. Events are parsed and windowed in Spark SQL, folded per
    (window, key) in Arrow (preagg.py), then counted by the stateful operator per
    (window, shard). Records that cannot be counted travel the same way in a group of
    their own (window -1), which passes them on as dead letters. Only those carry their
    original bytes; a late event's bytes are fetched from the source by the batch
    writer, so the bulk of events cross to Python small.
    """
    if spec.session_gap_ms is not None:
        return build_sessions(raw, spec)
    windows = (
        assign_windows(parse_events(raw, spec), spec)
        .withColumn("_event_time", F.timestamp_millis(F.col("ts")))
        .withWatermark("_event_time", f"{spec.watermark_ms} milliseconds")
        .drop("_event_time")
    )
    countable = F.col("reason").isNull()
    id_hash = F.xxhash64("id") if spec.id_field else F.lit(None)
    events = windows.select(
        "window_start",
        F.when(countable, F.pmod(F.xxhash64("key"), F.lit(SHARDS)))
        .otherwise(F.lit(-1))
        .cast("int")
        .alias("shard"),
        "key",
        "primary",
        F.col("src_partition").cast("int").alias("src_partition"),
        "src_offset",
        F.when(F.col("id").isNotNull(), id_hash).cast("long").alias("id_hash"),
        "reason",
        F.when(countable, F.lit(None).cast("binary")).otherwise(F.col("value")).alias("value"),
    )
    folded = events.mapInArrow(PreAggregator(with_ids=spec.id_field is not None), FOLDED_SCHEMA)
    dedup = spec.id_field is not None
    return _counted(folded, WindowCounter(spec.size_ms, spec.allowed_lateness_ms, dedup))


def build_sessions(raw: DataFrame, spec: CountSpec) -> DataFrame:
    """Session windows: events, unfolded, to the session counter per shard of keys."""
    assert spec.session_gap_ms is not None
    countable = F.col("reason").isNull()
    events = (
        parse_events(raw, spec)
        .withColumn("_event_time", F.timestamp_millis(F.col("ts")))
        .withWatermark("_event_time", f"{spec.watermark_ms} milliseconds")
        .select(
            F.when(countable, F.lit(0))
            .otherwise(F.lit(DEAD_WINDOW))
            .cast("long")
            .alias("window_start"),
            F.when(countable, F.pmod(F.xxhash64("key"), F.lit(SHARDS)))
            .otherwise(F.lit(-1))
            .cast("int")
            .alias("shard"),
            "key",
            F.coalesce(F.col("ts"), F.lit(0)).alias("ts"),
            F.col("id").isNotNull().alias("has_id"),
            F.coalesce(F.xxhash64("id"), F.lit(0)).alias("id_hash"),
            F.col("src_partition").cast("int").alias("src_partition"),
            "src_offset",
            "reason",
            F.when(countable, F.lit(None).cast("binary")).otherwise(F.col("value")).alias("value"),
        )
    )
    dedup = spec.id_field is not None
    return _counted(events, SessionCounter(spec.session_gap_ms, spec.allowed_lateness_ms, dedup))


def _counted(rows: DataFrame, processor: StatefulProcessor) -> DataFrame:
    """``rows`` through ``processor``, one group per (window_start, shard), by event time;
    its output rows packed (arrow_ipc.PackedProcessor)."""
    return rows.groupBy("window_start", "shard").transformWithStateInPandas(
        statefulProcessor=PackedProcessor(processor),
        outputStructType=PACKED_SCHEMA,
        outputMode="Update",
        timeMode="EventTime",
    )


#: The ``count`` pipeline (entry point ``count``).
PIPELINE = Pipeline(start=start, parts=parts)
