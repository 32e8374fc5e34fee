"""Kafka as a Spark source and sink, configured from the settings.

Pipelines call these instead of ``spark.readStream.format("kafka")`` so that security
settings, timeouts and the offsets policy are set in one place.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter

from kappaflow.settings import Settings


def read_stream(
    spark: SparkSession,
    settings: Settings,
    topic: str,
    *,
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    headers: bool = False,
) -> DataFrame:
    """The records of ``topic`` as an unbounded DataFrame (Kafka's columns; with
    ``headers``, the records' headers too, which mark a replayed dead letter)."""
    reader = spark.readStream.format("kafka").options(**settings.kafka.spark_kafka_options())
    reader = (
        reader.option("subscribe", topic)
        .option("startingOffsets", starting_offsets)
        # Retention may delete records a stopped job has not read yet: report it in the
        # job's log and go on, rather than stopping the job forever.
        .option("failOnDataLoss", "false")
        # Only committed records of transactional producers: a crashed producer's
        # aborted writes must never be counted.
        .option("kafka.isolation.level", "read_committed")
    )
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    if headers:
        reader = reader.option("includeHeaders", "true")
    return reader.load()


def read_batch(spark: SparkSession, settings: Settings, topic: str) -> DataFrame:
    """Everything currently in ``topic``, as a bounded DataFrame."""
    return (
        spark.read.format("kafka")
        .options(**settings.kafka.spark_kafka_options())
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


def read_range(
    spark: SparkSession, settings: Settings, topic: str, ranges: Mapping[int, tuple[int, int]]
) -> DataFrame:
    """The records of ``topic`` between the offsets ``ranges`` gives per partition (first
    and last, both included), as a bounded DataFrame of committed records."""
    starts = {str(p): first for p, (first, _) in ranges.items()}
    # endingOffsets is exclusive.
    ends = {str(p): last + 1 for p, (_, last) in ranges.items()}
    return (
        spark.read.format("kafka")
        .options(**settings.kafka.spark_kafka_options())
        .option("assign", json.dumps({topic: sorted(ranges)}))
        .option("startingOffsets", json.dumps({topic: starts}))
        .option("endingOffsets", json.dumps({topic: ends}))
        .option("kafka.isolation.level", "read_committed")
        .load()
    )


def write_stream(
    frame: DataFrame, settings: Settings, topic: str | None = None
) -> DataStreamWriter:
    """A Kafka sink; ``frame`` needs ``value`` (and may have ``key``, ``topic``, ``headers``)."""
    writer = frame.writeStream.format("kafka").options(**settings.kafka.spark_kafka_options())
    if topic is not None:
        writer = writer.option("topic", topic)
    return writer
