"""Provisional counts in Spark's real-time mode, beside the exactly-once micro-batch path.

With ``--realtime`` a counting job runs a second query over the same source, in a
driver process (and JVM) of its own beside the job's main one: Spark's own windowed
count, in real-time mode (long-running tasks that process each record as it arrives,
Spark 4.3), written to ``NAME.counts`` as soon as a count changes. These
records have ``"mode": "realtime"``: they are early previews, at least once, without
``--id`` dedup, and an event behind that query's watermark is simply not in them. The
micro-batch path stays the authority: its records (those with a ``batch``) are the
exactly-once, deduplicated, corrected and final counts, and the only ones in Redis.

Real-time mode runs every stage of the query at once, each task holding a slot for the
whole batch: the source's partitions plus as many shuffle partitions.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.counting.job import event_type
from kappaflow.counting.spec import CountSpec
from kappaflow.settings import Settings, SettingsOverrides
from kappaflow.spark.kafka_io import read_stream, write_stream
from kappaflow.spark.session import CHECKPOINT_INTERVAL, real_time_spark
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.schema import compile_schema


def slots_needed(partitions: int) -> int:
    """Task slots the real-time query holds: source tasks plus aggregation tasks."""
    return 2 * partitions


def spark_settings(settings: Settings, partitions: int) -> SettingsOverrides:
    """The ``spark`` settings of the real-time query's own driver (pipeline.parts)."""
    return real_time_spark(settings, slots_needed(partitions))


def changes(raw: DataFrame, spec: CountSpec) -> DataFrame:
    """Kafka records → changelog records (``key``, ``value``) of windowed counts, shaped
    as the micro-batch path's (streams/output/writer.py ``changelog_records``), with ``mode``.

    Records are parsed as the micro-batch path parses them (the same record type, the same
    checks), so both count the same records; those that do not parse are left out here
    (the micro-batch path sends them to the dead-letter topic)."""
    record = compile_schema(event_type(spec))
    parsed = parse_records(
        raw, record, time=spec.time_field, keys=[spec.key_field], id=spec.id_field
    ).where(F.col("_kf_reason").isNull())
    step, size = spec.step_ms, spec.size_ms
    events = (
        parsed.select(
            F.col(spec.key_field).alias("key"),
            F.col("_kf_time").alias("ts"),
            F.explode(F.sequence(F.lit(0), F.lit(size // step - 1))).alias("_back"),
        )
        .withColumn(
            "window_start",
            (F.floor(F.col("ts") / step) * step - F.col("_back") * step).cast("long"),
        )
        .withColumn("window_end", F.col("window_start") + size)
        .withColumn("_event_time", F.timestamp_millis(F.col("ts")))
        .withWatermark("_event_time", f"{spec.watermark_ms} milliseconds")
    )
    counts = events.groupBy("window_start", "window_end", "key").agg(
        F.count(F.lit(1)).alias("count"), F.max("ts").alias("latest")
    )
    return counts.select(
        record_key().alias("key"),
        F.to_json(
            F.struct(
                F.col("key").alias(spec.key_field),
                _iso(F.col("window_start")).alias("window_start"),
                _iso(F.col("window_end")).alias("window_end"),
                F.struct(F.col("count")).alias("values"),
                F.lit("provisional").alias("kind"),
                F.lit("realtime").alias("mode"),
                _iso(F.col("latest")).alias("latest_event"),
            )
        ).alias("value"),
    )


def record_key() -> Column:
    """``["key", start_ms]`` from columns ``key`` and ``window_start``: byte for byte the
    key of the micro-batch path's records (streams/output/writer.py ``changelog_records``), so
    both land in the same partition."""
    quoted = "to_json(array(key))"
    return F.expr(
        f"format_string('[%s, %d]', substring({quoted}, 2, length({quoted}) - 2), window_start)"
    )


def _iso(millis: Column) -> Column:
    return F.date_format(F.timestamp_millis(millis), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")


def start(
    spark: SparkSession,
    settings: Settings,
    spec: CountSpec,
    name: str,
    topic: str,
    checkpoint: str,
    partitions: int,
) -> StreamingQuery:
    """Start the real-time query; its shuffle has one partition per source partition."""
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    # A query copies the session's settings when it starts; put the default back after.
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    try:
        writer = (
            write_stream(changes(read_stream(spark, settings, spec.source), spec), settings, topic)
            .queryName(name)
            .outputMode("update")
            .option("checkpointLocation", checkpoint)
            .trigger(realTime=CHECKPOINT_INTERVAL)  # type: ignore[call-overload]
        )
        query: StreamingQuery = writer.start()
        return query
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous or "4")
