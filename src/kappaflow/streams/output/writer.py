"""Each micro-batch of one output, to all its sinks, exactly once.

Spark re-runs a batch after a crash with the same input and state, so it produces the
same rows, in the same partitions. The writer goes in an order that makes every step
safe to repeat: the serving store (idempotent writes), the lake (a batch is published
once, by id: lake.py), PostgreSQL tables (each task's partition of the batch in a
transaction with its marker: postgres.py), the Kafka records (each task writes its
partition of the batch in a transaction of its own with a marker of that partition, and
skips a partition whose marker is committed: KafkaOutput.java), then the output's
marker, in a transaction of the driver's (skipped for a batch whose marker is already
committed). Readers with ``read_committed`` see every record once.

The batch's rows stay in Spark's tasks: the records and the lake's rows are Spark SQL
over them (task_records.py), and the driver gets counts back from one small aggregation.

The rows the writer gets (runtime.py) have a ``kind``: changes of a windowed aggregate
(``provisional``, ``final``, ``correction``), ``record`` rows of a plain stream, ``late``
events (too late to correct their window), ``dlq`` records that did not parse, the
operator's ``stats`` and ``closed`` rows, and ``behind`` rows: every event that entered a
stream-stream join, of which the writer keeps those Spark's join dropped as late (at or
behind the watermark of the batch before, which the checkpoint's offset log records) and
sends them to the late topic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark import StorageLevel
from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

from kappaflow.errors import CheckpointError, PartialBatchError
from kappaflow.spark.checkpoint import batch_watermark, is_remote, offsets_consumed
from kappaflow.streams.kinds import BEHIND, CHANGES, CLOSED, DEAD, LATE, RECORD, STATS
from kappaflow.streams.model import Source
from kappaflow.streams.output.backends import BatchAccount, Publisher, Record, ResultStore
from kappaflow.streams.output.json_columns import (
    Column,
    iso_literals,
    join,
    json_object,
    number_text,
    quoted,
)
from kappaflow.streams.output.lake import LakeWriter
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.postgres import PostgresWriter
from kappaflow.streams.output.task_records import (
    avro_records,
    changelog,
    dead_letters,
    lake_change_rows,
    lake_stream_rows,
    late_records,
    protobuf_records,
    store_latest,
    store_windows,
    stream_records,
    too_late,
    unpacked,
)
from kappaflow.timeutil import iso

#: Whether each stateful operator of a query has a watermark of its own (Spark's default):
#: a stream join then drops input behind the watermark of the batch before.
_ALLOW_MULTIPLE = "spark.sql.streaming.statefulOperator.allowMultiple"
#: The points of a batch at which the writer calls its ``on_step`` hook; the
#: fault-injection tests kill the driver at each.
STEPS = ("before-store", "after-store", "after-lake", "in-transaction", "after-kafka")
#: Called with the step, the output's name, the batch id and how many results the batch
#: writes (changes, records, late events, dead letters); kappaflow itself passes none.
StepHook = Callable[[str, str, int, int], None]


@dataclass
class OutputTarget:
    """What one output's writer needs to know about it."""

    job: str
    name: str
    source: Source
    #: Key columns of a windowed aggregate (none for a plain stream).
    keys: tuple[str, ...]
    #: Kafka topics to publish the output's records to.
    topics: tuple[str, ...]
    redis: bool
    lakes: tuple[LakeWriter, ...]
    #: The output query's checkpoint (a local path or a Hadoop URI).
    checkpoint: str
    #: A plain stream's row type, to give its lake its typed columns back.
    row_schema: StructType | None = None
    #: What a late event's ``key`` names: an aggregate's key columns, or the columns a
    #: stateful function is run by.
    late_keys: tuple[str, ...] = ()
    #: Whether each record written is an event passed (a plain stream), rather than what a
    #: stateful function made of them (it reports the events it got in ``stats`` rows).
    records_are_events: bool = False
    #: Whether the output's stream went through a stream-stream join (its rows then
    #: include the join's ``behind`` rows).
    joined_streams: bool = False
    #: Where the output's status file goes (none under the test harness).
    status_dir: Path | None = None
    #: Whether the output is a windowed aggregate (its rows are changes, not records).
    aggregated: bool = False
    #: Whether its rows hold a Python window operator's packed rows, unpacked in the
    #: tasks by a Python worker (the JVM operator's rows come unpacked).
    packed: bool = False
    #: An aggregate's key columns with their types, for its lake table's columns.
    key_types: tuple[tuple[str, DataType], ...] = ()
    #: An aggregate's value names, in the order its lake table's columns take.
    value_names: tuple[str, ...] = ()
    #: Its PostgreSQL tables (``kf.postgres()`` sinks).
    postgres: tuple[PostgresWriter, ...] = ()
    #: Its topics of Avro records (``kf.topic(format=kf.avro(...))``): topic, the
    #: registry's schema id and the schema.
    avro: tuple[tuple[str, int, str], ...] = ()
    #: Its topics of Protobuf records (``kf.topic(format=kf.protobuf(...))``): topic, the
    #: schema id, the FileDescriptorSet (base64) and the message's full name.
    protobuf: tuple[tuple[str, int, str, str], ...] = ()

    @property
    def late_topic(self) -> str:
        return f"{self.job}.late"

    @property
    def dlq_topic(self) -> str:
        return f"{self.job}.dlq"


class OutputWriter:
    """The ``foreachBatch`` function of one output.

    The batch's rows stay in Spark's tasks: the driver runs a few Spark jobs over them
    and gets back only counts (``_Tally``). The tasks write the serving store (each
    partition's writes in one MULTI/EXEC), the lake's files and the Kafka records (each
    task its partition of the batch, once: ``Publisher.write``); the driver then adds the
    batch's account to the store and commits the lake batch's metadata and the output's
    marker. Only the test harness's in-memory twins collect, what they keep.
    """

    def __init__(
        self,
        target: OutputTarget,
        publisher: Publisher,
        store: ResultStore | None,
        reader: Any,
        on_step: StepHook | None = None,
    ) -> None:
        self.target = target
        self.publisher = publisher
        self.store = store
        self.reader = reader
        self.on_step = on_step
        self._results = 0

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        laps = _Laps()
        target = self.target
        behind = 0
        if target.joined_streams:
            # Of the events that entered a stream join, only those its watermark dropped.
            behind = join_watermark(frame.sparkSession, target.checkpoint, batch_id)
            kept = (F.col("kind") != BEHIND) | (F.col("event_time") <= behind)
            frame = frame.where(kept)
        rows = unpacked(frame) if target.packed else frame.drop("packed")
        # The batch's rows are read by several jobs: computed once, held by the executors.
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            self._write(rows, batch_id, behind, laps)
        finally:
            rows.unpersist()

    def _write(self, rows: DataFrame, batch_id: int, behind: int, laps: _Laps) -> None:
        target = self.target
        tally = _Tally.of(rows)
        late_events = late_rows = None
        late = 0
        if tally.too_late:
            late_events = too_late(rows, target.source.topic, behind).persist(
                StorageLevel.MEMORY_AND_DISK
            )
            late_rows, late = self._late_records(late_events)
        laps.lap("compute+count")
        try:
            stats = {
                "events": tally.events + (tally.records if target.records_are_events else 0),
                "duplicates": tally.duplicates,
                "late": late,
                "dead_letters": tally.dead,
                # Only once there are some: a job never replayed to shows none.
                **({"dead_letters_replayed": tally.replayed} if tally.replayed else {}),
                **({"replays_dead_again": tally.replays_dead} if tally.replays_dead else {}),
            }
            self._results = tally.changes + tally.records + late + tally.dead
            self._step("before-store", batch_id)
            if self.store is not None and target.redis:
                account = BatchAccount(stats, tally.watermark, tally.held)
                self._store(rows, batch_id, account, writes=tally.changes + tally.records)
            laps.lap("redis")
            self._step("after-store", batch_id)
            lake_rows = 0
            if tally.changes or tally.records:
                # A batch without results (one that only moves the watermark) writes no
                # lake batch: it has nothing to give the table its columns.
                for lake in target.lakes:
                    lake_rows = lake.write(self._lake_frame(rows), batch_id)
            laps.lap("lake")
            postgres_rows = 0
            if tally.changes or tally.records:
                # Each task's part in a transaction with its marker: a re-run writes nothing.
                for table in target.postgres:
                    postgres_rows = table.write(
                        target.job,
                        target.name,
                        batch_id,
                        rows,
                        target.row_schema,
                        target.checkpoint,
                    )
            if target.postgres:
                laps.lap("postgres")
            self._step("after-lake", batch_id)
            last = self.publisher.committed(target.name)
            if last is None or batch_id > last["batch_id"]:
                kafka_records = 0
                written = tally.outputs(len(target.topics)) + late
                if written:
                    records = self._records(rows, batch_id, late_rows)
                    kafka_records = self.publisher.write(target.name, batch_id, records)
                counts = {"kafka_records": kafka_records, "lake_rows": lake_rows}
                if target.postgres:
                    counts["postgres_rows"] = postgres_rows
                marker = {
                    "batch": {**stats, **counts},
                    "totals": _added((last or {}).get("totals", {}), {**stats, **counts}),
                    "watermark": tally.watermark,
                    "at": iso(datetime.now(UTC)),
                }
                self.publisher.publish(
                    target.name,
                    batch_id,
                    [],
                    marker,
                    lambda: self._step("in-transaction", batch_id),
                )
                if target.status_dir is not None:
                    status = {"batch_id": batch_id, **marker}
                    read = _events_read(rows.sparkSession, target.checkpoint, batch_id)
                    if read is not None:
                        status["events_read"] = read
                    _write_status(target.status_dir, target.name, status)
            laps.lap("kafka")
            self._step("after-kafka", batch_id)
        finally:
            for held in (late_rows, late_events):
                if held is not None:
                    held.unpersist()
        print(
            f"output {target.name} batch {batch_id}: {tally.changes} changes, "
            f"{tally.records} records, {late} late, {tally.dead} dead letters in {laps}",
            flush=True,
        )

    def _step(self, step: str, batch_id: int) -> None:
        if self.on_step is not None:
            self.on_step(step, self.target.name, batch_id, self._results)

    def _records(self, rows: DataFrame, batch_id: int, late: DataFrame | None) -> DataFrame:
        """The batch's Kafka records (task_records.RECORD_COLUMNS), in the batch's
        partitions: changes or a stream's records on each topic and dead letters, then
        the late events' (partitions of their own)."""
        target = self.target
        parts = []
        if target.topics:
            if target.keys or target.aggregated:
                parts.append(changelog(rows, target.topics, target.keys, batch_id))
            else:
                avro = {topic for topic, _, _ in target.avro}
                avro |= {topic for topic, _, _, _ in target.protobuf}
                plain = [t for t in target.topics if t not in avro]
                if plain:
                    parts.append(stream_records(rows, plain, target.source.keys))
                for topic, ident, schema in target.avro:
                    assert target.row_schema is not None
                    parts.append(
                        avro_records(
                            rows, topic, target.source.keys, ident, schema, target.row_schema
                        )
                    )
                for topic, ident, descriptors, message in target.protobuf:
                    parts.append(
                        protobuf_records(
                            rows, topic, target.source.keys, ident, descriptors, message
                        )
                    )
        letters = dead_letters(
            rows,
            target.dlq_topic,
            job=target.job,
            schema=target.source.schema.name,
            source_topic=target.source.topic,
        )
        # Each part keeps the batch's partitions (a union puts one's after the other's):
        # what a partition holds is the same when Spark runs the batch again.
        records = letters
        for part in parts:
            records = part.unionByName(records)
        if late is not None:
            records = records.unionByName(late)
        return records

    def _store(self, rows: DataFrame, batch_id: int, account: BatchAccount, *, writes: int) -> None:
        """The batch's windows (or a keyed stream's latest records) written to the
        serving store by the tasks holding them; the batch's account from the driver.
        A batch with nothing to write (``writes``: its changes and records; one that only
        moves the watermark, say) runs no Spark job for it: that job costs about a
        second per batch on a busy machine."""
        assert self.store is not None
        target = self.target
        if writes and (target.keys or target.aggregated):
            self.store.write(target.name, store_windows(rows))
        elif writes and target.source.keys:
            self.store.write(target.name, store_latest(rows, target.source.keys))
        self.store.account(target.name, batch_id, account)

    def _lake_frame(self, rows: DataFrame) -> DataFrame:
        """The rows the lake gets: a stream's typed rows, or an aggregate's changes with a
        column per key and per aggregate."""
        target = self.target
        if not target.keys and not target.aggregated and target.row_schema is not None:
            return lake_stream_rows(rows, target.row_schema)
        return lake_change_rows(rows, target.key_types, target.value_names)

    def _late_records(self, events: DataFrame) -> tuple[DataFrame, int]:
        """The late topic's records of the batch's too-late events, each with its
        original bytes read back from its topic by the exact offsets the operator
        reported (or the stream join's input held), and how many there are."""
        spans = events.groupBy("t", "p").agg(
            F.min("o").alias("low"), F.max("o").alias("high"), F.count("*").alias("n")
        )
        wanted: dict[str, dict[int, tuple[int, int]]] = {}
        count = 0
        for span in spans.collect():  # one row per source partition
            wanted.setdefault(span["t"], {})[int(span["p"])] = (int(span["low"]), int(span["high"]))
            count += int(span["n"])
        spark = events.sparkSession
        raw: DataFrame | None = None
        for topic in sorted(wanted):
            read = self.reader.read_range(spark, topic, wanted[topic]).select(
                F.lit(topic).alias("topic"), "partition", "offset", "value"
            )
            raw = read if raw is None else raw.unionByName(read)
        assert raw is not None
        records = late_records(
            events,
            raw,
            self.target.late_topic,
            output=self.target.name,
            late_keys=self.target.late_keys,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        found = records.count()
        if found != count:
            records.unpersist()
            topics = ", ".join(repr(t) for t in sorted(wanted))
            raise PartialBatchError(
                f"found {found} of the {count} too-late events of {topics}: "
                "not publishing a partial batch"
            )
        return records, count


@dataclass(frozen=True)
class _Tally:
    """What the driver knows of a batch: counts, from one small aggregation."""

    changes: int
    records: int
    too_late: int
    dead: int
    #: The job's replayed dead letters read back from the source, and of those, the ones
    #: that failed again (counted in ``dead`` too).
    replayed: int
    replays_dead: int
    events: int
    duplicates: int
    watermark: int
    held: dict[int, int]

    @classmethod
    def of(cls, rows: DataFrame) -> _Tally:
        kind = F.col("kind")
        counted = kind.isin(STATS, CLOSED)

        def count(condition: SparkColumn) -> SparkColumn:
            return F.count(F.when(condition, 1))

        replay = F.col("replay") if "replay" in rows.columns else F.lit(None)
        groups = rows.groupBy(F.when(counted, F.col("window_start")).alias("w")).agg(
            count(replay.isNotNull()).alias("replayed"),
            count(replay.isNotNull() & F.col("reason").isNotNull()).alias("replays_dead"),
            count(kind.isin(*CHANGES)).alias("changes"),
            count(kind == RECORD).alias("records"),
            count(kind.isin(LATE, BEHIND)).alias("too_late"),
            count(kind == DEAD).alias("dead"),
            F.sum(F.when(kind == STATS, F.col("events"))).alias("events"),
            F.sum(F.when(kind == STATS, F.col("duplicates"))).alias("duplicates"),
            F.max("watermark").alias("watermark"),
            F.sum(F.when(counted, F.col("held"))).alias("held"),
        )
        found = groups.collect()  # a row per window with statistics, and one for the rest

        def total(name: str) -> int:
            return sum(int(g[name] or 0) for g in found)

        held = {int(g["w"]): int(g["held"]) for g in found if g["w"] is not None and g["held"]}
        return cls(
            changes=total("changes"),
            records=total("records"),
            too_late=total("too_late"),
            dead=total("dead"),
            replayed=total("replayed"),
            replays_dead=total("replays_dead"),
            events=total("events"),
            duplicates=total("duplicates"),
            watermark=max((int(g["watermark"] or 0) for g in found), default=0),
            held=held,
        )

    def outputs(self, topics: int) -> int:
        """How many records the batch's rows make (late events aside)."""
        return (self.changes + self.records) * topics + self.dead


class _Laps:
    """Where a batch's time went: each lap is the time since the one before."""

    def __init__(self) -> None:
        self.began = self.last = time.perf_counter()
        self.spent: dict[str, float] = {}

    def lap(self, step: str) -> None:
        now = time.perf_counter()
        self.spent[step] = now - self.last
        self.last = now

    def __str__(self) -> str:
        steps = ", ".join(f"{step} {seconds:.2f}s" for step, seconds in self.spent.items())
        return f"{self.last - self.began:.2f}s ({steps})"


def changelog_records(
    topic: str, names: tuple[str, ...], changes: pa.Table, batch_id: int
) -> list[Record]:
    """The changelog records of a batch's changes, their JSON built a column at a time.

    A record's key is ``[key values..., window start ms]``; its value names the key
    columns, the window's bounds, the values and the previous ones (the retraction),
    the kind, the version, the watermark and the batch."""
    if not changes.num_rows:
        return []
    items = _key_items(changes["key"], len(names))
    start, watermark = changes["window_start"], changes["watermark"]
    value = json_object(
        {
            **dict(zip(names, items, strict=True)),
            "window_start": iso_literals(start),
            "window_end": iso_literals(changes["window_end"]),
            "values": pc.fill_null(changes["values"], "null"),
            "previous": pc.fill_null(changes["previous"], "null"),
            "kind": quoted(changes["kind"]),
            "version": number_text(changes["version"]),
            "watermark": pc.if_else(pc.greater(watermark, 0), iso_literals(watermark), "null"),
            "batch": str(batch_id),
        }
    )
    parts: list[Column | str] = ["["]
    for item in items:
        parts += [item, ", "]
    key = join(*parts, number_text(start), "]")
    return [(topic, k, v) for k, v in zip(_bytes(key), _bytes(value), strict=True)]


def _key_items(keys: pa.ChunkedArray, n: int) -> list[Column]:
    """The JSON text of each key column's value, from the keys' JSON arrays."""
    if n == 1:
        # ``["x"]`` → ``"x"``: the array's one element, as it is.
        return [pc.utf8_slice_codeunits(keys, 1, -1)]
    distinct = pc.unique(keys)
    values = [json.loads(text) for text in distinct.to_pylist()]
    where = pc.index_in(keys, distinct)
    return [
        pc.take(pa.array([json.dumps(v[i]) for v in values], pa.string()), where) for i in range(n)
    ]


def _bytes(texts: Column) -> list[bytes]:
    return list(pc.cast(texts, pa.binary()).to_pylist())


def _added(totals: dict[str, int], batch: dict[str, int]) -> dict[str, int]:
    return {k: totals.get(k, 0) + batch.get(k, 0) for k in totals.keys() | batch.keys()}


def _events_read(spark: SparkSession, checkpoint: str, batch_id: int) -> int | None:
    """The source offsets the query consumed through ``batch_id``, measured from its
    checkpoint (spark/checkpoint.py) where the checkpoint is not on the local disk: only a
    driver reaches HDFS or S3, so the status file carries the figure for ``jobs status``
    (jobs/status.py), which measures a local checkpoint itself. None for a local one."""
    if not is_remote(checkpoint):
        return None
    try:
        # Spark wrote the batch's offsets before running it, and the sources' starts before.
        return offsets_consumed(HadoopFs(spark, checkpoint), batch_id)
    except (OSError, IndexError, ValueError, Py4JJavaError):
        # An account the checkpoint cannot give is missing from the status, not a reason
        # to fail the batch.
        return None


def _write_status(folder: Path, output: str, status: dict[str, Any]) -> None:
    """The output's last batch and running totals, for ``jobs status`` and the service
    (replaced atomically: a reader sees a whole file)."""
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f".{output}.json.tmp"
    scratch.write_text(json.dumps(status, indent=2) + "\n")
    scratch.replace(folder / f"{output}.json")


def _held(rows: pa.Table) -> dict[int, int]:
    """Window start → change in the keys the state holds, from ``stats`` and ``closed``
    rows."""
    if not rows.num_rows:
        return {}
    sums = rows.group_by("window_start").aggregate([("held", "sum")])
    return {
        int(w): int(n or 0)
        for w, n in zip(sums["window_start"].to_pylist(), sums["held_sum"].to_pylist(), strict=True)
        if n
    }


def _sum(column: pa.ChunkedArray) -> int:
    return int(pc.sum(column).as_py() or 0)


def join_watermark(spark: SparkSession, checkpoint: str, batch_id: int) -> int:
    """The watermark by which Spark's stream join drops micro-batch ``batch_id``'s late
    events, from the query's offset log at ``checkpoint``: the one the batch before ran
    with (0 for the first batch), or the batch's own where the session keeps one
    watermark for all stateful operators (``statefulOperator.allowMultiple`` false), as
    Spark does."""
    multiple = spark.conf.get(_ALLOW_MULTIPLE, "true")
    batch = batch_id - 1 if str(multiple).lower() != "false" else batch_id
    if batch < 0:
        return 0
    path = f"offsets/{batch}"
    try:
        text = HadoopFs(spark, checkpoint).read_text(path)
    except Exception as exc:
        # A Py4J error's own text names only the call; the Java exception says what failed.
        java = getattr(exc, "java_exception", None)
        reason = str(java.toString()) if java is not None else str(exc)
        raise CheckpointError(
            f"cannot read {checkpoint}/{path} for the stream join's watermark: "
            f"{reason.splitlines()[0]}"
        ) from None
    return batch_watermark(text)
