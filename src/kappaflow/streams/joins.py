"""Joins, with Spark's own: a stream with a reference table, and two streams by time.

A reference table from a compacted Kafka topic is a *bounded* Kafka read of the whole
topic (earliest to latest offsets) joined to the stream as a stream-static join. Spark
plans the static side again in every micro-batch and the Kafka relation resolves its
latest offsets when it is planned, so each micro-batch sees the table as it is then:
an update to the topic reaches the orders of the next micro-batch (tests/test_app_jobs.py
shows it), and a replayed micro-batch sees the table as of the replay. The table is the
latest record per Kafka key (a tombstone, a null value, deletes the key), then the latest
per ``key`` fields; a record that does not parse leaves its key out of the table and goes
to the job's dead-letter topic once (runtime.py reads the topic as a stream for that).

A Parquet table is read once, when the job is declared: Spark lists a static file
source's files then and not per micro-batch.

Two streams join inside a time range: ``other._kf_time`` within ``within`` of the
stream's. Both sides get a watermark (the source's watermark plus its allowed lateness)
so Spark can drop join state once no event can match it any more. The result keeps the
left stream's bookkeeping columns (event time, partition, offset), so its late events
are traced back to the left source by offset. Spark accepts a stream-stream join only in
append output mode, which the runtime then uses for the output's query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import (
    JoinColumnClashError,
    JoinColumnError,
    JoinSpecError,
    StateAfterStreamJoinError,
)
from kappaflow.streams.kinds import BEHIND
from kappaflow.streams.model import (
    BOOKKEEPING,
    Joined,
    Reader,
    Side,
    Source,
    millis,
    refusal,
)
from kappaflow.streams.ops.avro import PRE_REASON
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.ops.windowing import key_json
from kappaflow.streams.output.lake_delta import DELTA_LOG
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_manifest import MANIFEST_DIR
from kappaflow.streams.output.lake_read import read_spark
from kappaflow.streams.schema import RecordSchema, compile_schema

_HOW = ("left", "inner")


class Reference:
    """A reference table to join streams with: one row per key, kept current."""

    def __init__(
        self,
        name: str,
        keys: tuple[str, ...],
        frame: DataFrame,
        *,
        source: Source | None = None,
        parsed: DataFrame | None = None,
        records: DataFrame | None = None,
        picked: tuple[str | Column, ...] | None = None,
    ) -> None:
        self.name = name
        self.keys = keys
        #: The table's rows (a bounded DataFrame, planned again in every micro-batch).
        self.frame = frame
        #: A Kafka table's topic as a source, for its dead letters (None: from Parquet).
        self.source = source
        #: The topic's records as a stream with their verdicts (runtime.py sends the ones
        #: that do not parse to the dead-letter topic).
        self.parsed = parsed
        #: A Kafka table's latest record per Kafka key with its verdict, bounded: what the
        #: table's rows are picked from (None: from Parquet).
        self._records = records
        #: The columns ``select`` kept, to pick them again after a ``reject``.
        self._picked = picked

    @property
    def columns(self) -> list[str]:
        return list(self.frame.columns)

    def select(self, *columns: str | Column) -> Reference:
        """Only these columns (the key columns are kept): to rename or drop a column
        that would clash with the stream's, e.g. ``F.col("price").alias("list_price")``."""
        extra = tuple(c for c in columns if not (isinstance(c, str) and c in self.keys))
        picked = self.frame.select(*self.keys, *extra)
        return Reference(
            self.name,
            self.keys,
            picked,
            source=self.source,
            parsed=self.parsed,
            records=self._records,
            picked=(*self.keys, *extra),
        )

    def reject(self, condition: Column | str, reason: str | Column) -> Reference:
        """The table without the records for which ``condition`` holds: those go to the
        job's dead-letter topic with ``reason`` (a text, or a column that words it per
        record) and their original bytes, as records that do not parse do, and leave
        their key out of the table. For a rule the schema cannot say: a field that holds
        JSON text of some shape, a value out of range."""
        if self.source is None or self.parsed is None or self._records is None:
            raise JoinSpecError(
                f"table {self.name!r} is read from Parquet: filter it before, "
                "only a Kafka table's records can go to the dead-letter topic"
            )
        refused, why = refusal(condition, reason)
        verdict = F.when(F.col("_kf_reason").isNull() & refused, why).otherwise(F.col("_kf_reason"))
        records = self._records.withColumn("_kf_reason", verdict)
        frame = _rows(records, self.keys, self.source.schema)
        if self._picked is not None:
            frame = frame.select(*self._picked)
        return Reference(
            self.name,
            self.keys,
            frame,
            source=self.source,
            parsed=self.parsed.withColumn("_kf_reason", verdict),
            records=records,
            picked=self._picked,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "table": self.name,
            "kafka": self.source is not None,
            "schema": self.source.schema.name if self.source is not None else "parquet",
            "key": list(self.keys),
        }


def kafka_table(
    reader: Reader,
    spark: SparkSession,
    topic: str,
    schema: type,
    keys: tuple[str, ...],
    *,
    envelope: bool = False,
    decode: Callable[[DataFrame], DataFrame] | None = None,
) -> Reference:
    """The compacted topic ``topic`` as a table of ``schema`` records by ``keys``; with
    ``envelope``, a topic of Debezium's change events, each read as its row after the
    change (:func:`after_change`); with ``decode``, records in a registry's format,
    decoded (once the latest per key is chosen, so a record that does not decode is a
    dead letter, not a delete) before they are parsed."""
    if not keys:
        raise JoinSpecError(f"table {topic!r}: give key=..., the fields that identify a row")
    nested = next((k for k in keys if "." in k), None)
    if nested is not None:
        raise JoinSpecError(f"table {topic!r}: key {nested!r} is nested; key by top-level fields")
    record = compile_schema(schema)
    for path in keys:
        record.field(path)
    source = Source(topic, record, keys, "", None, 0, 0, "earliest", schema)
    raw = reader.table(spark, topic)
    # Change events are decoded before their row is taken out of the envelope; a record
    # that does not decode then is no change (its key keeps its row) and a dead letter.
    early = decode if envelope else None
    late = None if envelope else decode
    if early is not None:
        decoded = early(raw.where(F.col("value").isNotNull())).where(F.col(PRE_REASON).isNull())
        raw = decoded.select(*raw.columns).unionByName(raw.where(F.col("value").isNull()))
    if envelope:
        raw = after_change(raw)
    rows = _latest(raw.where(F.col("key").isNotNull()), ["key"], ["partition", "offset"])
    present = rows.unionByName(raw.where(F.col("key").isNull())).where(F.col("value").isNotNull())
    if late is not None:
        present = late(present)
    parsed = parse_records(present, record, time=None, keys=keys)
    stream = reader.stream(spark, topic, "earliest").where(F.col("value").isNotNull())
    if early is not None:
        stream = early(stream)
    if envelope:
        stream = after_change(stream)
    if early is not None:
        stream = stream.where(F.col("value").isNotNull() | F.col(PRE_REASON).isNotNull())
    else:
        stream = stream.where(F.col("value").isNotNull())
    if late is not None:
        stream = late(stream)
    verdicts = parse_records(stream, record, time=None, keys=keys)
    table = _rows(parsed, keys, record)
    return Reference(topic, keys, table, source=source, parsed=verdicts, records=parsed)


def after_change(raw: DataFrame) -> DataFrame:
    """Kafka records of Debezium's change events with each value replaced by the row as
    the change left it: the envelope's ``after`` for an insert, an update or a snapshot's
    row (``op`` c, u, r), null for a delete (``after`` is null) and for a tombstone. A
    table then reads them as it reads a compacted topic: the last value per Kafka key (the
    row's primary key) wins, a null one deletes. Envelopes with Connect's schema beside
    them (``{"schema": ..., "payload": {...}}``) are read too."""
    text = F.col("value").cast("string")
    after = F.coalesce(
        F.get_json_object(text, "$.payload.after"), F.get_json_object(text, "$.after")
    )
    return raw.withColumn("value", after.cast("binary"))


def change_events(raw: DataFrame) -> DataFrame:
    """Kafka records of Debezium's change events with each value replaced by the change as
    one flat JSON object: ``op``, ``ts_ms`` (when the database committed it: the source's
    ``ts_ms``, else the envelope's), ``lsn`` (the source's), then the row's columns as the
    change left them (``after``; for a delete, ``before``). Tombstones are left out (the
    delete before each is the change); a value that is not such an envelope stays as it
    is, to be a dead letter. Envelopes with Connect's schema beside them are read too."""
    text = F.col("value").cast("string")
    payload = F.coalesce(F.get_json_object(text, "$.payload"), text)

    def get(path: str) -> Column:
        return F.get_json_object(payload, path)

    row = F.coalesce(get("$.after"), get("$.before"))
    op, lsn = get("$.op"), get("$.source.lsn")
    ts = F.coalesce(get("$.source.ts_ms"), get("$.ts_ms"))
    held = F.col("_kf_row")
    empty = held.rlike(r"^\s*\{\s*\}\s*$")
    flat = F.concat(
        F.lit('{"op": "'),
        op,
        F.lit('", "ts_ms": '),
        ts,
        F.lit(', "lsn": '),
        F.coalesce(lsn, F.lit("null")),
        F.when(empty, F.lit("}")).otherwise(
            F.concat(F.lit(", "), F.expr("substring(ltrim(_kf_row), 2)"))
        ),
    )
    return (
        raw.where(F.col("value").isNotNull())
        .withColumn("_kf_row", row)
        .withColumn(
            "value",
            F.when(op.isNotNull() & ts.isNotNull() & held.startswith("{"), flat)
            .otherwise(text)
            .cast("binary"),
        )
        .drop("_kf_row")
    )


def _rows(records: DataFrame, keys: tuple[str, ...], record: RecordSchema) -> DataFrame:
    """A table's rows: the latest good record per value of ``keys``."""
    good = records.where(F.col("_kf_reason").isNull())
    fields = [f.name for f in record.fields]
    return _latest(good, list(keys), ["_kf_partition", "_kf_offset"]).select(*fields)


def lake_table(spark: SparkSession, path: str, keys: tuple[str, ...]) -> Reference:
    """The Parquet files at ``path`` (a directory) as a table by ``keys``."""
    if not keys:
        raise JoinSpecError(f"table {path!r}: give key=..., the columns that identify a row")
    frame = _lake_or_parquet(spark, path)
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise JoinColumnError(
            f"table {path!r} has no key column {missing[0]!r} (columns: {', '.join(frame.columns)})"
        )
    return Reference(path, keys, frame)


def _lake_or_parquet(spark: SparkSession, path: str) -> DataFrame:
    """A lake table's committed rows (a Delta table's latest version, a manifest table's
    batches), else every Parquet file under ``path``."""
    fs = HadoopFs(spark, path)
    if fs.exists(DELTA_LOG) or fs.exists(MANIFEST_DIR):
        return read_spark(spark, path)
    return spark.read.parquet(path)


def _latest(frame: DataFrame, by: Sequence[str], order: Sequence[str]) -> DataFrame:
    """The row of ``frame`` with the greatest ``order`` columns per value of ``by``."""
    others = [c for c in frame.columns if c not in by]
    newest = F.max_by(F.struct(*others), F.struct(*order)).alias("_kf_row")
    return frame.groupBy(*by).agg(newest).select(*by, "_kf_row.*")


def join_table(
    stream: Side, table: Reference, on: Sequence[str], how: str
) -> tuple[DataFrame, Source]:
    """``stream`` with the columns of ``table``'s row whose ``on`` columns match."""
    _check_how(how, table.name)
    keys = tuple(on) or table.keys
    _check_on(stream, keys, table.columns, f"table {table.name!r}")
    _check_clash(stream, [c for c in table.columns if c not in keys], f"table {table.name!r}")
    # Broadcast: a reference table is small beside the stream, and the join then needs
    # no shuffle of the stream's rows.
    joined = stream.frame.join(F.broadcast(table.frame), on=list(keys), how=how)
    carries = None
    if table.source is not None and table.parsed is not None:
        carries = (table.source, table.parsed)
    return _joined(stream, joined, Joined("table", table.name, keys, how, None, carries))


def join_stream(
    stream: Side, other: Side, on: Sequence[str], how: str, within: str | int | timedelta
) -> tuple[DataFrame, Source]:
    """``stream`` with the columns of each ``other`` record whose ``on`` columns match
    and whose event time is within ``within`` of the stream record's."""
    name = other.source.topic
    _check_how(how, name)
    if other.source.topic == stream.source.topic:
        raise JoinSpecError(
            f"stream of {name!r} joined with itself: declare the topic once and filter it"
        )
    if other.processed:
        raise JoinSpecError(f"the processed stream of {name!r} cannot be joined: join before")
    refuse_after_stream_join(stream.source, f"a join with the stream of {name!r}")
    refuse_after_stream_join(other.source, f"a join with the stream of {name!r}")
    within_ms = millis(within, "within")
    if within_ms <= 0:
        raise JoinSpecError(f"join with {name!r}: within must be positive, got {within_ms} ms")
    keys = tuple(on)
    if not keys:
        raise JoinSpecError(f"join with the stream of {name!r}: give on=..., the columns to match")
    theirs = [c for c in other.df.columns if c not in BOOKKEEPING]
    _check_on(stream, keys, theirs, f"the stream of {name!r}")
    _check_clash(stream, [c for c in theirs if c not in keys], f"the stream of {name!r}")

    left = stream.frame.withColumn("_kf_lt", F.timestamp_millis("_kf_time")).withWatermark(
        "_kf_lt", f"{_delay(stream.source)} milliseconds"
    )
    right = other.df.select(
        *[F.col(k).alias(f"_kf_r_{k}") for k in keys],
        *[c for c in theirs if c not in keys],
        F.timestamp_millis("_kf_time").alias("_kf_rt"),
    ).withWatermark("_kf_rt", f"{_delay(other.source)} milliseconds")
    span = F.expr(f"INTERVAL {within_ms} MILLISECONDS")
    condition = F.col("_kf_rt").between(F.col("_kf_lt") - span, F.col("_kf_lt") + span)
    for key in keys:
        condition = condition & (left[key] == right[f"_kf_r_{key}"])
    joined = left.join(right, condition, how).drop(
        "_kf_lt", "_kf_rt", *[f"_kf_r_{k}" for k in keys]
    )
    carries = (other.source, other.parsed)
    reason = f"behind the watermark of the join of {stream.source.topic!r} with {name!r}"
    taps = (
        _tap(stream.frame, stream.source.topic, keys, reason),
        _tap(other.df, name, keys, reason),
    )
    return _joined(stream, joined, Joined("stream", name, keys, how, within_ms, carries, taps))


def _tap(side: DataFrame, topic: str, keys: Sequence[str], reason: str) -> DataFrame:
    """One side of a stream join as it enters the join, as ``behind`` rows (the runtime's
    output columns): where each event came from, its event time and its ``on`` values (as
    ``key``, a JSON array like a window's late key, and as ``row``, a JSON object)."""
    on = F.struct(*[F.col(k) for k in keys])
    return side.select(
        F.lit(BEHIND).alias("kind"),
        key_json(keys).alias("key"),
        F.to_json(on, {"ignoreNullFields": "false"}).alias("row"),
        F.lit(reason).alias("reason"),
        F.lit(topic).alias("src_topic"),
        F.col("_kf_partition").alias("src_partition"),
        F.col("_kf_offset").alias("src_offset"),
        F.col("_kf_time").alias("event_time"),
    )


def stream_joined(source: Source) -> bool:
    """Whether a stream of ``source`` went through a stream-stream join: its rows carry the
    join's watermark, which Spark propagates to a window operator or stateful function
    after the join (they declare none of their own then)."""
    return any(j.kind == "stream" for j in source.joins)


def refuse_after_stream_join(source: Source, what: str) -> None:
    """KF754 if a stream of ``source`` went through a stream-stream join: a join declares
    a watermark on each side, which Spark refuses after a stateful operator ("Redefining
    watermark is disallowed", when the query runs)."""
    joined = next((j for j in source.joins if j.kind == "stream"), None)
    if joined is not None:
        raise StateAfterStreamJoinError(
            f"{what} cannot follow the join of {source.topic!r} with the stream of "
            f"{joined.name!r}: write the joined stream to a topic and read that in another job"
        )


def _delay(source: Source) -> int:
    """How far a side's join watermark trails its events: an event the source still
    accepts (within its allowed lateness) must still find its match."""
    return source.watermark_ms + source.lateness_ms


def _joined(stream: Side, frame: DataFrame, joined: Joined) -> tuple[DataFrame, Source]:
    # On the source, the join survives what derives a stream from this one
    # (Stream.process makes a new Stream from a copy of the source).
    return frame, dataclasses.replace(stream.source, joins=(*stream.source.joins, joined))


def _check_how(how: str, name: str) -> None:
    if how not in _HOW:
        raise JoinSpecError(f"join with {name!r}: how={how!r}, expected 'left' or 'inner'")


def _check_on(stream: Side, keys: Sequence[str], theirs: Sequence[str], what: str) -> None:
    ours = [c for c in stream.df.columns if not c.startswith("_kf_")]
    for key in keys:
        if key not in ours:
            raise JoinColumnError(
                f"join with {what}: the stream of {stream.source.topic!r} has no column "
                f"{key!r} (columns: {', '.join(ours)})"
            )
        if key not in theirs:
            raise JoinColumnError(
                f"join with {what}: it has no column {key!r} (columns: {', '.join(theirs)})"
            )


def _check_clash(stream: Side, theirs: Sequence[str], what: str) -> None:
    ours = set(stream.df.columns)
    for column in theirs:
        if column in ours:
            raise JoinColumnClashError(
                f"join with {what}: both have a column {column!r}; rename or drop it on one "
                "side (Reference.select / Stream.select)"
            )
