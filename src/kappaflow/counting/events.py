"""Parsing source records into countable events, in Spark SQL (no Python UDFs).

A record is countable when its value is a JSON object whose key field is a string or a
number and whose time field is epoch milliseconds (a number or a numeric string) or an
ISO-8601 timestamp with a zone. Anything else carries the reason it was refused, so the
record can go to the dead-letter topic with its original bytes.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kappaflow.counting.spec import CountSpec

_NUMBER = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL)"
_ZONE = r"(Z|z|[+-]\d{2}(:?\d{2})?)$"


def _path(field: str) -> str:
    return f'$["{field}"]'


def parse_events(raw: DataFrame, spec: CountSpec) -> DataFrame:
    """Kafka records (key, value, topic, partition, offset) → events with a verdict.

    Columns out: ``reason`` (null when countable), ``key``, ``ts`` (epoch ms), ``id``,
    ``value`` (the original bytes), ``src_topic``, ``src_partition``, ``src_offset``.
    """
    v = F.expr("try_parse_json(CAST(value AS STRING))")
    parsed = raw.select(
        F.col("value"),
        F.col("topic").alias("src_topic"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        v.alias("v"),
    )
    key_type = F.expr(f"schema_of_variant(variant_get(v, '{_path(spec.key_field)}'))")
    time_type = F.expr(f"schema_of_variant(variant_get(v, '{_path(spec.time_field)}'))")
    time_num = F.expr(f"try_variant_get(v, '{_path(spec.time_field)}', 'bigint')")
    time_str = F.expr(f"try_variant_get(v, '{_path(spec.time_field)}', 'string')")
    time_iso = F.unix_millis(F.expr("try_to_timestamp(_t_str)"))
    with_parts = parsed.select(
        "*",
        F.expr(f"try_variant_get(v, '{_path(spec.key_field)}', 'string')").alias("_key"),
        key_type.alias("_key_type"),
        time_type.alias("_t_type"),
        time_num.alias("_t_num"),
        time_str.alias("_t_str"),
    )
    ts = (
        F.when(F.col("_t_type").rlike(_NUMBER), F.col("_t_num"))
        .when((F.col("_t_type") == "STRING") & F.col("_t_str").rlike(r"^\d+$"), F.col("_t_num"))
        .when((F.col("_t_type") == "STRING") & F.col("_t_str").rlike(_ZONE), time_iso)
    )
    reason = _reason(spec, ts)
    event_id: Column = (
        F.expr(f"try_variant_get(v, '{_path(spec.id_field)}', 'string')")
        if spec.id_field
        else F.lit(None).cast("string")
    )
    return with_parts.select(
        reason.alias("reason"),
        F.col("_key").alias("key"),
        ts.alias("ts"),
        event_id.alias("id"),
        "value",
        "src_topic",
        "src_partition",
        "src_offset",
    )


def _reason(spec: CountSpec, ts: Column) -> Column:
    key, time = spec.key_field, spec.time_field
    return (
        F.when(F.col("value").isNull(), F.lit("empty record"))
        .when(F.col("v").isNull(), F.lit("not valid JSON"))
        .when(~F.expr("startswith(schema_of_variant(v), 'OBJECT')"), F.lit("not a JSON object"))
        .when(
            F.col("_key_type").isNull() | (F.col("_key_type") == "VOID"),
            F.lit(f"missing key field {key!r}"),
        )
        .when(
            ~(F.col("_key_type").rlike(_NUMBER) | (F.col("_key_type") == "STRING")),
            F.lit(f"key field {key!r} is not a string or a number"),
        )
        .when(
            F.col("_t_type").isNull() | (F.col("_t_type") == "VOID"),
            F.lit(f"missing time field {time!r}"),
        )
        .when(
            (F.col("_t_type") == "STRING")
            & ~F.col("_t_str").rlike(r"^\d+$")
            & ~F.col("_t_str").rlike(_ZONE),
            F.lit(f"time field {time!r} is not epoch milliseconds or ISO-8601 with a zone"),
        )
        .when(
            ts.isNull(),
            F.lit(f"time field {time!r} is not epoch milliseconds or ISO-8601 with a zone"),
        )
    )


def assign_windows(events: DataFrame, spec: CountSpec) -> DataFrame:
    """One row per (event, window it falls in); ``primary`` marks the newest window.

    Tumbling windows give one row per event; sliding windows give size/slide rows.
    Records that cannot be counted keep one row, with window -1.
    """
    size, step = spec.size_ms, spec.step_ms
    countable = F.col("reason").isNull()
    newest = F.floor(F.col("ts") / step) * step
    offsets = F.when(countable, F.sequence(F.lit(0), F.lit(size // step - 1))).otherwise(
        F.array(F.lit(0))
    )
    start = F.when(countable, newest - F.col("_back") * step).otherwise(F.lit(-1))
    return (
        events.withColumn("_back", F.explode(offsets))
        .withColumn("window_start", start.cast("long"))
        .withColumn(
            "window_end",
            F.when(countable, F.col("window_start") + size).otherwise(F.lit(-1)).cast("long"),
        )
        .withColumn("primary", F.col("_back") == 0)
        .drop("_back")
    )
