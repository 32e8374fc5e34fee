"""A batch's output records and lake rows, as Spark SQL over the batch's rows.

Everything here is a plan that Spark's tasks run where the batch's rows are: the driver
never holds them. Each record is ``(topic, key, value)`` (key and value as bytes), with
the bytes the driver-side formatting (``writer.changelog_records``) made of the same
row: JSON text written the way Python's ``json.dumps`` writes it (the engine jar's
``JsonText`` functions). Records keep the batch's partitioning: a partition's records
are the same when Spark runs the batch again, which the per-partition Kafka writer
(``KafkaOutput.java``) relies on.

The ``_o1``, ``_o2`` and ``_o3`` columns give records their order within a topic (what
the in-memory twin, which collects, sorts by); the Kafka writer ignores them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import to_avro
from pyspark.sql.classic.column import Column as ClassicColumn
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.kinds import BEHIND, CHANGES, DEAD, LATE, PACKED, RECORD
from kappaflow.streams.ops.arrow_ipc import unpack
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA

#: The columns of a batch's records, for every writer.
RECORD_COLUMNS = ("topic", "key", "value", "_o1", "_o2", "_o3")
#: Into how many partitions a batch's late events are spread (by their source position):
#: fixed, so that a batch run again spreads them the same way.
LATE_PARTITIONS = 4
_DAY_MS = 86_400_000


# -- unpacking (the window operator's packed rows, in the tasks) -----------------------


def unpacked(frame: DataFrame) -> DataFrame:
    """The batch's rows with a window operator's packed rows unpacked, without
    ``packed``: a ``mapInArrow`` in the tasks, partition by partition (the packing is
    the Python operator's; a JVM operator emits rows)."""
    # Every column nullable: an unpacked row may leave empty what a shaped row fills.
    schema = StructType(
        [StructField(f.name, f.dataType, True) for f in frame.drop("packed").schema.fields]
    )
    return frame.mapInArrow(_unpack_batches, schema)


def _unpack_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        table = pa.Table.from_batches([batch])
        packed = pc.equal(table["kind"], PACKED)
        rest = table.filter(pc.invert(packed)).drop_columns(["packed"])
        if rest.num_rows:
            yield from rest.to_batches()
        if not pc.any(packed).as_py():
            continue
        rows = unpack(table.filter(packed)["packed"], OUTPUT_ARROW_SCHEMA)
        columns = [
            rows[f.name].cast(f.type)
            if f.name in rows.column_names
            else pa.nulls(rows.num_rows, f.type)
            for f in rest.schema
        ]
        yield from pa.Table.from_arrays(columns, schema=rest.schema).to_batches()


# -- JSON text ---------------------------------------------------------------------------


def _java(frame: DataFrame, name: str, *args: Any) -> Column:
    jc = getattr(jvm_engine(frame.sparkSession).JsonText, name)(*args)
    return ClassicColumn(jc)


def _jc(column: Column) -> Any:
    return column._jc


def _object(fields: Sequence[tuple[str, Column]]) -> Column:
    """A JSON object of ``fields`` (each value JSON text), ``json.dumps``'s separators."""
    return F.concat(*_members(fields), F.lit("}"))


def _members(fields: Sequence[tuple[str, Column]]) -> list[Column]:
    """A JSON object of ``fields`` without its closing brace."""
    parts: list[Column] = []
    for name, value in fields:
        parts += [F.lit(", " if parts else "{"), F.lit(json.dumps(name) + ": "), value]
    return parts


def iso_text(millis: Column) -> Column:
    """Epoch milliseconds as a quoted ISO-8601 UTC time (``timeutil.iso``'s format),
    whatever the session's time zone."""
    days = F.floor(millis / _DAY_MS)
    of_day = millis - days * _DAY_MS
    date = F.date_format(F.date_from_unix_date(days.cast("int")), "yyyy-MM-dd")
    clock = F.format_string(
        "%02d:%02d:%02d.%03d",
        (of_day / 3_600_000).cast("int"),
        (of_day % 3_600_000 / 60_000).cast("int"),
        (of_day % 60_000 / 1000).cast("int"),
        (of_day % 1000).cast("int"),
    )
    return F.concat(F.lit('"'), date, F.lit("T"), clock, F.lit('Z"'))


def _number(column: Column) -> Column:
    return F.coalesce(column.cast("string"), F.lit("null"))


# -- records -----------------------------------------------------------------------------


def changelog(
    frame: DataFrame, topics: Sequence[str], names: Sequence[str], batch_id: int
) -> DataFrame:
    """The changelog records of the batch's changes on each of ``topics``: the bytes of
    ``writer.changelog_records``, sorted the same way within each partition."""
    changes = frame.where(F.col("kind").isin(*CHANGES)).sortWithinPartitions(
        "key", "window_start", "version"
    )
    record_key, value = changelog_key_value(frame, names, batch_id)
    return changes.select(
        F.explode(F.array(*[F.lit(t) for t in topics])).alias("topic"),
        record_key.cast("binary").alias("key"),
        value.cast("binary").alias("value"),
        F.col("key").alias("_o1"),
        F.col("window_start").alias("_o2"),
        F.col("version").alias("_o3"),
    )


def changelog_key_value(
    frame: DataFrame, names: Sequence[str], batch_id: int | None
) -> tuple[Column, Column]:
    """A change's changelog record key and value, as text (``batch`` null for None: in
    real-time mode)."""
    key = F.col("key")
    if len(names) == 1:
        # ``["x"]`` → ``"x"``: the array's one element, as it is.
        items = [F.expr("substring(key, 2, char_length(key) - 2)")]
    else:
        split = _java(frame, "items", _jc(key))
        items = [F.element_at(split, i + 1) for i in range(len(names))]
    start, watermark = F.col("window_start"), F.col("watermark")
    value = _object(
        [
            *zip(names, items, strict=True),
            ("window_start", iso_text(start)),
            ("window_end", iso_text(F.col("window_end"))),
            ("values", F.coalesce(F.col("values"), F.lit("null"))),
            ("previous", F.coalesce(F.col("previous"), F.lit("null"))),
            ("kind", F.concat(F.lit('"'), F.col("kind"), F.lit('"'))),
            ("version", F.col("version").cast("string")),
            ("watermark", F.when(watermark > 0, iso_text(watermark)).otherwise(F.lit("null"))),
            ("batch", F.lit("null" if batch_id is None else str(batch_id))),
        ]
    )
    parts: list[Column] = [F.lit("[")]
    for item in items:
        parts += [item, F.lit(", ")]
    return F.concat(*parts, start.cast("string"), F.lit("]")), value


def stream_records(frame: DataFrame, topics: Sequence[str], keys: Sequence[str]) -> DataFrame:
    """A plain stream's records on each of ``topics``: the row's JSON, keyed by the JSON
    array of its ``keys`` (no key without), in the batch's order."""
    return _plain_records(frame, [F.lit(t) for t in topics], keys, F.col("row").cast("binary"))


def _plain_records(
    frame: DataFrame, topics: Sequence[Column], keys: Sequence[str], value: Column
) -> DataFrame:
    """A plain stream's records with ``value`` on each of ``topics``, keyed by the JSON
    array of the row's ``keys`` (no key without), in the batch's order."""
    rows = frame.where(F.col("kind") == RECORD)
    key = _java(frame, "pick", _jc(F.col("row")), json.dumps(list(keys))) if keys else None
    topic = topics[0] if len(topics) == 1 else F.explode(F.array(*topics))
    return rows.select(
        topic.alias("topic"),
        (key.cast("binary") if key is not None else F.lit(None).cast("binary")).alias("key"),
        value.alias("value"),
        F.lit(None).cast("string").alias("_o1"),
        F.monotonically_increasing_id().alias("_o2"),
        F.lit(0).cast("bigint").alias("_o3"),
    )


def avro_records(
    frame: DataFrame,
    topic: str,
    keys: Sequence[str],
    schema_id: int,
    schema: str,
    row_schema: StructType,
) -> DataFrame:
    """A plain stream's records on ``topic`` as Avro in the schema registry's wire format
    (a zero byte, the 4-byte schema id, the body), keyed as ``stream_records`` keys them."""
    header = F.unhex(F.lit(f"00{schema_id:08x}"))
    value = F.concat(header, to_avro(F.from_json(F.col("row"), row_schema), schema))
    return _plain_records(frame, [F.lit(topic)], keys, value)


def protobuf_records(
    frame: DataFrame,
    topic: str,
    keys: Sequence[str],
    schema_id: int,
    descriptors: str,
    message: str,
) -> DataFrame:
    """A plain stream's records on ``topic`` as Protobuf in the schema registry's wire
    format (a zero byte, the 4-byte schema id, message index 0, the message), encoded from
    the row's JSON by the engine (Protobuf.java), keyed as ``stream_records`` keys them."""
    engine = jvm_engine(frame.sparkSession).Protobuf
    value = ClassicColumn(engine.encode(_jc(F.col("row")), descriptors, message, schema_id))
    return _plain_records(frame, [F.lit(topic)], keys, value)


def dead_letters(
    frame: DataFrame, topic: str, *, job: str, schema: str, source_topic: str
) -> DataFrame:
    """The batch's records that did not parse, with their bytes in base64."""
    body = dead_letter_value(frame, job=job, schema=schema, source_topic=source_topic)
    return frame.where(F.col("kind") == DEAD).select(
        F.lit(topic).alias("topic"),
        F.lit(None).cast("binary").alias("key"),
        body.cast("binary").alias("value"),
        F.lit(None).cast("string").alias("_o1"),
        F.monotonically_increasing_id().alias("_o2"),
        F.lit(0).cast("bigint").alias("_o3"),
    )


def dead_letter_value(frame: DataFrame, *, job: str, schema: str, source_topic: str) -> Column:
    """A dead letter's record value, as text; a replayed dead letter that failed again
    says which one it was (``replay_of``: ``PARTITION:OFFSET`` in the dead-letter topic)."""
    value = F.col("value")
    members = _members(
        [
            ("error", _java(frame, "quote", _jc(F.col("reason")))),
            ("schema", F.lit(json.dumps(schema))),
            ("job", F.lit(json.dumps(job))),
            ("source_topic", F.lit(json.dumps(source_topic))),
            ("source_partition", _number(F.col("src_partition"))),
            ("source_offset", _number(F.col("src_offset"))),
            (
                "value_base64",
                F.when(
                    value.isNotNull() & (F.length(value) > 0),
                    # Spark may break base64 into MIME lines; Python's is one line.
                    F.concat(
                        F.lit('"'), F.regexp_replace(F.base64(value), "[\\r\\n]", ""), F.lit('"')
                    ),
                ).otherwise(F.lit("null")),
            ),
        ]
    )
    if "replay" in frame.columns:
        replay = F.col("replay")
        members.append(
            F.when(
                replay.isNotNull(),
                F.concat(F.lit(', "replay_of": '), _java(frame, "quote", _jc(replay))),
            ).otherwise(F.lit(""))
        )
    return F.concat(*members, F.lit("}"))


def too_late(frame: DataFrame, source_topic: str, behind: int) -> DataFrame:
    """Each too-late event once, by its source position (topic, partition, offset): a
    window operator's ``late`` rows (one per offset they list) and the events a stream
    join dropped (``behind``, with the join's watermark), spread over LATE_PARTITIONS."""
    topic = F.coalesce(F.col("src_topic"), F.lit(source_topic))
    late = frame.where(F.col("kind") == LATE).select("*", F.explode("offsets").alias("_offset"))
    dropped = frame.where(F.col("kind") == BEHIND).select("*", F.col("src_offset").alias("_offset"))
    events = late.unionByName(dropped).select(
        topic.alias("t"),
        F.col("src_partition").alias("p"),
        F.col("_offset").alias("o"),
        F.struct(
            "kind",
            "reason",
            F.when(F.col("kind") == BEHIND, F.lit(behind))
            .otherwise(F.col("watermark"))
            .alias("watermark"),
            "key",
            "row",
            "window_start",
            "window_end",
            "event_time",
        ).alias("r"),
    )
    # One row per event, the same on a re-run: the least of those naming it.
    return (
        events.repartition(LATE_PARTITIONS, "t", "p", "o")
        .groupBy("t", "p", "o")
        .agg(F.min("r").alias("r"))
        .select("t", "p", "o", "r.*")
    )


def late_records(
    events: DataFrame, raw: DataFrame, topic: str, *, output: str, late_keys: Sequence[str]
) -> DataFrame:
    """The late topic's records of ``events`` (``too_late``), each with the event's
    original bytes from ``raw`` (the source records at those positions: ``topic``,
    ``partition``, ``offset``, ``value``)."""
    source = raw.select(
        F.col("topic").alias("t"),
        F.col("partition").alias("p"),
        F.col("offset").alias("o"),
        F.col("value").alias("_raw"),
    ).repartition(LATE_PARTITIONS, "t", "p", "o")
    joined = events.join(source, ["t", "p", "o"]).sortWithinPartitions("t", "p", "o")
    where = [
        ("event", _java(events, "quoteBytes", _jc(F.col("_raw")))),
        ("source_topic", _java(events, "quote", _jc(F.col("t")))),
        ("source_partition", _number(F.col("p"))),
        ("source_offset", _number(F.col("o"))),
    ]
    head = [
        ("output", F.lit(json.dumps(output))),
        ("reason", _java(events, "quote", _jc(F.col("reason")))),
        ("watermark", iso_text(F.col("watermark"))),
    ]
    behind = _object(
        [
            *head,
            ("key", _java(events, "dumps", _jc(F.col("row")))),
            ("event_time", iso_text(F.col("event_time"))),
            *where,
        ]
    )
    windowed = _object(
        [
            *head,
            ("key", _java(events, "named", _jc(F.col("key")), json.dumps(list(late_keys)))),
            ("window_start", iso_text(F.col("window_start"))),
            ("window_end", iso_text(F.col("window_end"))),
            *where,
        ]
    )
    value = F.when(F.col("kind") == BEHIND, behind).otherwise(windowed)
    return joined.select(
        F.lit(topic).alias("topic"),
        F.col("key").cast("binary").alias("key"),
        value.cast("binary").alias("value"),
        F.col("t").alias("_o1"),
        F.col("p").cast("bigint").alias("_o2"),
        F.col("o").alias("_o3"),
    )


# -- the serving store -------------------------------------------------------------------


def store_windows(frame: DataFrame) -> DataFrame:
    """The serving store's writes of the batch's changes (RedisOutput.java's rows): per
    change, its key, its window's start and what the store holds for the window,
    ``{"end", "values", "version", "final"}`` (``backends.stored_windows``'s text), or
    ``""`` for a retraction; each window's versions in order within its partition."""
    changes = frame.where(F.col("kind").isin(*CHANGES)).sortWithinPartitions(
        "key", "window_start", "version"
    )
    return changes.select(
        F.lit("w").alias("target"),
        F.col("key"),
        F.col("window_start").cast("string").alias("field"),
        window_held(),
    )


def window_held() -> Column:
    """What the serving store holds for a change's window (``value``), as text."""
    kind, end = F.col("kind"), F.col("window_end")
    final = (kind == "final") | ((kind == "correction") & (end <= F.col("watermark")))
    held = F.concat(
        F.lit('{"end":'),
        end.cast("string"),
        F.lit(',"values":'),
        F.col("values"),
        F.lit(',"version":'),
        F.col("version").cast("string"),
        F.lit(',"final":'),
        F.when(final, F.lit("true")).otherwise(F.lit("false")),
        F.lit("}"),
    )
    return F.when(F.col("values").isNull(), F.lit("")).otherwise(held).alias("value")


def store_latest(frame: DataFrame, keys: Sequence[str]) -> DataFrame:
    """A keyed stream's records as each key's latest (key JSON → record JSON), in the
    batch's order."""
    rows = frame.where(F.col("kind") == RECORD)
    return rows.select(
        F.lit("latest").alias("target"),
        F.lit(None).cast("string").alias("key"),
        _java(frame, "pick", _jc(F.col("row")), json.dumps(list(keys))).alias("field"),
        F.col("row").alias("value"),
    )


# -- the lake ----------------------------------------------------------------------------


def lake_stream_rows(frame: DataFrame, row_schema: StructType) -> DataFrame:
    """A plain stream's lake rows: its records with their typed columns back."""
    return (
        frame.where(F.col("kind") == RECORD)
        .select(F.from_json("row", row_schema).alias("r"))
        .select("r.*")
    )


def lake_change_rows(
    frame: DataFrame, keys: Sequence[tuple[str, DataType]], value_names: Sequence[str]
) -> DataFrame:
    """An aggregate's lake rows: a column per key and per aggregate value, the window's
    bounds, the change's kind and version. The values' types are inferred from the
    batch's values (a Spark job that returns only the schema)."""
    changes = frame.where(F.col("kind").isin(*CHANGES))
    schema = _values_schema(changes)
    order = [n for n in value_names if n in schema.names]
    order += sorted(n for n in schema.names if n not in order)
    parsed = F.from_json("values", schema) if schema.fields else None
    key = F.parse_json(F.col("key"))
    columns = [
        F.variant_get(key, f"$[{i}]", json_key_type(kind).simpleString()).alias(name)
        for i, (name, kind) in enumerate(keys)
    ]
    columns += [
        F.timestamp_millis("window_start").alias("window_start"),
        F.timestamp_millis("window_end").alias("window_end"),
    ]
    if parsed is not None:
        columns += [parsed.getField(name).alias(name) for name in order]
    columns += [F.col("kind"), F.col("version")]
    return changes.select(*columns)


def _values_schema(changes: DataFrame) -> StructType:
    """The schema Spark's JSON reader infers from the changes' values."""
    spark = changes.sparkSession
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    texts = changes.where(F.col("values").isNotNull()).select("values")
    strings = getattr(texts._jdf, "as")(jvm.org.apache.spark.sql.Encoders.STRING())
    inferred = spark._jsparkSession.read().json(strings).schema()
    schema = StructType.fromJson(json.loads(inferred.json()))
    return StructType([f for f in schema.fields if f.name != "_corrupt_record"])


def json_key_type(kind: DataType) -> DataType:
    """What a key's JSON value reads back as (what Python's ``json.loads`` makes of it)."""
    if isinstance(kind, IntegralType):
        return LongType()
    if isinstance(kind, FloatType | DoubleType | DecimalType):
        return DoubleType()
    if isinstance(kind, BooleanType):
        return BooleanType()
    return StringType()
