"""From a declared job to running queries: one query per output.

An output's query computes its rows (a windowed aggregate's changes, or a plain stream's
records) and, for the first output of each source, that source's dead letters, in one
DataFrame; its batch writer (writer.py) sends each batch to all the output's sinks. The
same code runs a job for real (Kafka, Redis, the lake) and under the test harness
(kappaflow.testing), which swaps the source reader and the backends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import StructType

from kappaflow.errors import (
    BuildFailedError,
    InvalidJobError,
    InvalidSinkError,
    KappaflowError,
    WaitTimeoutError,
)
from kappaflow.kafka.topics import COMPACTED
from kappaflow.streams.formats import AvroFormat, ProtobufFormat, registry_url
from kappaflow.streams.job import Job, Output
from kappaflow.streams.joins import stream_joined
from kappaflow.streams.kinds import DEAD, RECORD, REPLAY
from kappaflow.streams.model import BOOKKEEPING, REPLAY_COLUMN, Reader, Source
from kappaflow.streams.ops import avro as avro_ops
from kappaflow.streams.ops import protobuf as protobuf_ops
from kappaflow.streams.ops.session_windows import aggregate_sessions
from kappaflow.streams.ops.windowing import aggregate_windows, bind_aggregates
from kappaflow.streams.output.backends import Publisher, ResultStore
from kappaflow.streams.output.lake_delta import DeltaLakeWriter
from kappaflow.streams.output.postgres import (
    PostgresTable,
    PostgresWriter,
    aggregate_table,
    stream_table,
    value_types,
)
from kappaflow.streams.output.task_records import json_key_type
from kappaflow.streams.output.writer import OutputTarget, OutputWriter, StepHook
from kappaflow.streams.sinks import KafkaSink, ParquetSink, PostgresSink, RedisSink
from kappaflow.streams.window_engine import record_aggregates, window_engine
from kappaflow.waiting import wait_for

#: How long a job's query may take over its first micro-batch before the next query
#: starts. A query's first batch starts Python processes on the driver (the check of a
#: stateful function's state schema among them), and Spark gives each ten seconds to
#: connect back: a job of several stateful queries started all at once on a busy machine
#: misses that and has to restart. So the queries start one after another.
FIRST_BATCH_WAIT_S = 20.0

#: Every output query's rows, whatever they are (writer.py routes them by ``kind``).
OUTPUT_COLUMNS = (
    ("kind", "string"),
    ("key", "string"),
    ("window_start", "bigint"),
    ("window_end", "bigint"),
    ("values", "string"),
    ("previous", "string"),
    ("version", "bigint"),
    ("watermark", "bigint"),
    ("events", "bigint"),
    ("duplicates", "bigint"),
    # A window operator's change in what its state holds: keys of a window, or sessions.
    ("held", "bigint"),
    ("reason", "string"),
    ("value", "binary"),
    # Which of the job's dead letters a replayed record is (``PARTITION:OFFSET``).
    ("replay", "string"),
    ("row", "string"),
    # Where a late event or dead letter came from (the topic: only where it may be a
    # joined stream's rather than the output's source).
    ("src_topic", "string"),
    ("src_partition", "int"),
    ("src_offset", "bigint"),
    # An event's time, on the ``behind`` rows of a stream join's inputs.
    ("event_time", "bigint"),
    ("offsets", "array<bigint>"),
    # A window operator's rows, packed (``kind`` "packed"): the writer unpacks them.
    ("packed", "binary"),
)

#: A user's job: a function that declares it.
Build = Callable[[Job], None]


__all__ = ["Backends", "Build", "Reader", "declare", "describe", "start_outputs"]


@dataclass
class Backends:
    """Where a run's outputs go, and where its state lives."""

    publisher: Publisher
    store: ResultStore | None
    #: The root of the job's checkpoints (a local path or a Hadoop URI).
    checkpoint_root: str
    #: The lake's root: tables named by a name live in ``<lake_root>/JOB/NAME``.
    lake_root: str
    #: Where each output's status file goes (``<jobs>/JOB/outputs``), if anywhere.
    status_dir: Path | None = None
    #: The least time between two micro-batch starts of a query (0: back to back).
    trigger_ms: int = 0
    #: The PostgreSQL a ``kf.postgres()`` sink without a ``dsn`` writes to (None: none).
    postgres_dsn: str | None = None


def declare(
    build: Build, name: str, params: Mapping[str, str], spark: SparkSession, reader: Reader
) -> Job:
    """Run the user's ``build`` on a new job; a failure in it is the user's, said so."""
    job = Job(name, params, spark, reader)
    try:
        build(job)
    except KappaflowError:
        raise
    except Exception as exc:
        where = getattr(build, "__qualname__", repr(build))
        first = f"{type(exc).__name__}: {exc}".splitlines()[0]
        raise BuildFailedError(f"{where}(job) failed: {first}") from None
    if not job.outputs:
        raise InvalidJobError(f"job {name!r} declares no output: call .to(...) on a result")
    return job


def output_topics(job: Job) -> list[str]:
    """Every topic the job publishes to."""
    return sorted(topic_configs(job))


def topic_configs(job: Job) -> dict[str, dict[str, str]]:
    """Every topic the job publishes to, with the configuration it is created with."""
    topics: dict[str, dict[str, str]] = {f"{job.name}.late": {}, f"{job.name}.dlq": {}}
    for output in job.outputs:
        for sink in output.sinks:
            if isinstance(sink, KafkaSink):
                name = sink.topic or f"{job.name}.{output.name}"
                topics[name] = dict(COMPACTED) if sink.compact else topics.get(name, {})
    return topics


def start_outputs(
    job: Job,
    reader: Reader,
    backends: Backends,
    *,
    available_now: bool = False,
    on_step: StepHook | None = None,
    stopping: threading.Event | None = None,
) -> list[StreamingQuery]:
    """One started query per output of ``job``, each started once the one before has
    reported its first trigger (or FIRST_BATCH_WAIT_S has passed). Once ``stopping`` is
    set, no more are started: the queries started so far are returned."""
    queries: list[StreamingQuery] = []
    carried: set[str] = set()
    refused: set[int] = set()
    joined: dict[str, tuple[Source, DataFrame]] = {}
    for output in job.outputs:
        topic = output.stream.source.topic
        # A refused record goes to the dead-letter topic once, with the first output of
        # a stream that refused it.
        rejects = [r for r in output.stream.source.rejected if id(r) not in refused]
        refused.update(id(r) for r in rejects)
        # A window runs on the operator its checkpoint was started with.
        engine = None
        if output.aggregate is not None:
            engine = window_engine(job.spark, backends.checkpoint_root, output.name)
            _record_aggregates(job, output, backends)
        frame, packed = output_frame(
            output, dead_letters=topic not in carried, rejects=rejects, engine=engine
        )
        carried.add(topic)
        for join in output.stream.source.joins:
            if join.carries is not None:
                joined.setdefault(join.name, join.carries)
        target = _target(job, output, backends, packed=packed)
        # Spark runs a stream-stream join in append mode only: a match is output once,
        # and a window or stateful function after it runs on the join's watermark.
        mode = "append" if any(j.kind == "stream" for j in output.stream.source.joins) else "update"
        if not _first_batch(queries, stopping):
            return queries
        queries.append(_start(frame, target, backends, reader, on_step, mode, available_now))
    # A joined topic's records that do not parse reach the dead-letter topic through a
    # query of their own, unless an output of that topic carries them already.
    for topic, (source, parsed) in joined.items():
        if topic in carried:
            continue
        target = OutputTarget(
            job=job.name,
            name=f"{topic}-dead-letters",
            source=source,
            keys=(),
            topics=(),
            redis=False,
            lakes=(),
            checkpoint=_checkpoint(backends, f"{topic}-dead-letters"),
            status_dir=backends.status_dir,
        )
        frame = _shaped(_dead_letters(parsed))
        if not _first_batch(queries, stopping):
            return queries
        queries.append(_start(frame, target, backends, reader, on_step, "append", available_now))
    return queries


def _record_aggregates(job: Job, output: Output, backends: Backends) -> None:
    """Record what a window output's state holds, for reading it back (window_engine)."""
    agg = output.aggregate
    assert agg is not None
    names, bound = bind_aggregates(output.stream.df, agg.keys, agg.aggregates, None)
    record_aggregates(job.spark, backends.checkpoint_root, output.name, names, bound)


def _first_batch(started: Sequence[StreamingQuery], stopping: threading.Event | None) -> bool:
    """Wait until the last query started has reported its first trigger or stopped, at
    most FIRST_BATCH_WAIT_S; whether the next may start (False: ``stopping`` is set)."""

    def stop_asked() -> bool:
        return stopping is not None and stopping.is_set()

    if started:
        query = started[-1]
        with contextlib.suppress(WaitTimeoutError):
            wait_for(
                lambda: (
                    True
                    if query.lastProgress is not None or not query.isActive or stop_asked()
                    else None
                ),
                timeout=FIRST_BATCH_WAIT_S,
                interval=0.1,
                what=f"the first batch of {query.name}",
            )
    return not stop_asked()


def _start(
    frame: DataFrame,
    target: OutputTarget,
    backends: Backends,
    reader: Reader,
    on_step: StepHook | None,
    mode: str,
    available_now: bool,
) -> StreamingQuery:
    writer = OutputWriter(target, backends.publisher, backends.store, reader, on_step)
    stream = (
        frame.writeStream.queryName(f"{target.job}.{target.name}")
        .outputMode(mode)
        .option("checkpointLocation", target.checkpoint)
        .foreachBatch(writer)
    )
    stream = (
        stream.trigger(availableNow=True)
        if available_now
        else stream.trigger(processingTime=f"{backends.trigger_ms} milliseconds")
    )
    return stream.start()


def output_frame(
    output: Output,
    *,
    dead_letters: bool,
    rejects: Sequence[DataFrame] = (),
    engine: str | None = None,
    real_time: bool = False,
) -> tuple[DataFrame, bool]:
    """The rows of an output's query (OUTPUT_COLUMNS), with ``rejects``: records
    ``Stream.reject`` refused, as dead letters; and whether they hold a Python window
    operator's packed rows, which the writer unpacks. ``engine``: the window operator's
    (python or jvm; None: the session's). ``real_time``: for Spark's real-time mode, the
    Java window operator on the executors' clock (windowing.aggregate_windows)."""
    stream = output.stream
    packed = False
    source = stream.source
    # A whole source's dead letters travel with its rows: the source is read once.
    carried = dead_letters and stream.whole and stream.output_rows is None
    if output.aggregate is not None:
        agg = output.aggregate
        watermark = None if stream_joined(source) else source.watermark_ms
        if agg.window.session:
            rows = aggregate_sessions(
                stream.parsed if carried else stream.df,
                keys=agg.keys,
                aggregates=agg.aggregates,
                gap_ms=agg.window.size_ms,
                watermark_ms=watermark,
                lateness_ms=source.lateness_ms,
                id_column=source.id,
                dead_letters=carried,
                engine=engine,
            )
        else:
            rows = aggregate_windows(
                stream.parsed if carried else stream.df,
                keys=agg.keys,
                aggregates=agg.aggregates,
                size_ms=agg.window.size_ms,
                slide_ms=agg.window.slide_ms,
                watermark_ms=watermark,
                lateness_ms=source.lateness_ms,
                id_column=source.id,
                dead_letters=carried,
                engine=engine,
                real_time=real_time,
            )
        if "rows" in rows.columns:
            # The Python operators' rows come packed; the engine's Java operator's do not.
            rows = rows.select(F.lit("packed").alias("kind"), F.col("rows").alias("packed"))
            packed = True
        elif carried and not real_time:
            # The Java operators send a replayed dead letter out as a replay row, and name
            # the dead letter a replay that failed again replays, in the key column.
            apart = F.col("kind").isin(DEAD, REPLAY)
            rows = rows.withColumn("replay", F.when(apart, F.col("key"))).withColumn(
                "key", F.when(~apart, F.col("key"))
            )
    elif stream.output_rows is not None:
        rows = stream.output_rows
    else:
        row = F.to_json(F.struct(*[c for c in stream.df.columns if c not in BOOKKEEPING]))
        position = (
            F.col("_kf_partition").alias("src_partition"),
            F.col("_kf_offset").alias("src_offset"),
        )
        if carried:
            good = F.col("_kf_reason").isNull()
            rows = stream.parsed.select(
                F.when(good, F.lit(RECORD)).otherwise(F.lit(DEAD)).alias("kind"),
                F.when(good, row).alias("row"),
                F.col("_kf_reason").alias("reason"),
                F.col("_kf_value").alias("value"),
                _replay(stream.parsed).alias("replay"),
                *position,
            )
        else:
            rows = stream.df.select(F.lit(RECORD).alias("kind"), row.alias("row"), *position)
    frame = _shaped(rows)
    if dead_letters and not carried:
        frame = frame.unionByName(_shaped(_dead_letters(stream.parsed, replays=True)))
    elif carried and packed:
        # The Python window operators know nothing of replays: the source's replayed dead
        # letters are read again here (a second read of the source, filtered to them), to
        # be counted. Real-time mode runs the Java operators, which count them only in
        # micro-batches.
        frame = frame.unionByName(_shaped(_replays(stream.parsed)))
    for refused in rejects:
        frame = frame.unionByName(_shaped(_dead_letters(refused)))
    for join in source.joins:
        for tap in join.taps:
            frame = frame.unionByName(_shaped(tap))
    return frame, packed


def _dead_letters(parsed: DataFrame, *, replays: bool = False) -> DataFrame:
    """The source's records that did not parse, as ``dlq`` rows; with ``replays``, its
    replayed dead letters that did parse too, as ``replay`` rows (counted, not sent)."""
    dead = F.col("_kf_reason").isNotNull()
    replay = _replay(parsed)
    wanted = dead | replay.isNotNull() if replays else dead
    return parsed.where(wanted).select(
        F.when(dead, F.lit(DEAD)).otherwise(F.lit(REPLAY)).alias("kind"),
        F.col("_kf_reason").alias("reason"),
        F.when(dead, F.col("_kf_value")).alias("value"),
        replay.alias("replay"),
        F.col("_kf_partition").alias("src_partition"),
        F.col("_kf_offset").alias("src_offset"),
    )


def _replays(parsed: DataFrame) -> DataFrame:
    """The source's replayed dead letters, as ``replay`` rows, with their verdict."""
    replay = _replay(parsed)
    return parsed.where(replay.isNotNull()).select(
        F.lit(REPLAY).alias("kind"),
        F.col("_kf_reason").alias("reason"),
        replay.alias("replay"),
        F.col("_kf_partition").alias("src_partition"),
        F.col("_kf_offset").alias("src_offset"),
    )


def _replay(parsed: DataFrame) -> Column:
    """Which dead letter each record replays (null: none; a source read without the
    replay column, as a joined topic's, has none)."""
    if REPLAY_COLUMN in parsed.columns:
        return F.col(REPLAY_COLUMN)
    return F.lit(None).cast("string")


def _shaped(frame: DataFrame) -> DataFrame:
    """``frame`` with exactly OUTPUT_COLUMNS: missing ones null (or 0 for counts)."""
    columns = []
    for name, kind in OUTPUT_COLUMNS:
        if name in frame.columns:
            columns.append(F.col(name).cast(kind).alias(name))
        elif kind == "bigint":
            columns.append(F.lit(0).cast(kind).alias(name))
        else:
            columns.append(F.lit(None).cast(kind).alias(name))
    return frame.select(*columns)


def _avro_topics(job: Job, output: Output, rows: StructType) -> tuple[tuple[str, int, str], ...]:
    """Each Avro topic sink's topic, with its schema registered under its subject now, at
    the job's start (KF755 when the subject refuses it, naming the field)."""
    found = []
    for sink in output.sinks:
        if not isinstance(sink, KafkaSink) or not isinstance(sink.format, AvroFormat):
            continue
        if output.aggregate is not None:
            raise InvalidSinkError(
                f"output {output.name}: Avro records are a stream's rows; an aggregate's "
                "changelog is JSON (kf.topic() without format=)"
            )
        url = registry_url(sink.format, job._reader)
        ident, schema = avro_ops.register_output(
            url, sink.format.subject, rows, f"{job.name}_{output.name}"
        )
        found.append((sink.topic or f"{job.name}.{output.name}", ident, schema))
    return tuple(found)


def _protobuf_topics(
    job: Job, output: Output, rows: StructType
) -> tuple[tuple[str, int, str, str], ...]:
    """Each Protobuf topic sink's topic, with the .proto of its rows registered under its
    subject now (KF755 when the subject refuses it), its descriptors and message."""
    found = []
    for sink in output.sinks:
        if not isinstance(sink, KafkaSink) or not isinstance(sink.format, ProtobufFormat):
            continue
        if output.aggregate is not None:
            raise InvalidSinkError(
                f"output {output.name}: Protobuf records are a stream's rows; an aggregate's "
                "changelog is JSON (kf.topic() without format=)"
            )
        url = registry_url(sink.format, job._reader)
        ident, descriptors, message = protobuf_ops.register_output(
            url, sink.format.subject, rows, f"{job.name}_{output.name}"
        )
        found.append((sink.topic or f"{job.name}.{output.name}", ident, descriptors, message))
    return tuple(found)


def _target(job: Job, output: Output, backends: Backends, *, packed: bool) -> OutputTarget:
    topics = tuple(
        sink.topic or f"{job.name}.{output.name}"
        for sink in output.sinks
        if isinstance(sink, KafkaSink)
    )
    lakes = tuple(
        DeltaLakeWriter(
            job.spark,
            _lake_path(sink.table, job.name, backends.lake_root),
            partition_by=sink.partition_by,
            by_date=sink.by_date,
            app_id=f"kappaflow/{job.name}/{output.name}",
        )
        for sink in output.sinks
        if isinstance(sink, ParquetSink)
    )
    user = output.stream.df.drop(*BOOKKEEPING)
    state = output.stream.state_definition
    agg = output.aggregate
    types = {f.name: f.dataType for f in output.stream.df.schema.fields}
    postgres = tuple(
        PostgresWriter(table) for table in postgres_tables(job, output, backends.postgres_dsn)
    )
    return OutputTarget(
        avro=_avro_topics(job, output, user.schema),
        protobuf=_protobuf_topics(job, output, user.schema),
        postgres=postgres,
        aggregated=agg is not None,
        packed=packed,
        key_types=tuple((k, types[k]) for k in agg.keys) if agg is not None else (),
        value_names=tuple(agg.aggregates) if agg is not None else (),
        job=job.name,
        name=output.name,
        source=output.stream.source,
        keys=output.aggregate.keys if output.aggregate is not None else (),
        topics=topics,
        redis=any(isinstance(sink, RedisSink) for sink in output.sinks),
        lakes=lakes,
        row_schema=user.schema if output.aggregate is None else None,
        checkpoint=_checkpoint(backends, output.name),
        joined_streams=any(join.taps for join in output.stream.source.joins),
        status_dir=backends.status_dir,
        records_are_events=output.aggregate is None and state is None,
        late_keys=(
            output.aggregate.keys
            if output.aggregate is not None
            else tuple(state["by"])
            if state is not None
            else ()
        ),
    )


def postgres_tables(job: Job, output: Output, default_dsn: str | None) -> list[PostgresTable]:
    """The PostgreSQL tables of ``output``'s ``kf.postgres()`` sinks, their columns
    resolved."""
    tables = []
    for sink in output.sinks:
        if not isinstance(sink, PostgresSink):
            continue
        dsn = sink.dsn or default_dsn
        if dsn is None:
            raise InvalidSinkError(
                f"postgres sink {sink.table!r} of {job.name}.{output.name}: no database "
                "(give dsn=; the test harness has no PostgreSQL of its own)"
            )
        agg = output.aggregate
        if agg is not None:
            types = {f.name: f.dataType for f in output.stream.df.schema.fields}
            keys = [(k, json_key_type(types[k])) for k in agg.keys]
            values = value_types(agg.aggregates, types)
            tables.append(aggregate_table(sink.table, dsn, keys, values, sink.key))
        else:
            schema = output.stream.df.drop(*BOOKKEEPING).schema
            key = sink.key or output.stream.source.keys
            tables.append(stream_table(sink.table, dsn, schema, key))
    return tables


def lake_paths(job: Job, lake_root: str) -> list[str]:
    """Where the job's lake tables live."""
    return [
        _lake_path(sink.table, job.name, lake_root)
        for output in job.outputs
        for sink in output.sinks
        if isinstance(sink, ParquetSink)
    ]


def _lake_path(table: str, job: str, root: str) -> str:
    if table.startswith("/") or "://" in table:
        return table
    return f"{root.rstrip('/')}/{job}/{table}"


def describe(job: Job, lake_root: str | None = None) -> dict[str, Any]:
    """The job's plan: sources, outputs, their sinks and what each guarantees; with
    ``lake_root``, each lake table's location too."""
    outputs = []
    for output in job.outputs:
        sinks: list[dict[str, Any]] = []
        for sink in output.sinks:
            if isinstance(sink, KafkaSink):
                sinks.append(
                    {
                        "kafka": sink.topic or f"{job.name}.{output.name}",
                        "guarantee": "exactly once for read_committed consumers",
                    }
                )
            elif isinstance(sink, RedisSink):
                sinks.append(
                    {
                        "redis": f"kf:{job.name}:{output.name}:",
                        "guarantee": "exactly once (idempotent writes)",
                    }
                )
            elif isinstance(sink, PostgresSink):
                sinks.append(
                    {
                        "postgres": sink.table,
                        "key": list(
                            sink.key
                            or (
                                output.stream.source.keys
                                if output.aggregate is None
                                else (*output.aggregate.keys, "window_start")
                            )
                        ),
                        "guarantee": "exactly once (a transaction and a marker per batch "
                        "and partition)",
                    }
                )
            else:
                lake: dict[str, Any] = {
                    "parquet": sink.table,
                    "partition_by": list(sink.partition_by),
                    "by_date": sink.by_date,
                    "guarantee": "exactly once for readers of committed files",
                }
                if lake_root is not None:
                    lake["location"] = _lake_path(sink.table, job.name, lake_root)
                sinks.append(lake)
        entry: dict[str, Any] = {
            "name": output.name,
            "source": output.stream.source.topic,
            "sinks": sinks,
        }
        if output.stream.source.joins:
            entry["joins"] = [j.describe() for j in output.stream.source.joins]
        if output.stream.state_definition is not None:
            entry["stateful"] = output.stream.state_definition
        if output.aggregate is not None:
            agg = output.aggregate
            entry["window"] = {
                "size_ms": agg.window.size_ms,
                "slide_ms": agg.window.slide_ms,
                "session": agg.window.session,
            }
            entry["by"] = list(agg.keys)
            entry["aggregates"] = {k: repr(v) for k, v in agg.aggregates.items()}
        outputs.append(entry)
    return {
        "job": job.name,
        "sources": [
            {
                "topic": s.topic,
                "schema": s.schema.name,
                "key": list(s.keys),
                "time": s.time,
                "id": s.id,
                "watermark_ms": s.watermark_ms,
                "allowed_lateness_ms": s.lateness_ms,
                "start": s.start,
            }
            for s in job.sources
        ],
        "tables": [t.describe() for t in job.tables],
        "outputs": outputs,
        "dead_letters": f"{job.name}.dlq",
        "late": f"{job.name}.late",
    }


def _checkpoint(backends: Backends, query: str) -> str:
    """Where a query of the job keeps its checkpoint (a local path or a Hadoop URI)."""
    return f"{backends.checkpoint_root}/{query}"
