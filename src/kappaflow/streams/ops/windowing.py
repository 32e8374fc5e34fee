"""Windowed aggregates by event time: provisional, final, correction and late.

``aggregate_windows`` computes the aggregates users declare (aggregates.py; ``kappaflow
count`` declares one, a count) per key and window. Events are windowed in Spark SQL,
folded per (window, key) to partials (folding.py), handed over packed per (window, shard)
as Arrow IPC bytes (a pandas column would round 64-bit ids beside a null), then merged
per (window, shard) by ``WindowAggregator``, a stateful processor whose state value
holds, for all keys of a shard in a window, their partials and the version that orders
their changes (an Arrow table), the ids already counted and whether the window is final.

Per micro-batch a key whose values change gets one change: ``provisional`` before the
watermark passes the window's end, ``correction`` after. A timer at the end emits
``final`` for every key, one at end + lateness forgets the window (``closed``); events for
a forgotten window come out as ``late`` rows (one per folded row, with its count and
offset range), never silently dropped. Each group also emits a ``stats`` row per batch.

The watermark is declared on a column dropped before the operator
(``event_time_watermark``): Spark still fires the timers by it but no longer drops late
rows before the operator sees them. Session windows are another processor over the same
output (session_windows.py), with its state keyed by a shard of keys instead of window.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.errors import AggregateColumnError, AggregatesSpecError, WindowSpecError
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.jvm import jvm_engine
from kappaflow.streams.kinds import (
    CLOSED,
    CORRECTION,
    DEAD_WINDOW,
    FINAL,
    LATE,
    PROVISIONAL,
    SHARDS,
    STATS,
)
from kappaflow.streams.model import REPLAY_COLUMN
from kappaflow.streams.ops.arrow_ipc import (
    PACKED_SCHEMA,
    PackedProcessor,
    table_from_ipc,
    table_to_ipc,
)
from kappaflow.streams.ops.folding import (
    PACKED_GROUP,
    Folder,
    ddl,
    folded_schema,
    input_name,
    partial_fields,
    partial_name,
    reduce_groups,
    unpacked,
)
from kappaflow.streams.ops.operator_rows import dead_letter_rows, schema_rows
from kappaflow.timeutil import from_epoch_ms, iso

#: Everything the operator emits, unpacked.
OUTPUT_ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("key", pa.string()),
        ("window_start", pa.int64()),
        ("window_end", pa.int64()),
        ("values", pa.string()),
        ("previous", pa.string()),
        ("version", pa.int64()),
        ("watermark", pa.int64()),
        ("events", pa.int64()),
        ("duplicates", pa.int64()),
        # ``stats`` rows: keys the window's state gained; ``closed``: minus those it forgot.
        ("held", pa.int64()),
        ("reason", pa.string()),
        ("value", pa.binary()),
        ("src_partition", pa.int32()),
        ("src_offset", pa.int64()),
        ("src_offset_end", pa.int64()),
        ("offsets", pa.list_(pa.int64())),
    ]
)
OUTPUT_SCHEMA = ddl(OUTPUT_ARROW_SCHEMA)
STATE_SCHEMA = "partials BINARY, ids BINARY, final BOOLEAN"
#: The Spark option that picks where window operators run, and its values.
ENGINE_CONF = "spark.kappaflow.windows.engine"
ENGINES = ("python", "jvm")
#: Columns the events must have besides keys, aggregated columns and id.
SOURCE_COLUMNS = ("_kf_time", "_kf_partition", "_kf_offset")


def aggregate_windows(
    events: DataFrame,
    *,
    keys: Sequence[str],
    aggregates: Mapping[str, Aggregate],
    size_ms: int,
    slide_ms: int | None,
    watermark_ms: int | None,
    lateness_ms: int,
    id_column: str | None,
    dead_letters: bool = False,
    engine: str | None = None,
    real_time: bool = False,
) -> DataFrame:
    """The changes, late events and statistics of ``aggregates`` per key and window
    (OUTPUT_SCHEMA rows, packed: a ``rows`` column of Arrow IPC bytes per group and call,
    which the batch writer unpacks with arrow_ipc.unpack, sparing the query a pass through
    a Python worker); tumbling windows, or sliding ones with ``slide_ms``.

    ``dead_letters``: ``events`` are every record of the source, those that did not
    parse marked by ``_kf_reason`` (with their bytes in ``_kf_value``); they travel
    through the operator in a group of their own (``DEAD_WINDOW``) and come out as
    ``dlq`` rows, so the source is read once for both.

    ``engine``: ``python`` folds in Python workers and returns the rows packed; ``jvm``
    runs the engine's Java operator and returns them unpacked (default: the session's
    ``spark.kappaflow.windows.engine``, else ``jvm``).

    ``real_time``: for a query in Spark's real-time mode, the Java operator on the
    executors' clock (``Windows.aggregateRealTime``): a window is final once the clock is
    ``watermark_ms`` past its end, closed ``lateness_ms`` after that; no statistics rows."""
    step = _check_windows(size_ms, slide_ms, watermark_ms, lateness_ms)
    if real_time:
        # Spark's watermark moves only between real-time batches: the operator keeps its own.
        engine, clock_delay_ms, watermark_ms = "jvm", watermark_ms or 0, None
    else:
        clock_delay_ms = None
    names, bound = bind_aggregates(events, keys, aggregates, id_column)
    jvm = (engine or spark_engine(events)) == "jvm"
    dead = F.col("_kf_reason").isNotNull() if dead_letters else F.lit(False)
    # Real-time mode's writer takes no replay rows: there replays are not counted.
    replay = replay_marker(events, dead_letters=dead_letters and not real_time, jvm=jvm)
    newest = F.floor(F.col("_kf_time") / step) * step
    backs = F.sequence(F.lit(0), F.lit(size_ms // step - 1))
    windowed = (
        event_time_watermark(events, watermark_ms)
        .withColumn(
            "_kf_back",
            F.explode(
                F.when(dead, F.array(F.lit(0)))
                # A replayed dead letter that parsed: its windows, and a row to count it.
                .when(replay.isNotNull(), F.concat(backs, F.array(F.lit(REPLAY_BACK))))
                .otherwise(backs)
            ),
        )
        .withColumn("_kf_key", F.when(~dead, key_json(keys)))
    )
    apart = dead | (F.col("_kf_back") == REPLAY_BACK)
    selected = windowed.select(
        F.when(apart, F.lit(DEAD_WINDOW))
        .otherwise(newest - F.col("_kf_back") * step)
        .cast("long")
        .alias("window_start"),
        F.when(apart, F.lit(-1))
        .otherwise(F.pmod(F.xxhash64("_kf_key"), F.lit(SHARDS)))
        .cast("int")
        .alias("shard"),
        F.when(apart, replay).otherwise(F.col("_kf_key")).alias("key"),
        (F.col("_kf_back") == 0).alias("primary"),
        F.col("_kf_partition").cast("int").alias("src_partition"),
        (F.when(F.col(id_column).isNotNull(), F.xxhash64(id_column)) if id_column else F.lit(None))
        .cast("long")
        .alias("id_hash"),
        F.col("_kf_offset").cast("long").alias("src_offset"),
        (F.col("_kf_reason") if dead_letters else F.lit(None)).cast("string").alias("reason"),
        # Only a dead letter's bytes cross to Python.
        (F.when(dead, F.col("_kf_value")) if dead_letters else F.lit(None))
        .cast("binary")
        .alias("value"),
        *[F.col(a.column).alias(input_name(i)) for i, a in enumerate(bound) if a.column],
    )
    if jvm:
        return jvm_operator(
            "Windows",
            selected,
            names,
            bound,
            size_ms,
            lateness_ms,
            id_column is not None,
            clock_delay_ms=clock_delay_ms,
        )
    # The folded rows reach the state packed per group: through pandas as they are.
    folded = selected.mapInArrow(Folder(bound), ddl(PACKED_GROUP))
    processor = WindowAggregator(names, bound, size_ms, lateness_ms, dedup=id_column is not None)
    return folded.groupBy("window_start", "shard").transformWithStateInPandas(
        statefulProcessor=PackedProcessor(processor),
        outputStructType=PACKED_SCHEMA,
        outputMode="Update",
        timeMode="EventTime",
    )


#: The ``_kf_back`` of a replayed dead letter's second row (aggregate_windows).
REPLAY_BACK = -1


def replay_marker(events: DataFrame, *, dead_letters: bool, jvm: bool) -> Column:
    """Which dead letter each record of ``events`` replays (``PARTITION:OFFSET``), for the
    Java operators, which send a replayed record's second row out as a ``replay`` row and a
    dead letter's as a ``dlq`` row that names it; null where they are not asked to (the
    caller then counts replays by a read of its own)."""
    if dead_letters and jvm and REPLAY_COLUMN in events.columns:
        return F.col(REPLAY_COLUMN)
    return F.lit(None).cast("string")


def spark_engine(events: DataFrame) -> str:
    """Where the session of ``events`` runs window operators (``configured_engine``)."""
    return configured_engine(events.sparkSession)


def configured_engine(spark: SparkSession) -> str:
    """Where the session runs window operators on a new checkpoint: ``jvm`` (the default)
    or ``python`` (``spark.kappaflow.windows.engine``). A checkpoint keeps the operator it
    was started with (streams/window_engine.py)."""
    engine = str(spark.conf.get(ENGINE_CONF, "jvm") or "jvm").lower()
    if engine not in ENGINES:
        raise WindowSpecError(f"{ENGINE_CONF} is {engine!r}: it is one of {', '.join(ENGINES)}")
    return engine


def jvm_operator(
    operator: str,
    selected: DataFrame,
    names: Sequence[str],
    bound: Sequence[Aggregate],
    size_ms: int,
    lateness_ms: int,
    dedup: bool,
    *,
    clock_delay_ms: int | None = None,
) -> DataFrame:
    """The engine's window operator ``operator`` (io.kappaflow.engine.Windows: one row per
    event and window; Sessions: one per event, with the session gap as ``size_ms``) over
    ``selected``. Its rows are OUTPUT_SCHEMA's, unpacked. ``clock_delay_ms``: Windows in
    real-time mode, its watermark that far behind the executors' clock."""
    spec = json.dumps(
        [
            {**described, "input": selected.columns.index(input_name(i)) if agg.column else -1}
            for i, (described, agg) in enumerate(
                zip(describe_aggregates(names, bound), bound, strict=True)
            )
        ]
    )
    spark = selected.sparkSession
    jvm_class = getattr(jvm_engine(spark), operator)
    if clock_delay_ms is not None:
        jdf = jvm_class.aggregateRealTime(
            selected._jdf, spec, size_ms, lateness_ms, clock_delay_ms, dedup
        )
    else:
        jdf = jvm_class.aggregate(selected._jdf, spec, size_ms, lateness_ms, dedup)
    return ClassicDataFrame(jdf, spark)


def describe_aggregates(names: Sequence[str], bound: Sequence[Aggregate]) -> list[dict[str, Any]]:
    """Bound aggregates as the engine's Java operators take them (io.kappaflow.engine.
    Aggregates.parse, less each one's input column): name, kind, whether integral, and the
    quantiles an approx_quantiles estimates."""
    return [
        {
            "name": name,
            "kind": agg.kind,
            "column": agg.column,
            "integral": bool(getattr(agg, "integral", False)),
            "quantiles": list(getattr(agg, "quantiles", ())),
        }
        for name, agg in zip(names, bound, strict=True)
    ]


def event_time_watermark(events: DataFrame, watermark_ms: int | None) -> DataFrame:
    """``events`` with the watermark declared on a column dropped at once: Spark fires a
    stateful operator's timers by it, but hands the operator late rows instead of dropping
    them. None: the events carry a watermark already, a stream-stream join's, which Spark
    propagates to the operator (and refuses to see declared again after the join)."""
    if watermark_ms is None:
        return events
    return (
        events.withColumn("_kf_event_time", F.timestamp_millis(F.col("_kf_time")))
        .withWatermark("_kf_event_time", f"{watermark_ms} milliseconds")
        .drop("_kf_event_time")
    )


def _check_windows(
    size_ms: int, slide_ms: int | None, watermark_ms: int | None, lateness_ms: int
) -> int:
    """The windows' step (the slide, or the size for tumbling windows)."""
    if size_ms <= 0:
        raise WindowSpecError(f"window size must be positive, got {size_ms} ms")
    step = size_ms if slide_ms is None else slide_ms
    if step <= 0 or size_ms % step:
        raise WindowSpecError(
            f"window slide must be positive and divide the size {size_ms} ms, got {step} ms"
        )
    for name, value in (("watermark", watermark_ms or 0), ("lateness", lateness_ms)):
        if value < 0:
            raise WindowSpecError(f"{name} must not be negative, got {value} ms")
    return step


def key_json(keys: Sequence[str]) -> Column:
    """The key columns' values as the text of a JSON array (``[]`` without keys)."""
    if not keys:
        return F.lit("[]")
    if len(keys) == 1:
        return F.to_json(F.array(F.col(keys[0])))
    items = [F.regexp_replace(F.to_json(F.array(F.col(k))), r"^\[|\]$", "") for k in keys]
    return F.concat(F.lit("["), F.concat_ws(",", *items), F.lit("]"))


def bind_aggregates(
    events: DataFrame,
    keys: Sequence[str],
    aggregates: Mapping[str, Aggregate],
    id_column: str | None,
) -> tuple[list[str], list[Aggregate]]:
    """The aggregates' names and the aggregates bound to their columns' types."""
    if not aggregates:
        raise AggregatesSpecError("no aggregates: declare at least one, e.g. count()")
    types = {field.name: field.dataType for field in events.schema.fields}
    for column in (*keys, *([id_column] if id_column else []), *SOURCE_COLUMNS):
        if column not in types:
            raise AggregatesSpecError(f"events have no column {column!r} (columns: {list(types)})")
    bound: list[Aggregate] = []
    for name, agg in aggregates.items():
        if not isinstance(name, str) or not name:
            raise AggregatesSpecError(f"aggregate name must be a non-empty string, got {name!r}")
        if not isinstance(agg, Aggregate):
            raise AggregatesSpecError(f"aggregate {name!r} is {agg!r}, not an aggregate")
        if agg.column is not None and agg.column not in types:
            raise AggregateColumnError(
                f"aggregate {name!r}: events have no column {agg.column!r} (columns: {list(types)})"
            )
        arrow = to_arrow_type(types[agg.column]) if agg.column is not None else None
        bound.append(agg.bind(arrow))
    return list(aggregates), bound


def output_table(n: int, **columns: Any) -> pa.Table:
    """``n`` output rows (OUTPUT_SCHEMA); see counting.rows.schema_rows."""
    return schema_rows(OUTPUT_ARROW_SCHEMA, n, **columns)


class WindowState(NamedTuple):
    """A window shard's state value (STATE_SCHEMA)."""

    #: Each key's partials and version: Arrow IPC bytes of ``WindowAggregator.held``.
    partials: bytes
    #: The id hashes already counted in the window (int64s; empty without an id).
    ids: bytes
    #: Whether the watermark has passed the window's end.
    final: bool


_NO_IDS = np.zeros(0, dtype="int64")


class WindowAggregator(StatefulProcessor):
    """The state machine per (window_start, shard); see the module's docstring."""

    def __init__(
        self,
        names: Sequence[str],
        aggregates: Sequence[Aggregate],
        size_ms: int,
        lateness_ms: int,
        dedup: bool,
    ) -> None:
        self.names = list(names)
        self.aggregates = list(aggregates)
        self.size_ms = size_ms
        self.lateness_ms = lateness_ms
        self.dedup = dedup
        self.folded = folded_schema(self.aggregates)
        self.partials = [f.name for f in partial_fields(self.aggregates)]
        self.held = pa.schema(
            [("key", pa.string()), ("version", pa.int64()), *partial_fields(self.aggregates)]
        )

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("window", STATE_SCHEMA)

    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        # Each row holds folded rows packed (folding.packed): unpacked from their bytes,
        # not from pandas columns, whose int64s with a null are float64 (ids rounded).
        folded = unpacked((blob for frame in rows for blob in frame["rows"]), self.folded)
        start = int(key[0])
        if start == DEAD_WINDOW:
            yield dead_letter_rows(folded, "first_offset", OUTPUT_ARROW_SCHEMA)
            return
        end = start + self.size_ms
        if end + self.lateness_ms <= watermark:
            yield self._too_late(folded.filter(folded["primary"]), start, end, watermark)
            return
        stored = self._stored()
        held = self._held(stored)
        seen = np.frombuffer(stored.ids, dtype="int64") if stored and stored.ids else None
        final = bool(stored.final) if stored else False
        counted = folded["counted"].to_numpy()
        if self.dedup:
            counted, seen = _fresh(folded, counted, seen)
        if stored is None:
            # A new window: its timers, once (re-registering one only logs a warning).
            if end > watermark:
                self.handle.registerTimer(end)
            if self.lateness_ms or end <= watermark:
                self.handle.registerTimer(end + self.lateness_ms)
        keys_before = held.num_rows
        out: list[pa.Table] = []
        if stored is not None and not final and end <= watermark:
            # The watermark passed the end but the timer has not fired yet (Spark runs
            # the timers after the input): the window becomes final first, and this
            # batch's events correct it.
            held, finals = self._finalized(held, start, end, watermark)
            out.append(finals)
        dirty = stored is None or bool(out)
        final = final or end <= watermark
        kept = folded.filter(pa.array(counted > 0))
        if kept.num_rows:
            held, changes = self._merge(held, kept, start, end, watermark, final)
            out.append(changes)
            dirty = True
        if dirty:
            ids = seen.tobytes() if seen is not None else b""
            self.state.update(WindowState(table_to_ipc(held), ids, final))
        primary = folded["primary"].to_numpy(zero_copy_only=False)
        events = folded["events"].to_numpy()
        stats = output_table(
            1,
            kind=[STATS],
            window_start=[start],
            window_end=[end],
            watermark=[watermark],
            events=[int(counted[primary].sum())],
            duplicates=[int((events - counted)[primary].sum())],
            held=[held.num_rows - keys_before],
        )
        out.insert(0, stats)
        yield pa.concat_tables(out)

    def _merge(
        self, held: pa.Table, kept: pa.Table, start: int, end: int, watermark: int, final: bool
    ) -> tuple[pa.Table, pa.Table]:
        """The keys' partials with ``kept`` merged in, and the changes that makes."""
        batch = reduce_groups(kept, ["key"], self.aggregates, raw=False)
        columns = ["key", *self.partials]
        touched = pc.is_in(held["key"], value_set=batch["key"])
        both = pa.concat_tables([held.filter(touched).select(columns), batch.select(columns)])
        now = reduce_groups(both, ["key"], self.aggregates, raw=False)
        index = pc.index_in(now["key"], value_set=held["key"])
        before = held.take(index)
        values, previous = self._values(now), self._values(before)
        is_new = pc.is_null(index).to_numpy(zero_copy_only=False)
        changed = is_new | (np.array(values, dtype=object) != np.array(previous, dtype=object))
        version = pc.fill_null(before["version"], 0).to_numpy() + changed
        now = now.append_column("version", pa.array(version, pa.int64())).select(self.held.names)
        held = pa.concat_tables([held.filter(pc.invert(touched)), now.cast(self.held)])
        kind = CORRECTION if final else PROVISIONAL
        mask = pa.array(changed)
        out = output_table(
            int(changed.sum()),
            kind=[kind] * int(changed.sum()),
            key=now["key"].filter(mask),
            window_start=np.full(changed.sum(), start),
            window_end=np.full(changed.sum(), end),
            watermark=np.full(changed.sum(), watermark),
            values=[v for v, c in zip(values, changed, strict=True) if c],
            previous=[
                None if n else p for p, n, c in zip(previous, is_new, changed, strict=True) if c
            ],
            version=pa.array(version, pa.int64()).filter(mask),
        )
        return held, out

    def _finalized(
        self, held: pa.Table, start: int, end: int, watermark: int
    ) -> tuple[pa.Table, pa.Table]:
        """Every key one version on, and its ``final`` row (values = previous = now)."""
        n = held.num_rows
        version = pc.add(held["version"], 1)
        held = held.set_column(1, "version", version)
        values = self._values(held)
        return held, output_table(
            n,
            kind=[FINAL] * n,
            key=held["key"],
            window_start=np.full(n, start),
            window_end=np.full(n, end),
            watermark=np.full(n, watermark),
            values=values,
            previous=values,
            version=version,
        )

    def _values(self, partials: pa.Table) -> list[str]:
        return values_json(self.names, self.aggregates, partials)

    def _held(self, stored: WindowState | None) -> pa.Table:
        if stored is None or not stored.partials:
            return self.held.empty_table()
        return table_from_ipc(stored.partials).cast(self.held)

    def _stored(self) -> WindowState | None:
        """The state value, if the window has one (Spark returns it as a plain tuple)."""
        stored = self.state.get()
        return WindowState(*stored) if stored is not None else None

    def _too_late(self, late: pa.Table, start: int, end: int, watermark: int) -> pa.Table:
        """The too-late events, through their newest window: one row per folded row."""
        n = late.num_rows
        reason = (
            f"too late: window {iso(from_epoch_ms(start))}/{iso(from_epoch_ms(end))} "
            f"stopped taking corrections {self.lateness_ms} ms after the watermark "
            f"passed its end (watermark {iso(from_epoch_ms(watermark))})"
        )
        return output_table(
            n,
            kind=[LATE] * n,
            key=late["key"],
            window_start=np.full(n, start),
            window_end=np.full(n, end),
            watermark=np.full(n, watermark),
            events=late["events"],
            reason=[reason] * n,
            src_partition=late["src_partition"],
            src_offset=late["first_offset"],
            src_offset_end=late["last_offset"],
            offsets=late["offsets"],
        )

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pa.Table]:
        start = int(key[0])
        end = start + self.size_ms
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        stored = self._stored()
        if stored is None:
            return
        held = self._held(stored)
        tables: list[pa.Table] = []
        if expiry == end and not stored.final:
            held, finals = self._finalized(held, start, end, watermark)
            self.state.update(stored._replace(partials=table_to_ipc(held), final=True))
            tables.append(finals)
        if expiry == end + self.lateness_ms:
            # No correction can come any more: forget the window and its ids.
            self.state.clear()
            tables.append(
                output_table(
                    1,
                    kind=[CLOSED],
                    window_start=[start],
                    window_end=[end],
                    watermark=[watermark],
                    held=[-held.num_rows],
                )
            )
        if tables:
            yield pa.concat_tables(tables)

    def close(self) -> None:
        pass


def values_json(
    names: Sequence[str], aggregates: Sequence[Aggregate], partials: pa.Table
) -> list[str]:
    """Each row's values as a JSON object (name → value, in declaration order), as
    ``json.dumps(..., separators=(",", ":"))`` writes it.

    A batch makes 100,000s of these: each value is written on its own (numbers by
    ``str`` and ``repr``, the rest by ``json``) and the objects joined as text, which is
    several times faster than a ``json.dumps`` per object."""
    heads = [json.dumps(name) + ":" for name in names]
    columns = [
        _json_texts(
            agg.results([partials[partial_name(i, p)].combine_chunks() for p in agg.partials()])
        )
        for i, agg in enumerate(aggregates)
    ]
    if len(columns) == 1:
        head = "{" + heads[0]
        return [head + text + "}" for text in columns[0]]
    return [
        "{" + ",".join(h + t for h, t in zip(heads, row, strict=True)) + "}"
        for row in zip(*columns, strict=True)
    ]


def _json_texts(values: list[Any]) -> list[str]:
    """Each value as JSON text, as ``json.dumps`` writes it."""
    return [
        "null"
        if v is None
        else str(v)
        if type(v) is int
        else repr(v)
        if type(v) is float and math.isfinite(v)
        else json.dumps(v, separators=(",", ":"))
        for v in values
    ]


def _fresh(
    folded: pa.Table, counted: np.ndarray, seen: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Per folded row, the events that count now, and the ids the window has counted.

    A row with an id stands for one id (folding.py): it counts if it counted in its fold,
    the window has not seen the id, and no earlier row of this batch has it."""
    ids = folded["id_hash"]
    has_id = pc.is_valid(ids).to_numpy(zero_copy_only=False)
    hashes = pc.fill_null(ids, 0).to_numpy()
    known = seen if seen is not None else _NO_IDS
    candidate = has_id & (counted > 0) & ~np.isin(hashes, known)
    first = np.zeros(len(hashes), dtype=bool)
    where = np.flatnonzero(candidate)
    first[where] = ~pd.Series(hashes[where]).duplicated().to_numpy()
    keep = ~has_id | (candidate & first)
    counted = np.where(keep, counted, 0)
    return counted, np.union1d(known, hashes[has_id & keep])
