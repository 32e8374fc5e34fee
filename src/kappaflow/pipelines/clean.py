"""``clean``: validate a topic's events and route them, Kafka to Kafka.

Every record of ``source`` that holds a JSON object goes to ``dest`` (compact JSON, key
kept, the source coordinates in headers); anything else goes to the dead-letter topic
with the reason, its original bytes, and where it came from. Stateless, so it can run in
micro-batch or in Spark's real-time mode. Offsets live in the job's checkpoint; output
is at-least-once (Kafka's sink is not transactional), each record keeping its headers
so a consumer can drop a repeat by (topic, partition, offset).

Parameters: ``source``, ``dest``, ``dlq`` (default ``<job>.dlq``), ``trigger``
(``available-now``, ``realtime`` or a duration such as ``1s``; default ``0s``:
as fast as data arrives), ``starting_offsets`` (``earliest`` or ``latest``).
"""

from __future__ import annotations

from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import kappaflow as kf
from kappaflow.jobs.pipeline import JobContext, Pipeline


def run(ctx: JobContext) -> list[StreamingQuery]:
    source = ctx.param("source")
    dest = ctx.param("dest")
    dlq = ctx.param("dlq", f"{ctx.name}.dlq")
    ctx.partitions(source)  # KF404 if it does not exist, before anything is created
    for topic in (dest, dlq):
        ctx.create_topic(topic)
    raw = ctx.kafka_stream(source, starting_offsets=ctx.param("starting_offsets", "earliest"))
    parsed = raw.withColumn("event", F.expr("try_parse_json(CAST(value AS STRING))"))
    is_object = F.coalesce(F.expr("startswith(schema_of_variant(event), 'OBJECT')"), F.lit(False))
    reason = (
        F.when(F.col("value").isNull(), F.lit("empty record"))
        .when(F.col("event").isNull(), F.lit("not valid JSON"))
        .otherwise(F.lit("not a JSON object"))
    )
    coordinates = F.array(
        F.struct(F.lit("kf.topic").alias("key"), F.col("topic").cast("binary").alias("value")),
        F.struct(
            F.lit("kf.partition").alias("key"),
            F.col("partition").cast("string").cast("binary").alias("value"),
        ),
        F.struct(
            F.lit("kf.offset").alias("key"),
            F.col("offset").cast("string").cast("binary").alias("value"),
        ),
    )
    dead_letter = F.to_json(
        F.struct(
            reason.alias("error"),
            F.col("topic").alias("source_topic"),
            F.col("partition").alias("source_partition"),
            F.col("offset").alias("source_offset"),
            F.date_format(F.col("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX").alias("timestamp"),
            F.base64(F.col("value")).alias("value_base64"),
        )
    )
    routed = parsed.select(
        F.when(is_object, F.lit(dest)).otherwise(F.lit(dlq)).alias("topic"),
        F.col("key"),
        F.when(is_object, F.to_json(F.col("event"))).otherwise(dead_letter).alias("value"),
        coordinates.alias("headers"),
    )
    writer = (
        ctx.kafka_sink(routed)
        .queryName(ctx.name)
        .option("checkpointLocation", str(ctx.checkpoint_dir / "clean"))
    )
    trigger = ctx.param("trigger", "0s")
    if trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    elif trigger == "realtime":
        writer = writer.outputMode("update").trigger(realTime="5 seconds")  # type: ignore[call-overload]
    else:
        try:
            seconds = kf.parse_duration(trigger).total_seconds()
        except kf.KappaflowError:
            raise kf.InvalidParameterError(
                f"invalid trigger {trigger!r}: available-now, realtime or a duration such as 1s"
            ) from None
        writer = writer.trigger(processingTime=f"{seconds} seconds")
    return [writer.start()]


#: The ``clean`` pipeline (entry point ``clean``).
PIPELINE = Pipeline(start=run)
