"""Each micro-batch of one output, to all its sinks, exactly once.

Spark re-runs a batch after a crash with the same input and state, so it produces the
same rows. The writer goes in an order that makes every step safe to repeat: the serving
store (idempotent writes), the lake (a batch is published once, by id: lake.py), then one
Kafka transaction with the batch's records on every topic and a commit marker (skipped
for a batch whose marker is already committed). Readers with ``read_committed`` see
every record once.

The rows the writer gets (runtime.py) have a ``kind``: changes of a windowed aggregate
(``provisional``, ``final``, ``correction``), ``record`` rows of a plain stream, ``late``
events (too late to correct their window), ``dlq`` records that did not parse, the
operator's ``stats`` and ``closed`` rows, and ``behind`` rows: every event that entered a
stream-stream join, of which the writer keeps those Spark's join dropped as late (at or
behind the watermark of the batch before, which the checkpoint's offset log records) and
sends them to the late topic.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from kappaflow.errors import CheckpointError, PartialBatchError
from kappaflow.spark.checkpoint import batch_watermark
from kappaflow.streams.kinds import (
    BEHIND,
    CHANGES,
    CLOSED,
    DEAD,
    LATE,
    PACKED,
    RECORD,
    STATS,
)
from kappaflow.streams.model import Source
from kappaflow.streams.ops.arrow_ipc import unpack
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA
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
from kappaflow.timeutil import from_epoch_ms, iso

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

    @property
    def late_topic(self) -> str:
        return f"{self.job}.late"

    @property
    def dlq_topic(self) -> str:
        return f"{self.job}.dlq"


class OutputWriter:
    """The ``foreachBatch`` function of one output."""

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
        # One action on the batch: everything after works on its Arrow table.
        table = _unpacked(frame.toArrow())
        laps.lap("compute+collect")
        kind = table["kind"]
        changes = _sorted_changes(table.filter(pc.is_in(kind, pa.array(CHANGES))))
        records = table.filter(pc.equal(kind, RECORD))
        too_late = table.filter(pc.is_in(kind, pa.array([LATE, BEHIND]))).to_pylist()
        late = self._late_events(frame, too_late, behind)
        dead = table.filter(pc.equal(kind, DEAD)).to_pylist()
        counted = table.filter(pc.equal(kind, STATS))
        stats = {
            "events": _sum(counted["events"])
            + (records.num_rows if target.records_are_events else 0),
            "duplicates": _sum(counted["duplicates"]),
            "late": len(late),
            "dead_letters": len(dead),
        }
        watermark = int(pc.max(table["watermark"]).as_py() or 0)
        held = _held(table.filter(pc.is_in(kind, pa.array([STATS, CLOSED]))))
        self._results = changes.num_rows + records.num_rows + len(late) + len(dead)
        laps.lap("prepare")
        self._step("before-store", batch_id)
        if self.store is not None and target.redis:
            account = BatchAccount(stats, watermark, held)
            latest = self._latest_records(records) if not target.keys else []
            self.store.apply(target.name, batch_id, changes, account, latest)
        laps.lap("redis")
        self._step("after-store", batch_id)
        lake_rows = 0
        if changes.num_rows or records.num_rows:
            # A batch without results (one that only moves the watermark) writes no
            # lake batch: it has nothing to give the table its columns.
            for lake in target.lakes:
                lake_rows = lake.write(self._lake_frame(frame, records, changes), batch_id)
        laps.lap("lake")
        self._step("after-lake", batch_id)
        last = self.publisher.committed(target.name)
        if last is None or batch_id > last["batch_id"]:
            out: list[Record] = []
            for topic in target.topics:
                out += self._output_records(topic, changes, records, batch_id)
            out += [self._late_record(r) for r in late]
            out += [self._dead_letter(r) for r in dead]
            written = {"kafka_records": len(out), "lake_rows": lake_rows}
            marker = {
                "batch": {**stats, **written},
                "totals": _added((last or {}).get("totals", {}), {**stats, **written}),
                "watermark": watermark,
                "at": iso(datetime.now(UTC)),
            }
            self.publisher.publish(
                target.name,
                batch_id,
                out,
                marker,
                lambda: self._step("in-transaction", batch_id),
            )
            if target.status_dir is not None:
                _write_status(target.status_dir, target.name, {"batch_id": batch_id, **marker})
        laps.lap("kafka")
        self._step("after-kafka", batch_id)
        print(
            f"output {target.name} batch {batch_id}: {table.num_rows} rows, "
            f"{changes.num_rows} changes, {records.num_rows} records in {laps}",
            flush=True,
        )

    def _step(self, step: str, batch_id: int) -> None:
        if self.on_step is not None:
            self.on_step(step, self.target.name, batch_id, self._results)

    def _latest_records(self, records: pa.Table) -> list[tuple[str, str]]:
        """A keyed stream's records as (key JSON, record JSON), in order: each key's last
        is its latest."""
        keys = self.target.source.keys
        out = []
        for text in records["row"].to_pylist():
            row = json.loads(text)
            out.append((json.dumps([row.get(k) for k in keys]), text))
        return out

    def _output_records(
        self, topic: str, changes: pa.Table, records: pa.Table, batch_id: int
    ) -> list[Record]:
        if self.target.keys or changes.num_rows:
            return changelog_records(topic, self.target.keys, changes, batch_id)
        keys = self.target.source.keys
        out: list[Record] = []
        for text in records["row"].to_pylist():
            row = json.loads(text)
            key = json.dumps([row.get(k) for k in keys]).encode() if keys else None
            out.append((topic, key, text.encode()))
        return out

    def _lake_frame(self, frame: DataFrame, records: pa.Table, changes: pa.Table) -> DataFrame:
        """The rows the lake gets: a stream's typed rows, or an aggregate's changes with a
        column per key and per aggregate."""
        spark = frame.sparkSession
        if not self.target.keys and self.target.row_schema is not None:
            return (
                spark.createDataFrame(records.select(["row"]))
                .select(F.from_json("row", self.target.row_schema).alias("r"))
                .select("r.*")
            )
        rows = []
        for change in map(_change, changes.to_pylist()):
            keys = json.loads(change["key"])
            rows.append(
                {
                    **dict(zip(self.target.keys, keys, strict=True)),
                    "window_start": from_epoch_ms(change["window_start"]),
                    "window_end": from_epoch_ms(change["window_end"]),
                    **(change["values"] or {}),
                    "kind": change["kind"],
                    "version": change["version"],
                }
            )
        return spark.createDataFrame(pa.Table.from_pylist(rows))

    def _late_events(
        self, frame: DataFrame, rows: list[dict[str, Any]], behind: int
    ) -> list[dict[str, Any]]:
        """Each too-late event with its original bytes, read back from its topic by the
        exact offsets the operator reported (or the stream join's input held)."""
        if not rows:
            return []
        wanted: dict[tuple[str, int, int], dict[str, Any]] = {}
        for r in rows:
            topic = r["src_topic"] or self.target.source.topic
            if r["kind"] == BEHIND:
                # An event the join dropped: once, however many rows it made before.
                wanted[(topic, r["src_partition"], r["src_offset"])] = {**r, "watermark": behind}
                continue
            for offset in r["offsets"]:
                wanted[(topic, r["src_partition"], offset)] = r
        found: list[dict[str, Any]] = []
        for topic in sorted({t for t, _, _ in wanted}):
            ranges: dict[int, tuple[int, int]] = {}
            for partition, offset in ((p, o) for t, p, o in wanted if t == topic):
                low, high = ranges.get(partition, (offset, offset))
                ranges[partition] = (min(low, offset), max(high, offset))
            raw = self.reader.read_range(frame.sparkSession, topic, ranges)
            found += [
                {
                    **wanted[(topic, r["partition"], r["offset"])],
                    "src_topic": topic,
                    "src_offset": r["offset"],
                    "value": r["value"],
                }
                for r in raw.select("partition", "offset", "value").collect()
                if (topic, r["partition"], r["offset"]) in wanted
            ]
        if len(found) != len(wanted):
            topics = ", ".join(repr(t) for t in sorted({t for t, _, _ in wanted}))
            raise PartialBatchError(
                f"found {len(found)} of the {len(wanted)} too-late events of {topics}: "
                "not publishing a partial batch"
            )
        return sorted(found, key=lambda r: (r["src_topic"], r["src_partition"], r["src_offset"]))

    def _late_record(self, r: dict[str, Any]) -> Record:
        where = {
            "event": bytes(r["value"]).decode("utf-8", errors="replace"),
            "source_topic": r["src_topic"],
            "source_partition": r["src_partition"],
            "source_offset": r["src_offset"],
        }
        if r["kind"] == BEHIND:
            on = json.loads(r["row"])
            value = {
                "output": self.target.name,
                "reason": r["reason"],
                "watermark": iso(from_epoch_ms(r["watermark"])),
                "key": on,
                "event_time": iso(from_epoch_ms(r["event_time"])),
                **where,
            }
            return self.target.late_topic, r["key"].encode(), json.dumps(value).encode()
        keys = json.loads(r["key"])
        value = {
            "output": self.target.name,
            "reason": r["reason"],
            "watermark": iso(from_epoch_ms(r["watermark"])),
            "key": dict(zip(self.target.late_keys, keys, strict=True)),
            "window_start": iso(from_epoch_ms(r["window_start"])),
            "window_end": iso(from_epoch_ms(r["window_end"])),
            **where,
        }
        return self.target.late_topic, r["key"].encode(), json.dumps(value).encode()

    def _dead_letter(self, r: dict[str, Any]) -> Record:
        value = r["value"]
        body = {
            "error": r["reason"],
            "schema": self.target.source.schema.name,
            "job": self.target.job,
            "source_topic": self.target.source.topic,
            "source_partition": r["src_partition"],
            "source_offset": r["src_offset"],
            "value_base64": base64.b64encode(bytes(value)).decode() if value else None,
        }
        return self.target.dlq_topic, None, json.dumps(body).encode()


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


def _unpacked(table: pa.Table) -> pa.Table:
    """The batch's rows with a window operator's packed rows unpacked, without
    ``packed``."""
    packed = pc.equal(table["kind"], PACKED)
    rest = table.filter(pc.invert(packed)).drop_columns(["packed"])
    if not pc.any(packed).as_py():
        return rest
    rows = unpack(table.filter(packed)["packed"], OUTPUT_ARROW_SCHEMA)
    columns = [
        rows[f.name].cast(f.type)
        if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type)
        for f in rest.schema
    ]
    return pa.concat_tables([rest, pa.Table.from_arrays(columns, schema=rest.schema)])


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


def _change(row: dict[str, Any]) -> dict[str, Any]:
    values = json.loads(row["values"]) if row["values"] else None
    previous = json.loads(row["previous"]) if row["previous"] else None
    final = row["kind"] == "final" or (
        row["kind"] == "correction" and row["window_end"] <= row["watermark"]
    )
    return {**row, "values": values, "previous": previous, "final": final}


def _sorted_changes(changes: pa.Table) -> pa.Table:
    return changes.sort_by(
        [("key", "ascending"), ("window_start", "ascending"), ("version", "ascending")]
    )


def _added(totals: dict[str, int], batch: dict[str, int]) -> dict[str, int]:
    return {k: totals.get(k, 0) + batch.get(k, 0) for k in totals.keys() | batch.keys()}


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
