"""The IoT scorer in Spark's real-time mode: each clean reading scored as it arrives.

Start it as a job of its own, beside (or instead of) the micro-batch scorer::

    kappaflow jobs start iot-score-rt --app kappaflow.iot.realtime:PIPELINE \\
        [-P source=telemetry.clean] [-P models=models] [-P dest=scores] [-P model=likelihood]
        [-P readings=clean|raw]

With ``-P readings=raw`` it reads the devices' raw readings (``telemetry.raw`` by
default) instead of the cleaning job's output, so that a reading is scored milliseconds
after it reaches Kafka rather than after the cleaning job's micro-batch: it passes over
what the cleaning job refuses for its content (a metric, unit or range it does not know,
a time too far from its logging, a record that does not parse; the cleaning job
dead-letters those), scores the value in its canonical unit, and scores a reading sent
twice once (the key's ids of the last ``DEDUP_MS``, of processing time). It reads the
device registry too (``devices.registry``, ``-P registry=...``) and passes over the
readings of a device that is not registered (the cleaning job dead-letters them): each
registry record, or tombstone, goes to the keys of the device's metrics, and a reading
that comes before its device's registration waits for it for a minute.

Real-time mode runs long batches whose tasks hand each record on as it comes, but it
takes no Python operator (docs/iot.md), so the per-key scoring runs on the JVM:
``io.kappaflow.iot.RealtimeScoring`` (built at setup, ``iot/jvm/``), which scores
as ``kappaflow.iot.score`` does, with the same models and the same memory. One query reads
``source`` and ``models`` together; per ``[device, metric]`` it keeps the newest
parameters and the scorer's memory, and writes each reading's score to ``dest`` (the
record ``kappaflow.iot.score`` writes) and a ``models`` record it cannot score with, or a
record that does not parse, to ``JOB.dlq``.

Its output is at least once: real-time mode writes to Kafka without transactions, and a
restarted job scores again the readings of the batch it was in (up to
``CHECKPOINT_INTERVAL``), from the memory it had at that batch's start; where a model
update came in between, with the newer parameters (the two topics are read side by
side, in no fixed order). The query holds a task slot for every
partition it reads and every state partition, for as long as it runs, so it runs in a
driver of its own (a part) with exactly those slots on a local master.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields, replace
from datetime import timedelta
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

import kappaflow as kf
from kappaflow.errors import SetupError
from kappaflow.iot.clean import (
    CLEAN_TOPIC,
    DEDUP_MS,
    MAX_AHEAD,
    MAX_BEHIND,
    RawReading,
    canonical_units,
    duration_ms,
)
from kappaflow.iot.jvm.scorer import scorer_jar
from kappaflow.iot.models import DEFAULT_MODEL
from kappaflow.iot.registry import REGISTRY_TOPIC
from kappaflow.iot.score import SCORES_TOPIC
from kappaflow.iot.telemetry import METRICS, READINGS_TOPIC
from kappaflow.iot.train import FORGET_AFTER, MODELS_TOPIC
from kappaflow.jobs.pipeline import JobContext, Part, Pipeline
from kappaflow.kafka.topics import COMPACTED, create_topic, topic_partitions
from kappaflow.settings import Settings
from kappaflow.spark.session import CHECKPOINT_INTERVAL, real_time_spark
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.schema import compile_schema

#: The part whose driver runs the query.
PART = "score"
#: The families the JVM scorer knows.
FAMILIES = ("forecast", "robust", "likelihood")

_READING = StructType(
    [
        StructField("device", StringType()),
        StructField("metric", StringType()),
        StructField("value", DoubleType()),
        StructField("unit", StringType()),
        StructField("time", StringType()),
        StructField("id", StringType()),
    ]
)
_MODEL = StructType(
    [
        StructField("device", StringType()),
        StructField("metric", StringType()),
        StructField("model", StringType()),
        StructField("version", LongType()),
        StructField("params", StringType()),
    ]
)


def _from_raw(params: Mapping[str, str]) -> bool:
    readings = params.get("readings", "clean")
    if readings not in ("clean", "raw"):
        raise kf.InvalidParameterError(f"readings {readings!r}: the readings are clean or raw")
    return readings == "raw"


def _topics(params: Mapping[str, str]) -> tuple[str, str, str]:
    return (
        params.get("source", READINGS_TOPIC if _from_raw(params) else CLEAN_TOPIC),
        params.get("models", MODELS_TOPIC),
        params.get("dest", SCORES_TOPIC),
    )


def _registry(params: Mapping[str, str]) -> str | None:
    """The device registry's topic, read with raw readings only (the cleaning job has
    judged clean ones)."""
    return params.get("registry", REGISTRY_TOPIC) if _from_raw(params) else None


def _slots(settings: Settings, params: Mapping[str, str]) -> tuple[int, int]:
    """Task slots the query holds (source tasks and state tasks), and its state partitions."""
    source, models, _ = _topics(params)
    readings = len(topic_partitions(settings.kafka, source))
    read = readings + len(topic_partitions(settings.kafka, models))
    registry = _registry(params)
    if registry is not None:
        read += len(topic_partitions(settings.kafka, registry))
    return read + readings, readings


def _family(params: Mapping[str, str]) -> str:
    model = params.get("model", DEFAULT_MODEL)
    if model not in FAMILIES:
        raise kf.InvalidParameterError(
            f"model {model!r}: the real-time scorer scores "
            f"{' and '.join(FAMILIES[:-1])} as well as {FAMILIES[-1]}"
        )
    return model


def _needs_jar(settings: Settings) -> Path:
    jar = scorer_jar(settings)
    if jar is None:
        raise SetupError(
            "the real-time scorer needs kappaflow-iot.jar, which setup builds with a JDK's "
            "javac: install a JDK and run `make setup`"
        )
    return jar


def parts(params: Mapping[str, str], settings: Settings) -> list[Part]:
    # Refused in the job's main driver, before a part's driver starts.
    _family(params)
    _from_raw(params)
    jar = _needs_jar(settings)
    registry = _registry(params)
    if registry is not None:
        # As the gateway and `kappaflow iot register` make it, if no device is registered yet.
        create_topic(settings.kafka, registry, partitions=1, configs=dict(COMPACTED), exist_ok=True)
    slots, _ = _slots(settings, params)
    spark = real_time_spark(settings, slots)
    # The part's driver alone loads the scorer's classes (spark.jars, which executors of a
    # cluster fetch too).
    theirs = settings.spark.conf.get("spark.jars")
    jars = ",".join(filter(None, (theirs, str(jar.resolve()))))
    return [Part(PART, replace(spark, spark_conf={**(spark.spark_conf or {}), "spark.jars": jars}))]


_ENTRY = "device STRING, present BOOLEAN"


def rows(
    raw: DataFrame,
    models: str,
    *,
    from_raw: bool = False,
    registry: str | None = None,
    max_ahead: str = MAX_AHEAD,
    max_behind: str = MAX_BEHIND,
) -> DataFrame:
    """Kafka records of the readings' topic, of ``models`` and of ``registry`` as the JVM
    scorer's input: one row each, with its ``kind`` (``reading``, ``model``,
    ``registered`` or ``unregistered``, or ``bad`` with the ``reason``) and the ``key``
    ``[device, metric]`` as JSON; a registry record is a row for each metric of the fleet;
    tombstones, and readings ``refused``, are left out.

    ``from_raw``: the readings are raw (``telemetry.raw``), parsed as the cleaning job's
    source parses them (``RawReading``, the job API's parser); a reading that does not
    parse, or that the cleaning job refuses for its content (its metric, unit, range, or
    its time against its logging), is ``refused`` (the cleaning job dead-letters them);
    a value becomes its metric's canonical unit as cleaning makes it."""
    is_entry = F.lit(False)
    if registry is not None:
        # A registry record's key is its device, and a tombstone has no value: both go on
        # as the record's bytes, which the parser below refuses as a reading.
        is_entry = F.col("topic") == F.lit(registry)
        entry_bytes = F.to_json(
            F.struct(
                F.col("key").cast("string").alias("device"),
                F.col("value").isNotNull().alias("present"),
            )
        ).cast("binary")
        raw = raw.withColumn("value", F.when(is_entry, entry_bytes).otherwise(F.col("value")))
        is_entry = F.col("src_topic") == F.lit(registry)
    if from_raw:
        frame = parse_records(raw, compile_schema(RawReading), time="time", keys=["device"])
        columns = ("_kf_topic", "_kf_partition", "_kf_offset", "_kf_logged", "_kf_value")
        parsed = F.struct(*[f.name for f in fields(RawReading)])
        unparsed = F.col("_kf_reason").isNotNull()
    else:
        frame, columns = raw, ("topic", "partition", "offset", "timestamp", "value")
        parsed = F.from_json(F.col("value").cast("string"), _READING)
        unparsed = F.lit(False)
    names = ("src_topic", "src_partition", "src_offset", "logged", "bytes")
    source = frame.select(
        *[F.col(c).alias(n) for c, n in zip(columns, names, strict=True)],
        parsed.alias("reading"),
        unparsed.alias("unparsed"),
    )
    staged = source.select(
        "*",
        (F.col("src_topic") == F.lit(models)).alias("is_model"),
        is_entry.alias("is_entry"),
        F.from_json(F.col("bytes").cast("string"), _MODEL).alias("update"),
        # Parsed for registry records only: the readings' path is the one measured.
        F.when(is_entry, F.from_json(F.col("bytes").cast("string"), _ENTRY)).alias("entry"),
    )
    reading, model, entry = F.col("reading"), F.col("update"), F.col("entry")
    model_rows, entry_rows = F.col("is_model"), F.col("is_entry")
    # A registry record stands for each of the device's metrics.
    metrics = F.array(*[F.lit(m.name) for m in METRICS])
    staged = staged.select(
        "*",
        F.explode(
            F.when(entry_rows, metrics).otherwise(F.array(reading["metric"].cast("string")))
        ).alias("metric"),
        reading["unit"].alias("unit"),
        reading["value"].alias("value"),
    )

    def field(name: str) -> Column:
        return F.when(model_rows, model[name]).otherwise(reading[name]).cast("string")

    device = F.when(entry_rows, entry["device"]).otherwise(field("device"))
    metric = F.when(model_rows, model["metric"].cast("string")).otherwise(F.col("metric"))
    unparsed = device.isNull() | metric.isNull()
    bad_reading = unparsed | reading["value"].isNull() | reading["id"].isNull()
    bad_model = unparsed | model["version"].isNull() | model["model"].isNull()
    value, time = reading["value"], reading["time"]
    refused = F.lit(False)
    if from_raw:
        known_unit, canonical, _unit, in_range = canonical_units()
        # As the cleaning job judges: the time against the record's logging, in ms.
        ahead = F.unix_millis(reading["time"]) - F.unix_millis(F.col("logged"))
        # What cannot be judged (a null anywhere) is refused too.
        refused = F.coalesce(
            F.col("unparsed")
            | bad_reading
            | ~F.col("metric").isin([m.name for m in METRICS])
            | ~known_unit
            | ~in_range
            | (ahead > duration_ms(max_ahead))
            | (-ahead > duration_ms(max_behind)),
            F.lit(True),
        )
        bad_reading = F.lit(False)
        value = F.round(canonical, 3)
        time = F.date_format(reading["time"], "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")
    kind = (
        F.when(F.col("bytes").isNull(), F.lit("tombstone"))
        .when(entry_rows & device.isNull(), F.lit("tombstone"))
        .when(entry_rows & entry["present"], F.lit("registered"))
        .when(entry_rows, F.lit("unregistered"))
        .when(model_rows & bad_model, F.lit("bad"))
        .when(~model_rows & refused, F.lit("refused"))
        .when(~model_rows & bad_reading, F.lit("bad"))
        .when(model_rows, F.lit("model"))
        .otherwise(F.lit("reading"))
    )
    schema = F.when(model_rows, F.lit("ModelUpdate")).otherwise(
        F.lit("RawReading" if from_raw else "CleanReading")
    )
    reason = F.concat(F.lit("not a "), schema, F.lit(" record"))
    # What the scorer passes over anyway stays out of the shuffle (one key for all of it).
    return staged.where(~kind.isin("refused", "tombstone")).select(
        F.when(kind == "bad", F.lit("")).otherwise(F.to_json(F.array(device, metric))).alias("key"),
        kind.alias("kind"),
        reason.alias("reason"),
        schema.alias("schema"),
        device.alias("device"),
        metric.alias("metric"),
        value.cast("double").alias("value"),
        time.cast("string").alias("time"),
        reading["id"].alias("id"),
        model["model"].alias("model"),
        model["version"].alias("version"),
        model["params"].alias("params"),
        "src_topic",
        "src_partition",
        "src_offset",
        F.base64(F.col("bytes")).alias("value_base64"),
    )


def start(ctx: JobContext) -> list[StreamingQuery]:
    """The scoring query, in the part's driver (the job's main driver starts none)."""
    settings, spark = ctx.settings, ctx.spark
    model = _family(ctx.params)
    forget = ctx.param("forget_after", FORGET_AFTER)
    ttl_ms = 0 if forget == "never" else int(kf.parse_duration(forget) / timedelta(milliseconds=1))
    _needs_jar(settings)
    source, models, dest = _topics(ctx.params)
    dead_letters = f"{ctx.name}.dlq"
    ctx.create_topic(dest)
    ctx.create_topic(dead_letters, owned=True)  # `kappaflow jobs remove` deletes it
    _, state_partitions = _slots(settings, ctx.params)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    # A query copies the session's settings when it starts; put the default back after.
    spark.conf.set("spark.sql.shuffle.partitions", str(state_partitions))
    try:
        from_raw = _from_raw(ctx.params)
        registry = _registry(ctx.params)
        read = ctx.kafka_stream(",".join(filter(None, (source, models, registry))))
        limits = {
            k: ctx.param(k, d) for k, d in (("max_ahead", MAX_AHEAD), ("max_behind", MAX_BEHIND))
        }
        scored = jvm.io.kappaflow.iot.RealtimeScoring.apply(
            rows(read, models, from_raw=from_raw, registry=registry, **limits)._jdf,
            dest,
            dead_letters,
            ctx.name,
            model,
            ttl_ms,
            DEDUP_MS if from_raw else 0,
            registry is not None,
        )
        out = DataFrame(scored.toDF(), spark).select(
            F.col("_1").alias("topic"), F.col("_2").alias("key"), F.col("_3").alias("value")
        )
        query: StreamingQuery = (
            ctx.kafka_sink(out)
            .queryName(f"{ctx.name}.scores")
            .outputMode("update")
            .option("checkpointLocation", str(ctx.checkpoint_dir / "scores"))
            .trigger(realTime=CHECKPOINT_INTERVAL)  # type: ignore[call-overload]
            .start()
        )
        return [query]
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous or "4")


#: The real-time scoring job.
PIPELINE = Pipeline(start=start, parts=parts, main=False)
