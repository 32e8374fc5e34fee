"""What a user's ``build(job)`` function declares: sources, streams, windowed aggregates
and their sinks.

Declaring builds streaming DataFrames at once (so ``stream.df`` is a real one) but starts
nothing: after ``build`` returns, the runtime (runtime.py) starts one query per output,
with all the output's sinks in one batch writer. Every stream keeps kappaflow's
bookkeeping columns beside the user's (``_kf_time``: event time in epoch ms,
``_kf_partition`` and ``_kf_offset``: where in the source the row came from), which is
how late events are found and reported again with their original bytes. Until a stream
is processed or aggregated it also keeps the record as Kafka held it: its bytes, topic
and timestamp (``logged_at``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kappaflow.errors import (
    InvalidJobError,
    InvalidSinkError,
    InvalidWindowError,
    MissingParameterError,
    UnknownColumnError,
)
from kappaflow.registry.client import Registered, RegistryClient
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.formats import AvroFormat, ProtobufFormat, RegistryFormat, registry_url
from kappaflow.streams.joins import (
    Reference,
    change_events,
    join_stream,
    join_table,
    kafka_table,
    lake_table,
)
from kappaflow.streams.model import (
    _VERDICT,
    BOOKKEEPING,
    REPLAY_COLUMN,
    Reader,
    Side,
    Source,
    WindowSpec,
    millis,
    refusal,
)
from kappaflow.streams.ops import avro as avro_ops
from kappaflow.streams.ops import protobuf as protobuf_ops
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.schema import RecordSchema, change_model, compile_schema
from kappaflow.streams.sinks import KafkaSink, ParquetSink, PostgresSink, RedisSink, Sink
from kappaflow.streams.stateful_plan import process_stream

if TYPE_CHECKING:
    from kappaflow.streams.stateful import StatefulFunction


@dataclass
class Output:
    """Something the job writes: a stream's rows or an aggregate's changes, and where."""

    name: str
    stream: Stream
    sinks: tuple[Sink, ...]
    aggregate: Aggregation | None = None


@dataclass(frozen=True)
class Aggregation:
    """A windowed aggregate: windows, key columns and named aggregates."""

    window: WindowSpec
    keys: tuple[str, ...]
    aggregates: Mapping[str, Aggregate]


class Job:
    """The job being declared, as ``build`` gets it."""

    def __init__(
        self,
        name: str,
        params: Mapping[str, str],
        spark: SparkSession,
        reader: Reader,
    ) -> None:
        self.name = name
        self.params = dict(params)
        self.spark = spark
        self._reader = reader
        self.sources: list[Source] = []
        self.tables: list[Reference] = []
        self.outputs: list[Output] = []
        #: The prefix ``param`` puts before a key (``scoped``).
        self._scope = ""

    def param(self, key: str, default: str | None = None) -> str:
        """The job parameter ``key`` (``-P key=value``), or ``default``."""
        value = self.params.get(self._scope + key, default)
        if value is None:
            raise MissingParameterError(
                f"job {self.name!r} needs the parameter {self._scope + key!r}"
            )
        return value

    def scoped(self, prefix: str) -> Job:
        """The job as one part of it sees it: the same job, whose sources, tables and
        outputs it declares, with its parameters read under ``PREFIX.``: ``param("source")``
        is ``-P PREFIX.source=...``. A job made of other jobs' ``build`` functions gives
        each a scope of its own (kappaflow.iot.app)."""
        if not prefix or "." in prefix:
            raise InvalidJobError(f"scoped({prefix!r}): give a name without dots")
        view = copy.copy(self)
        view._scope = f"{self._scope}{prefix}."
        return view

    def source(
        self,
        topic: str,
        schema: type | RegistryFormat,
        *,
        format: RegistryFormat | None = None,
        key: str | Sequence[str] = (),
        time: str | None = None,
        id: str | None = None,
        watermark: str | int | timedelta = "10s",
        allowed_lateness: str | int | timedelta = "0s",
        start: str = "earliest",
    ) -> Stream:
        """The records of ``topic``, parsed as ``schema`` (a dataclass or pydantic model).

        ``time`` is the event-time field (default: the field typed ``EventTime``); the
        watermark trails the largest event time seen by ``watermark``; an event later
        than that may still correct a window for ``allowed_lateness``, and goes to the
        job's late topic after. Records that do not fit the schema go to the job's
        dead-letter topic, with the reason and their original bytes.

        ``format=kf.avro(subject)``: the records are Avro in the schema registry's wire
        format, and ``schema`` must be able to read the subject's latest schema (KF755
        names each field it cannot); ``job.source(topic, kf.avro(subject), time=...)``
        takes the record type from the subject's latest schema (docs/registry.md).
        ``format=kf.protobuf(subject)``: the same for Protobuf records (their message).
        """
        if isinstance(schema, AvroFormat | ProtobufFormat):
            format, model = schema, None
        else:
            model = schema
        return self._source(
            topic,
            model,
            key,
            time,
            id,
            watermark,
            allowed_lateness,
            start,
            format=format,
            shape=None,
        )

    def change_stream(
        self,
        topic: str,
        schema: type,
        *,
        key: str | Sequence[str] = (),
        watermark: str | int | timedelta = "10s",
        allowed_lateness: str | int | timedelta = "0s",
        start: str = "earliest",
    ) -> Stream:
        """Each change of a captured table (a topic of Debezium's change events,
        ``kappaflow connect create``) as an event, for windows and sinks: the row's
        ``schema`` columns as the change left them (a delete's: as they were, its key
        columns only unless the table has ``REPLICA IDENTITY FULL``, so columns other than
        ``key`` may be null), with ``op`` (``c`` insert, ``u`` update, ``d`` delete, ``r`` a
        snapshot's row), ``ts_ms`` (the event time: when the database committed the
        change) and ``lsn`` (its position in PostgreSQL's log). Tombstones are left out;
        a record that is not a change event goes to the dead-letter topic.
        ``job.changes`` reads the same topic as a table of the rows."""
        keys = (key,) if isinstance(key, str) else tuple(key)
        model = change_model(schema, keys)
        return self._source(
            topic,
            model,
            keys,
            "ts_ms",
            None,
            watermark,
            allowed_lateness,
            start,
            format=None,
            shape=change_events,
        )

    def _source(
        self,
        topic: str,
        model: type | None,
        key: str | Sequence[str],
        time: str | None,
        id: str | None,
        watermark: str | int | timedelta,
        allowed_lateness: str | int | timedelta,
        start: str,
        *,
        format: RegistryFormat | None,
        shape: Callable[[DataFrame], DataFrame] | None,
    ) -> Stream:
        keys = (key,) if isinstance(key, str) else tuple(key)
        versions: list[Registered] = []
        if format is not None:
            url = registry_url(format, self._reader)
            versions = RegistryClient(url).versions(format.subject)
            if model is not None:
                record = compile_schema(model)
            elif isinstance(format, ProtobufFormat):
                record = protobuf_ops.record_of(versions[-1], time, format.message)
            else:
                record = avro_ops.record_of(versions[-1], time)
        else:
            assert model is not None
            record = compile_schema(model)
        time_field = time or record.event_time
        if time_field is None:
            raise InvalidJobError(
                f"source {topic!r}: {record.name} has no EventTime field; give time=..."
            )
        for path in (*keys, time_field, *([id] if id else [])):
            record.field(path)
        found = Source(
            topic,
            record,
            keys,
            time_field,
            id,
            millis(watermark, "watermark"),
            millis(allowed_lateness, "allowed_lateness"),
            start,
            model,
        )
        self.sources.append(found)
        raw = self._reader.stream(self.spark, topic, start)
        if shape is not None:
            raw = shape(raw)
        if isinstance(format, ProtobufFormat):
            message = protobuf_ops.check_readable(record, versions[-1], format.message)
            raw = protobuf_ops.decode(raw, versions, message)
        elif format is not None:
            reader = (
                versions[-1].schema
                if model is None
                else avro_ops.check_readable(record, versions[-1])
            )
            raw = avro_ops.decode(raw, versions, reader)
        parsed = parse_records(raw, record, time=time_field, keys=keys, id=id, replays_of=self.name)
        return Stream(self, found, parsed)

    def table(
        self,
        topic: str,
        schema: type,
        *,
        key: str | Sequence[str],
        format: RegistryFormat | None = None,
    ) -> Reference:
        """The compacted topic ``topic`` as a reference table of ``schema`` records, one
        row per value of the ``key`` fields, to join streams with (``Stream.join``).

        The latest record per Kafka key is the row (a tombstone, a null value, deletes
        it). Each micro-batch sees the table as the topic is then. A record that does not
        parse leaves its key out of the table and goes to the job's dead-letter topic.
        ``format=kf.avro(subject)`` or ``kf.protobuf(subject)``: the records are in the
        schema registry's wire format, read as a source's are (docs/registry.md).
        """
        keys = (key,) if isinstance(key, str) else tuple(key)
        decode = None
        if format is not None:
            decode = self._decoder(format, compile_schema(schema))
        found = kafka_table(self._reader, self.spark, topic, schema, keys, decode=decode)
        self.tables.append(found)
        return found

    def _decoder(
        self, format: RegistryFormat, record: RecordSchema, *, envelope: bool = False
    ) -> Callable[[DataFrame], DataFrame]:
        """How records of ``format`` become JSON text for ``record``'s checks, once
        ``record`` is known to read the subject's latest version (with ``envelope``: the
        type of a change event's ``after``), KF755 naming the field when it cannot."""
        versions = RegistryClient(registry_url(format, self._reader)).versions(format.subject)
        latest = versions[-1]
        if isinstance(format, ProtobufFormat):
            if envelope:
                message, after = protobuf_ops.after_message(latest, format.message)
                protobuf_ops.check_readable(record, latest, after)
            else:
                message = protobuf_ops.check_readable(record, latest, format.message)
            return lambda raw: protobuf_ops.decode(raw, versions, message)
        if envelope:
            avro_ops.check_readable(record, avro_ops.after_record(latest))
            return lambda raw: avro_ops.decode(raw, versions, latest.schema)
        reader = avro_ops.check_readable(record, latest)
        return lambda raw: avro_ops.decode(raw, versions, reader)

    def changes(
        self,
        topic: str,
        schema: type,
        *,
        key: str | Sequence[str],
        format: RegistryFormat | None = None,
    ) -> Reference:
        """A topic of Debezium's change events (``kappaflow connect create``: inserts,
        updates and deletes of a database table) as a reference table of ``schema``
        records, one row per value of the ``key`` fields, to join streams with
        (``Stream.join``), as ``table`` is.

        Each event's ``after`` is the row; a delete (``after`` null) and the tombstone
        after it remove the row. ``schema`` names the table's columns (as Debezium writes
        them: a ``timestamp`` column in microseconds since the epoch, a decimal as a
        string). A record that does not parse leaves its key out of the table and goes to
        the job's dead-letter topic. ``format=kf.avro(subject)`` or ``kf.protobuf(subject)``:
        the envelopes are in the schema registry's wire format (Debezium with Confluent's
        Avro or Protobuf converter), ``schema`` checked against their ``after`` type.
        """
        decode = None
        if format is not None:
            decode = self._decoder(format, compile_schema(schema), envelope=True)
        found = kafka_table(
            self._reader,
            self.spark,
            topic,
            schema,
            (key,) if isinstance(key, str) else tuple(key),
            envelope=True,
            decode=decode,
        )
        self.tables.append(found)
        return found

    def table_from_lake(self, path: str, *, key: str | Sequence[str]) -> Reference:
        """The Parquet files under ``path`` as a reference table by the ``key`` columns,
        read once when the job is declared."""
        found = lake_table(self.spark, path, (key,) if isinstance(key, str) else tuple(key))
        self.tables.append(found)
        return found

    def stream(self, frame: DataFrame, *, like: Stream) -> Stream:
        """A DataFrame derived from ``like``'s as a stream again (for windows and sinks).

        It must keep the bookkeeping columns (``_kf_time``, ``_kf_partition``,
        ``_kf_offset``) that ``like.df`` has.
        """
        missing = [c for c in BOOKKEEPING if c not in frame.columns]
        if missing:
            raise UnknownColumnError(
                f"job.stream: the DataFrame lost kappaflow's columns {missing}: keep them "
                "through select() (or use Stream.select, which does)"
            )
        return Stream(self, like.source, frame.where(F.col("_kf_reason").isNull()), clean=True)

    def _add(self, output: Output) -> None:
        if any(o.name == output.name for o in self.outputs):
            raise InvalidJobError(f"job {self.name!r} has two outputs named {output.name!r}")
        self.outputs.append(output)


class Stream:
    """A stream of typed records: a streaming DataFrame plus where it came from."""

    def __init__(self, job: Job, source: Source, frame: DataFrame, *, clean: bool = False) -> None:
        self.job = job
        self.source = source
        # Dead letters travel with the first output of a source (runtime.py); derived
        # streams hold only the records that parsed.
        self._parsed = frame
        # Which replayed dead letter a record is: counted from ``parsed`` only.
        frame = frame.drop(REPLAY_COLUMN)
        self._frame = frame if clean else frame.where(F.col("_kf_reason").isNull())
        self._whole = not clean
        #: A processed stream's rows as the runtime writes them (stateful_plan.py).
        self.output_rows: DataFrame | None = None
        #: What a processed stream's state depends on (check.py compares it on restarts).
        self.state_definition: dict[str, Any] | None = None
        #: The default name of the stream's output.
        self.name: str | None = None

    @property
    def df(self) -> DataFrame:
        """The records as a plain streaming DataFrame (with kappaflow's ``_kf_`` columns)."""
        return self._frame.drop(*_VERDICT)

    @property
    def whole(self) -> bool:
        """Whether the stream is its source's records as they parsed, not filtered,
        reshaped or joined: its dead letters can then travel with its rows."""
        return self._whole

    @property
    def parsed(self) -> DataFrame:
        """Every record of the source with its verdict, dead letters included."""
        return self._parsed

    def _side(self) -> Side:
        return Side(self._frame, self.source, self._parsed, self.output_rows is not None)

    def _joined(self, joined: tuple[DataFrame, Source]) -> Stream:
        frame, source = joined
        derived = self._derive(frame)
        derived.source = source
        return derived

    def _derive(self, frame: DataFrame) -> Stream:
        if self.output_rows is not None:
            raise InvalidJobError("a processed stream is written as it is: filter in its function")
        derived = Stream(self.job, self.source, self._parsed, clean=True)
        derived._frame = frame
        return derived

    def where(self, condition: Column | str) -> Stream:
        """The records for which ``condition`` holds."""
        return self._derive(self._frame.where(condition))

    filter = where

    def reject(self, condition: Column | str, reason: str | Column) -> Stream:
        """The records for which ``condition`` does not hold (or is null). Those for which
        it holds go to the job's dead-letter topic with ``reason`` (a text, or a column
        that words it per record), their original bytes and where they came from, and
        count as dead letters: a rule the schema cannot say (a unit not known, a reading
        from the far future) loses nothing it refuses."""
        refused, why = refusal(condition, reason)
        rows = self._frame.where(refused).withColumn("_kf_reason", why)
        derived = self._derive(self._frame.where(~refused))
        derived.source = dataclasses.replace(self.source, rejected=(*self.source.rejected, rows))
        return derived

    def with_column(self, name: str, value: Column) -> Stream:
        """The records with the column ``name`` set to ``value``."""
        return self._derive(self._frame.withColumn(name, value))

    def select(self, *columns: str | Column) -> Stream:
        """Only these columns (kappaflow's own are kept)."""
        return self._derive(self._frame.select(*columns, *BOOKKEEPING, *_VERDICT))

    def join(
        self,
        other: Reference | Stream,
        *,
        on: str | Sequence[str] = (),
        how: str = "left",
        within: str | int | timedelta | None = None,
    ) -> Stream:
        """The records with the columns of ``other``'s matching row added.

        ``other`` is a reference table (``job.table``; ``on`` defaults to its key) or
        another stream, whose records match within ``within`` of each record's event
        time. ``how="left"`` keeps records without a match (their added columns null),
        ``"inner"`` drops them. A column both sides have, other than ``on``, is refused.
        """
        from kappaflow.errors import JoinSpecError

        keys = (on,) if isinstance(on, str) else tuple(on)
        if isinstance(other, Stream):
            if within is None:
                raise JoinSpecError(
                    f"join with the stream of {other.source.topic!r}: give within=..., how far "
                    "apart in event time two records may be to match"
                )
            return self._joined(join_stream(self._side(), other._side(), keys, how, within))
        if not isinstance(other, Reference):
            raise JoinSpecError(
                f"join(): {type(other).__name__} is not a stream or a table from job.table()"
            )
        if within is not None:
            raise JoinSpecError(f"join with table {other.name!r}: within= is for two streams")
        return self._joined(join_table(self._side(), other, keys, how))

    def alerts(self, *, carry: Sequence[str] = (), **rules: tuple[str, str, float]) -> Stream:
        """Alert records by declarative rules, ``name=(field, op, threshold)`` (op one
        of ``> >= < <= == !=``): per record and rule that holds, a record with the
        stream's key columns and event time, the ``carry`` columns of the record (an
        explanation: what was expected, by which model), ``rule``, ``field``, ``value``,
        ``op``, ``threshold``, ``status`` ("raised") and ``reason``. The rules run in
        Spark's JVM, so a job of them runs in real-time mode (``jobs start --real-time``)."""
        from kappaflow.streams.rules import alert_rows, carried_columns, parse_rules

        columns = [c for c in self.df.columns if not c.startswith("_kf_")]
        parsed = parse_rules(rules, columns)
        time = [self.source.time] if self.source.time in columns else []
        keys = [*dict.fromkeys([*self.source.keys, *time])]
        extra = [c for c in carried_columns(carry, columns) if c not in keys]
        keep = [*keys, *extra, *BOOKKEEPING, *_VERDICT]
        return self._derive(alert_rows(self._frame, parsed, keep))

    def transform(self, function: Callable[[DataFrame], DataFrame]) -> Stream:
        """``function`` applied to the DataFrame (which must keep the ``_kf_`` columns)."""
        return self.job.stream(function(self._frame), like=self)

    def window(
        self,
        *,
        tumbling: str | timedelta | None = None,
        sliding: tuple[str | timedelta, str | timedelta] | None = None,
        session: str | timedelta | None = None,
    ) -> Windowed:
        """Event-time windows: ``tumbling=size``, ``sliding=(size, slide)``, or
        ``session=gap`` (per key, a window holds events closer than ``gap`` to the next:
        it runs from its first event to its last plus the gap)."""
        given = [w for w in (tumbling, sliding, session) if w is not None]
        if len(given) != 1:
            raise InvalidWindowError("give exactly one of tumbling=, sliding= and session=")
        if tumbling is not None:
            spec = WindowSpec(millis(tumbling, "tumbling"), None)
        elif session is not None:
            spec = WindowSpec(millis(session, "session gap"), None, session=True)
        else:
            assert sliding is not None
            spec = WindowSpec(millis(sliding[0], "window size"), millis(sliding[1], "slide"))
        return Windowed(self, spec)

    def to(self, *sinks: Sink, name: str | None = None) -> None:
        """Write every record to ``sinks`` (Kafka topics, lake tables), exactly once; the
        serving store (``kf.store()``) keeps the latest record of each key of a keyed
        stream (a stateful function's output, keyed by its ``by`` columns), and a
        PostgreSQL table (``kf.postgres()``) each key's latest row."""
        if not sinks:
            raise InvalidSinkError("to(): name at least one sink")
        for sink in sinks:
            if isinstance(sink, RedisSink) and not self.source.keys:
                raise InvalidSinkError(
                    "the serving store keeps windowed results and the latest record per key "
                    "of a keyed stream: aggregate the stream, or process it by a key first"
                )
        default = self.name or next(
            (s.topic for s in sinks if isinstance(s, KafkaSink) and s.topic),
            next(
                (s.table for s in sinks if isinstance(s, ParquetSink)),
                next(
                    (s.table.rsplit(".", 1)[-1] for s in sinks if isinstance(s, PostgresSink)),
                    "records",
                ),
            ),
        )
        self.job._add(Output(_output_name(name or default), self, sinks))

    def process(
        self,
        function: StatefulFunction[Any],
        *,
        by: str | Sequence[str],
        name: str | None = None,
        record: type | None = None,
    ) -> Stream:
        """The output records of the ``@kf.stateful`` ``function`` run per value of the
        ``by`` columns, with its state and timers (``name``: the output's default name,
        else the function's). Events reach it as the source's record type, or ``record``
        after a ``select``."""
        done = process_stream(self._side(), function, by=by, name=name, record=record)
        derived = Stream(self.job, done.source, self._parsed, clean=True)
        derived._frame = done.frame
        derived.output_rows = done.output_rows
        derived.name = done.name
        derived.state_definition = done.state_definition
        return derived

    def _column(self, name: str) -> None:
        if name not in self._frame.columns:
            raise UnknownColumnError(
                f"no column {name!r} in the stream of {self.source.topic!r} "
                f"(columns: {', '.join(c for c in self.df.columns if not c.startswith('_kf_'))})"
            )


class Windowed:
    """A stream cut into event-time windows, to aggregate."""

    def __init__(self, stream: Stream, spec: WindowSpec) -> None:
        self.stream = stream
        self.spec = spec

    def aggregate(self, name: str, *, by: str | Sequence[str] = (), **aggregates: Any) -> Table:
        """Per window and per value of the ``by`` columns, the named ``aggregates``
        (``kf.count()``, ``kf.sum("amount")``, ...). ``name`` names the results: their
        topic ``JOB.NAME``, their lake table and their state."""
        keys = (by,) if isinstance(by, str) else tuple(by)
        if not aggregates:
            raise InvalidJobError(f"aggregate {name!r}: name at least one aggregate")
        for key in keys:
            self.stream._column(key)
        for label, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise InvalidJobError(
                    f"aggregate {name!r}: {label}= is a {type(agg).__name__}, not an aggregate "
                    "such as kf.sum('amount')"
                )
            column = getattr(agg, "column", None)
            if column:
                self.stream._column(column)
        return Table(_output_name(name), self.stream, Aggregation(self.spec, keys, aggregates))


class Table:
    """A windowed aggregate's results: each window's values per key, as they change."""

    def __init__(self, name: str, stream: Stream, aggregation: Aggregation) -> None:
        self.name = name
        self.stream = stream
        self.aggregation = aggregation

    def to(self, *sinks: Sink) -> None:
        """Write every change of the results to ``sinks``, exactly once."""
        if not sinks:
            raise InvalidSinkError(f"{self.name}.to(): name at least one sink")
        self.stream.job._add(Output(self.name, self.stream, sinks, self.aggregation))


def _output_name(name: str) -> str:
    cleaned = name.rsplit("/", 1)[-1]
    if not cleaned or not all(ch.isalnum() or ch in "_-" for ch in cleaned):
        raise InvalidJobError(
            f"invalid output name {name!r}: use letters, digits, '_' and '-' (it names a "
            "topic, a lake table and the output's state)"
        )
    return cleaned
