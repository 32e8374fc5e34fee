"""A job on the job API in Spark's real-time mode (``kappaflow jobs start --real-time``).

Real-time mode runs long batches (``CHECKPOINT_INTERVAL``) whose tasks hand each record
on as it comes, so a window's change reaches its topic milliseconds after its event. It
takes JVM operators only: a job whose per-event work runs in Python (a ``@kf.stateful``
function, a UDF) is refused (KF736), naming the operator, as are the operators and sinks
kappaflow does not run in that mode yet (session windows, joins, lake tables). Windows run
on the engine's Java operator on the executors' clock (windowing.py ``real_time``).

Each output is one query, written by its tasks record by record (RealtimeOutput.java): no
Kafka transaction can span a batch of minutes, so the outputs are at least once, keyed
and versioned instead. A window's change is keyed by its key and start, and carries its
version (``batch`` is null); a batch run again after a failure sends the same keys and
versions again, and the serving store takes a window's value only over a lower version.
A late event's record names its source position but not its bytes, and dead letters go
to ``JOB.dlq`` as in micro-batches. No statistics reach the store in this mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.errors import RealTimeModeError
from kappaflow.serving.client import redis_prefix
from kappaflow.streams.job import Job, Output
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.kinds import CHANGES, DEAD, LATE, RECORD
from kappaflow.streams.output.task_records import (
    _java,
    _jc,
    _number,
    _object,
    changelog_key_value,
    dead_letter_value,
    iso_text,
    window_held,
)
from kappaflow.streams.runtime import _dead_letters, _shaped, output_frame
from kappaflow.streams.sinks import KafkaSink, ParquetSink, PostgresSink, RedisSink


@dataclass(frozen=True)
class Store:
    """Where the tasks reach the serving store: its key prefix is per output."""

    url: str
    username: str | None
    password: str | None


def refuse_python(job: Job) -> None:
    """KF736 for the first output that real-time mode cannot run, naming what is in the
    way: a Python operator, a session window, a join, a lake table or a PostgreSQL table."""
    for output in job.outputs:
        where = f"job {job.name!r}, output {output.name!r}"
        stream = output.stream
        if stream.output_rows is not None:
            raise RealTimeModeError(
                f"{where}: the @kf.stateful function {stream.name!r} runs in Python, which "
                "real-time mode does not run: start the job without --real-time"
            )
        if output.aggregate is not None and output.aggregate.window.session:
            raise RealTimeModeError(
                f"{where}: session windows do not run in real-time mode yet: start the job "
                "without --real-time"
            )
        if stream.source.joins:
            raise RealTimeModeError(
                f"{where}: joins do not run in real-time mode yet: start the job without "
                "--real-time"
            )
        if stream.source.rejected:
            raise RealTimeModeError(
                f"{where}: records refused by Stream.reject do not reach the dead-letter "
                "topic in real-time mode yet: start the job without --real-time"
            )
        lakes = [s.table for s in output.sinks if isinstance(s, ParquetSink)]
        if lakes:
            raise RealTimeModeError(
                f"{where}: the lake table {lakes[0]!r} is written in micro-batches only: "
                "write it from a job without --real-time"
            )
        tables = [s.table for s in output.sinks if isinstance(s, PostgresSink)]
        if tables:
            raise RealTimeModeError(
                f"{where}: the PostgreSQL table {tables[0]!r} is written in micro-batches "
                "only: write it from a job without --real-time"
            )
        found = python_operator(stream.df)
        if found is not None:
            raise RealTimeModeError(
                f"{where}: {found} runs in Python, which real-time mode does not run: "
                "use Spark's functions (pyspark.sql.functions), or start the job without "
                "--real-time"
            )


def python_operator(frame: DataFrame) -> str | None:
    """The first operator of ``frame``'s plan that runs Python code, described (a UDF by
    its call), or None."""
    found = jvm_engine(frame.sparkSession).RealtimeOutput.pythonOperator(frame._jdf)
    if found is None:
        return None
    # ``f(amount#12L)``: the call as written, without Spark's expression ids.
    text = re.sub(r"#\d+L?", "", str(found))
    return text if text.startswith("the Python UDF") else f"a Python operator ({text})"


def slots(job: Job, partitions: dict[str, int]) -> int:
    """Task slots the job's real-time queries hold at once: per output, a task per
    partition of its source, and as many for its window operator's state."""
    total = 0
    for output in job.outputs:
        n = partitions[output.stream.source.topic]
        total += 2 * n if output.aggregate is not None else n
    # A source whose records every output filters or reshapes: its dead letters' query.
    total += sum(partitions[t] for t in _dead_letter_topics(job))
    return total


def _dead_letter_topics(job: Job) -> list[str]:
    """The sources no output carries the dead letters of: every output of theirs filters
    or reshapes the records, and real-time mode reads a source once per query (no union
    of a source with itself), so their dead letters go through a query of their own."""
    whole = {o.stream.source.topic for o in job.outputs if o.stream.whole}
    return list(
        dict.fromkeys(
            o.stream.source.topic for o in job.outputs if o.stream.source.topic not in whole
        )
    )


def start_real_time(
    job: Job,
    checkpoint_root: str,
    interval: str,
    kafka: dict[str, str],
    store: Store | None,
    partitions: dict[str, int],
) -> list[StreamingQuery]:
    """One started real-time query per output of ``job`` (refuse_python first)."""
    spark = job.spark
    engine = jvm_engine(spark)
    # Dead letters travel with the first output that reads its source whole.
    carried: set[str] = set(_dead_letter_topics(job))
    queries: list[StreamingQuery] = []
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        for output in job.outputs:
            topic = output.stream.source.topic
            # The window operator's state has as many partitions as the source: a task each.
            spark.conf.set("spark.sql.shuffle.partitions", str(partitions[topic]))
            frame, _ = output_frame(output, dead_letters=topic not in carried, real_time=True)
            carried.add(topic)
            rows = records(job, output, frame)
            wants_store = store is not None and any(isinstance(s, RedisSink) for s in output.sinks)
            jquery = engine.RealtimeOutput.start(
                rows._jdf,
                f"{job.name}.{output.name}",
                f"{checkpoint_root.rstrip('/')}/{output.name}",
                interval,
                json.dumps(kafka),
                redis_prefix(job.name, output.name),
                store.url if wants_store and store is not None else "",
                (store.username if store is not None else None) or "",
                (store.password if store is not None else None) or "",
            )
            queries.append(StreamingQuery(jquery))
        for topic in _dead_letter_topics(job):
            first = next(o for o in job.outputs if o.stream.source.topic == topic)
            source = first.stream.source
            letters = _shaped(_dead_letters(first.stream.parsed))
            value = dead_letter_value(
                letters, job=job.name, schema=source.schema.name, source_topic=topic
            )
            rows = letters.select(
                _kafka(F.lit(f"{job.name}.dlq"), F.lit(None), value).alias("_out")
            ).select("_out.*")
            name = f"{topic}-dead-letters"
            jquery = engine.RealtimeOutput.start(
                rows._jdf,
                f"{job.name}.{name}",
                f"{checkpoint_root.rstrip('/')}/{name}",
                interval,
                json.dumps(kafka),
                "",
                "",
                "",
                "",
            )
            queries.append(StreamingQuery(jquery))
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous or "4")
    return queries


def records(job: Job, output: Output, frame: DataFrame) -> DataFrame:
    """An output's rows (runtime.OUTPUT_COLUMNS) as RealtimeOutput.java's: Kafka records
    (topic, key, value) and serving-store writes (target, skey, field, svalue, version).

    One projection and an explode, not a union: real-time mode takes no union after a
    stateful operator."""
    source = output.stream.source
    topics = tuple(
        s.topic or f"{job.name}.{output.name}" for s in output.sinks if isinstance(s, KafkaSink)
    )
    kind = F.col("kind")
    out: list[Column] = []
    keys = output.aggregate.keys if output.aggregate is not None else ()
    if output.aggregate is not None:
        change = kind.isin(*CHANGES)
        record_key, value = changelog_key_value(frame, keys, None)
        out += [F.when(change, _kafka(F.lit(t), record_key, value)) for t in topics]
        late = _late(frame, output.name, source.topic, keys)
        out.append(F.when(kind == LATE, _kafka(F.lit(f"{job.name}.late"), F.col("key"), late)))
    else:
        key = _java(frame, "pick", _jc(F.col("row")), json.dumps(list(source.keys)))
        record_key = key if source.keys else F.lit(None).cast("string")
        out += [F.when(kind == RECORD, _kafka(F.lit(t), record_key, F.col("row"))) for t in topics]
    letter = dead_letter_value(
        frame, job=job.name, schema=source.schema.name, source_topic=source.topic
    )
    out.append(F.when(kind == DEAD, _kafka(F.lit(f"{job.name}.dlq"), F.lit(None), letter)))
    if any(isinstance(s, RedisSink) for s in output.sinks):
        if output.aggregate is not None:
            field = F.col("window_start").cast("string")
            stored = _store(F.lit("w"), F.col("key"), field, window_held(), F.col("version"))
            out.append(F.when(kind.isin(*CHANGES), stored))
        else:
            latest = _store(F.lit("latest"), F.lit(None), key, F.col("row"), F.lit(0))
            out.append(F.when(kind == RECORD, latest))
    return (
        frame.select(F.explode(F.array(*out)).alias("_out"))
        .where(F.col("_out").isNotNull())
        .select("_out.*")
    )


def _late(frame: DataFrame, output: str, source_topic: str, keys: Sequence[str]) -> Column:
    """The late topic's record of a late event: its window, key and position (in
    real-time mode, not its bytes, which a micro-batch job reads back from the source)."""
    return _object(
        [
            ("output", F.lit(json.dumps(output))),
            ("reason", _java(frame, "quote", _jc(F.col("reason")))),
            ("watermark", iso_text(F.col("watermark"))),
            ("key", _java(frame, "named", _jc(F.col("key")), json.dumps(list(keys)))),
            ("window_start", iso_text(F.col("window_start"))),
            ("window_end", iso_text(F.col("window_end"))),
            ("event", F.lit("null")),
            ("source_topic", F.lit(json.dumps(source_topic))),
            ("source_partition", _number(F.col("src_partition"))),
            ("source_offset", _number(F.col("src_offset"))),
        ]
    )


def _kafka(topic: Column, key: Column, value: Column) -> Column:
    return _row(topic, key.cast("binary"), value.cast("binary"), *([F.lit(None)] * 5))


def _store(target: Column, key: Column, field: Column, value: Column, version: Column) -> Column:
    return _row(*([F.lit(None)] * 3), target, key, field, value, version)


def _row(*values: Column) -> Column:
    types = ("string", "binary", "binary", "string", "string", "string", "string", "bigint")
    names = ("topic", "key", "value", "target", "skey", "field", "svalue", "version")
    return F.struct(*[v.cast(t).alias(n) for v, t, n in zip(values, types, names, strict=True)])


__all__ = ["Store", "python_operator", "records", "refuse_python", "slots", "start_real_time"]
