"""Parsing source records into countable events, in Spark SQL (no Python UDFs).

A record is countable when its value is a JSON object whose key field is a string or a
number and whose time field is epoch milliseconds (a number or a numeric string) or an
ISO-8601 timestamp with a zone. Anything else carries the reason it was refused, so the
record can go to the dead-letter topic with its original bytes.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from kappaflow.counting.spec import CountSpec

_NUMBER = r"^(BIGINT|INT|SMALLINT|TINYINT|DOUBLE|FLOAT|DECIMAL)"
_ZONE = r"(Z|z|[+-]\d{2}(:?\d{2})?)$"


def _path(field: str) -> str:
    return f'$["{field}"]'


def parse_events(raw: DataFrame, spec: CountSpec) -> DataFrame:
    """Kafka records (key, value, topic, partition, offset) → events with a verdict.

    Columns out: ``reason`` (null when countable), ``key``, ``ts`` (epoch ms), ``id``,
    ``value`` (the original bytes), ``src_partition``, ``src_offset``.

    Two passes in one expression: ``from_json`` reads the fields as text, which settles
    the common case (a string or integer key, integer or ISO time) cheaply. A record it
    cannot settle (bad JSON, a missing field, a key that may be a boolean or an object, a
    fractional time) is judged again from its variant form, which tells the exact reason;
    Spark evaluates that branch only for those records.
    """
    fields = dict.fromkeys([spec.key_field, spec.time_field, spec.id_field or spec.key_field])
    text = StructType([StructField(name, StringType()) for name in fields])
    parsed = raw.select(
        F.col("value"),
        F.col("partition").alias("src_partition"),
        F.col("offset").alias("src_offset"),
        F.from_json(F.col("value").cast("string"), text).alias("j"),
    )
    key_text = F.col("j").getField(spec.key_field)
    time_text = F.col("j").getField(spec.time_field)
    fast_ts = F.when(time_text.rlike(r"^\d{1,18}$"), time_text.cast("bigint")).when(
        time_text.rlike(_ZONE), F.unix_millis(F.expr("try_to_timestamp(_fast_t)"))
    )
    staged = parsed.select("*", key_text.alias("_fast_key"), time_text.alias("_fast_t")).select(
        "*", fast_ts.alias("_fast_ts")
    )
    settled = (
        F.col("_fast_key").isNotNull()
        & ~F.coalesce(
            F.col("_fast_key").isin("true", "false")
            | F.col("_fast_key").startswith("{")
            | F.col("_fast_key").startswith("["),
            F.lit(False),
        )
        & F.col("_fast_ts").isNotNull()
    )
    reason, key, ts = _judged(spec)
    event_id: Column = (
        F.col("j").getField(spec.id_field) if spec.id_field else F.lit(None).cast("string")
    )
    return staged.select(
        F.when(settled, F.lit(None).cast("string")).otherwise(reason).alias("reason"),
        F.when(settled, F.col("_fast_key")).otherwise(key).alias("key"),
        F.when(settled, F.col("_fast_ts")).otherwise(ts).alias("ts"),
        event_id.alias("id"),
        "value",
        "src_partition",
        "src_offset",
    )


def _judged(spec: CountSpec) -> tuple[Column, Column, Column]:
    """The variant-based verdict on ``value``: reason (null when countable), key, time.

    Pure expressions of ``value``, with no intermediate columns, so that inside a
    ``CASE WHEN`` Spark computes them only for the records that reach that branch.
    """
    v = "try_parse_json(CAST(value AS STRING))"

    def get(field: str, as_type: str) -> Column:
        return F.expr(f"try_variant_get({v}, '{_path(field)}', '{as_type}')")

    def type_of(field: str) -> Column:
        return F.expr(f"schema_of_variant(variant_get({v}, '{_path(field)}'))")

    key_type, time_type = type_of(spec.key_field), type_of(spec.time_field)
    time_num, time_str = get(spec.time_field, "bigint"), get(spec.time_field, "string")
    ts = (
        F.when(time_type.rlike(_NUMBER), time_num)
        .when((time_type == "STRING") & time_str.rlike(r"^\d+$"), time_num)
        .when(
            (time_type == "STRING") & time_str.rlike(_ZONE),
            F.unix_millis(F.try_to_timestamp(time_str)),
        )
    )
    return (
        _reason(spec, F.expr(v), key_type, time_type, time_str, ts),
        get(spec.key_field, "string"),
        ts,
    )


def _reason(
    spec: CountSpec,
    v: Column,
    key_type: Column,
    time_type: Column,
    time_str: Column,
    ts: Column,
) -> Column:
    key, time = spec.key_field, spec.time_field
    return (
        F.when(F.col("value").isNull(), F.lit("empty record"))
        .when(v.isNull(), F.lit("not valid JSON"))
        .when(~F.schema_of_variant(v).startswith("OBJECT"), F.lit("not a JSON object"))
        .when(
            key_type.isNull() | (key_type == "VOID"),
            F.lit(f"missing key field {key!r}"),
        )
        .when(
            ~(key_type.rlike(_NUMBER) | (key_type == "STRING")),
            F.lit(f"key field {key!r} is not a string or a number"),
        )
        .when(
            time_type.isNull() | (time_type == "VOID"),
            F.lit(f"missing time field {time!r}"),
        )
        .when(
            (time_type == "STRING") & ~time_str.rlike(r"^\d+$") & ~time_str.rlike(_ZONE),
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
