"""Session windows for the aggregates users declare: per key, events closer than the gap
form one window.

A session is [first event, last event + gap): each event is the interval [t, t + gap) and
a key's sessions are the unions of overlapping intervals, so an event grows a session,
starts one, or bridges two into one. Each session holds the aggregates' partials
(aggregates.py): merging two sessions merges their partials, sketches included.

``SessionAggregator`` is keyed by a shard of keys; its state is one Arrow table of the
sessions held (key, bounds, version, whether final, partials) and, with an id column, the
id hashes counted with their event times. Changes on the output:
- a session grows: ``provisional`` (``correction`` once behind the watermark), with
  ``previous`` its values before, under its start;
- its start moves earlier, or it is merged into another: its old start gets a
  ``correction`` whose ``values`` are null (the retraction), the merged session its values;
- the watermark passes its end: ``final``; ``lateness`` later it is forgotten.

An event is too late when its time is more than the allowed lateness behind the watermark
and it touches no session still held (sessions have no fixed end, so lateness is measured
on the event's own time); it comes out as a ``late`` row with its offset.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.errors import WindowSpecError
from kappaflow.streams.aggregates import Aggregate
from kappaflow.streams.kinds import (
    CLOSED,
    CORRECTION,
    FINAL,
    LATE,
    PROVISIONAL,
    SESSIONS_WINDOW,
    SHARDS,
    STATS,
)
from kappaflow.streams.ops.arrow_ipc import (
    PACKED_SCHEMA,
    PackedProcessor,
    frame_from_ipc,
    frame_to_ipc,
    table_from_ipc,
    table_to_ipc,
)
from kappaflow.streams.ops.folding import WEIGHT, input_name, partial_fields, reduce_groups
from kappaflow.streams.ops.operator_rows import dead_letter_rows
from kappaflow.streams.ops.windowing import (
    OUTPUT_ARROW_SCHEMA,
    bind_aggregates,
    event_time_watermark,
    jvm_operator,
    key_json,
    output_table,
    replay_marker,
    spark_engine,
    values_json,
)
from kappaflow.timeutil import from_epoch_ms, iso

STATE_SCHEMA = "sessions BINARY, ids BINARY"
#: The shard of the records that did not parse.
DEAD_SHARD = -1
#: A held session's columns besides its partials.
_META = ("key", "start", "end", "version", "final")
_META_TYPES = (pa.string(), pa.int64(), pa.int64(), pa.int64(), pa.bool_())


class SessionState(NamedTuple):
    """A shard's state value (STATE_SCHEMA)."""

    #: The sessions held: Arrow IPC bytes of ``SessionAggregator.held``.
    sessions: bytes
    #: The id hashes already counted, with their event times (empty without an id).
    ids: bytes


def aggregate_sessions(
    events: DataFrame,
    *,
    keys: Sequence[str],
    aggregates: Mapping[str, Aggregate],
    gap_ms: int,
    watermark_ms: int | None,
    lateness_ms: int,
    id_column: str | None,
    dead_letters: bool = False,
    engine: str | None = None,
) -> DataFrame:
    """The changes, late events and statistics of ``aggregates`` per key and session
    (windowing.OUTPUT_SCHEMA rows, packed as by windowing.aggregate_windows).

    ``dead_letters``: as for windowing.aggregate_windows, records that did not parse
    travel through the operator, in a shard of their own, and come out as ``dlq`` rows.
    ``engine``: as for windowing.aggregate_windows (``jvm``: io.kappaflow.engine.Sessions,
    its rows unpacked)."""
    if gap_ms <= 0:
        raise WindowSpecError(f"session gap must be positive, got {gap_ms} ms")
    names, bound = bind_aggregates(events, keys, aggregates, id_column)
    jvm = (engine or spark_engine(events)) == "jvm"
    dead = F.col("_kf_reason").isNotNull() if dead_letters else F.lit(False)
    replay = replay_marker(events, dead_letters=dead_letters, jvm=jvm)
    # A replayed dead letter that parsed goes in twice: as an event, and apart to be counted.
    twice = replay.isNotNull() & ~dead
    apart = dead | F.col("_kf_apart")
    selected = (
        event_time_watermark(events, watermark_ms)
        .withColumn(
            "_kf_apart",
            F.explode(
                F.when(twice, F.array(F.lit(False), F.lit(True))).otherwise(F.array(F.lit(False)))
            ),
        )
        .withColumn("_kf_key", key_json(keys))
        .select(
            F.when(apart, F.lit(DEAD_SHARD))
            .otherwise(F.pmod(F.xxhash64("_kf_key"), F.lit(SHARDS)))
            .cast("int")
            .alias("shard"),
            F.when(apart, replay).otherwise(F.col("_kf_key")).alias("key"),
            F.coalesce(F.col("_kf_time"), F.lit(0)).cast("long").alias("ts"),
            (F.col(id_column).isNotNull() if id_column else F.lit(False)).alias("has_id"),
            (F.coalesce(F.xxhash64(id_column), F.lit(0)) if id_column else F.lit(0))
            .cast("long")
            .alias("id_hash"),
            F.col("_kf_partition").cast("int").alias("src_partition"),
            F.col("_kf_offset").cast("long").alias("src_offset"),
            (F.col("_kf_reason") if dead_letters else F.lit(None)).cast("string").alias("reason"),
            (F.when(dead, F.col("_kf_value")) if dead_letters else F.lit(None))
            .cast("binary")
            .alias("value"),
            *[F.col(a.column).alias(input_name(i)) for i, a in enumerate(bound) if a.column],
        )
    )
    if jvm:
        return jvm_operator(
            "Sessions", selected, names, bound, gap_ms, lateness_ms, id_column is not None
        )
    types = {f.name: to_arrow_type(f.dataType) for f in selected.schema.fields}
    inputs = [(input_name(i), types[input_name(i)]) for i, a in enumerate(bound) if a.column]
    processor = SessionAggregator(
        names, bound, inputs, gap_ms, lateness_ms, dedup=id_column is not None
    )
    return selected.groupBy("shard").transformWithStateInPandas(
        statefulProcessor=PackedProcessor(processor),
        outputStructType=PACKED_SCHEMA,
        outputMode="Update",
        timeMode="EventTime",
    )


class SessionAggregator(StatefulProcessor):
    """The session machine per shard of keys; see the module's docstring."""

    def __init__(
        self,
        names: Sequence[str],
        aggregates: Sequence[Aggregate],
        inputs: Sequence[tuple[str, pa.DataType]],
        gap_ms: int,
        lateness_ms: int,
        dedup: bool,
    ) -> None:
        self.names = list(names)
        self.aggregates = list(aggregates)
        self.inputs = pa.schema([*inputs, (WEIGHT, pa.int64()), ("group", pa.int64())])
        self.gap_ms = gap_ms
        self.lateness_ms = lateness_ms
        self.dedup = dedup
        self.partials = [f.name for f in partial_fields(self.aggregates)]
        self.held = pa.schema(
            [
                *zip(_META, _META_TYPES, strict=True),
                *partial_fields(self.aggregates),
            ]
        )

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("sessions", STATE_SCHEMA)

    # Rows are single events (shard, key, ts, has_id, id_hash, source coordinates, inputs).
    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        events = pd.concat(list(rows), ignore_index=True)
        if int(key[0]) == DEAD_SHARD:
            yield dead_letter_rows(events, "src_offset", OUTPUT_ARROW_SCHEMA)
            return
        stored = self._stored()
        sessions, expired = self._expire(self._sessions(stored), watermark)
        ids = decode_ids(stored.ids if stored else None)
        times = events["ts"].to_numpy(dtype="int64")
        fresh = np.ones(len(events), dtype=bool)
        if self.dedup:
            fresh, ids = fresh_ids(events, ids)
        bounds = sessions.select(["key", "start", "end"]).to_pandas()
        touching = touches(events["key"].to_numpy(dtype=object), times, bounds, self.gap_ms)
        late = fresh & (times < watermark - self.lateness_ms) & ~touching
        counted = fresh & ~late
        held = sessions.num_rows
        out: list[pa.Table] = []
        if late.any():
            out.append(self._too_late(events[late], watermark))
        if counted.any():
            sessions, changes = self._merge(sessions, events[counted], watermark)
            out.append(changes)
        stats = output_table(
            1,
            kind=[STATS],
            window_start=[SESSIONS_WINDOW],
            watermark=[watermark],
            events=[int(counted.sum())],
            duplicates=[int((~fresh).sum())],
            held=[sessions.num_rows - held],
        )
        out = [stats, *expired, *out]
        self._save(sessions, ids, watermark)
        yield pa.concat_tables(out)

    def _merge(
        self, sessions: pa.Table, events: pd.DataFrame, watermark: int
    ) -> tuple[pa.Table, pa.Table]:
        """The sessions with ``events`` folded in, and the changes that makes."""
        held = sessions.select(list(_META)).to_pandas()
        times = events["ts"].to_numpy(dtype="int64")
        intervals = pd.concat(
            [
                held.assign(row=np.arange(len(held)), old=True),
                pd.DataFrame(
                    {
                        "key": events["key"].to_numpy(dtype=object),
                        "start": times,
                        "end": times + self.gap_ms,
                        "version": 0,
                        "final": False,
                        "row": np.arange(len(events)),
                        "old": False,
                    }
                ),
            ],
            ignore_index=True,
        ).sort_values(["key", "start"], kind="stable", ignore_index=True)
        same_key = intervals["key"].eq(intervals["key"].shift())
        reach = intervals.groupby("key", sort=False)["end"].cummax().shift()
        intervals["group"] = (~(same_key & (intervals["start"] < reach))).cumsum()
        touched = ~intervals.groupby("group")["old"].transform("all")
        moving = intervals[touched]
        merged = moving.groupby("group", sort=True).agg(
            key=("key", "first"),
            start=("start", "min"),
            end=("end", "max"),
            version=("version", "max"),
            final=("final", "any"),
        )
        merged["version"] += 1
        partials = self._merged_partials(sessions, events, moving)
        values = values_json(self.names, self.aggregates, partials)
        before = moving[moving["old"]]
        old_values = values_json(
            self.names, self.aggregates, sessions.take(before["row"].to_numpy(dtype="int64"))
        )
        was = dict(zip(zip(before["key"], before["start"], strict=True), old_values, strict=True))
        starts = list(zip(merged["key"], merged["start"], strict=True))
        behind = merged["final"].to_numpy(dtype=bool) | (merged["end"].to_numpy() <= watermark)
        n = len(merged)
        changes = [
            output_table(
                n,
                kind=np.where(behind, CORRECTION, PROVISIONAL).tolist(),
                key=merged["key"].tolist(),
                window_start=merged["start"].to_numpy(dtype="int64"),
                window_end=merged["end"].to_numpy(dtype="int64"),
                watermark=np.full(n, watermark),
                values=values,
                previous=[was.get(start) for start in starts],
                version=merged["version"].to_numpy(dtype="int64"),
            )
        ]
        kept_starts = set(starts)
        gone = [
            i
            for i, start in enumerate(zip(before["key"], before["start"], strict=True))
            if start not in kept_starts
        ]
        if gone:
            retracted = before.iloc[gone]
            m = len(retracted)
            changes.append(
                output_table(
                    m,
                    kind=[CORRECTION] * m,
                    key=retracted["key"].tolist(),
                    window_start=retracted["start"].to_numpy(dtype="int64"),
                    window_end=retracted["end"].to_numpy(dtype="int64"),
                    watermark=np.full(m, watermark),
                    previous=[old_values[i] for i in gone],
                    version=retracted["version"].to_numpy(dtype="int64") + 1,
                )
            )
        merged["final"] = merged["final"] & (merged["end"] <= watermark)
        kept = intervals[~touched]["row"].to_numpy(dtype="int64")
        meta = pa.schema([self.held.field(name) for name in _META])
        now = pa.Table.from_pandas(
            merged.reset_index(drop=True)[list(_META)], schema=meta, preserve_index=False
        )
        for name in self.partials:
            now = now.append_column(self.held.field(name), partials[name])
        return pa.concat_tables([sessions.take(kept), now]), pa.concat_tables(changes)

    def _merged_partials(
        self, sessions: pa.Table, events: pd.DataFrame, moving: pd.DataFrame
    ) -> pa.Table:
        """Per touched group (in group order), the partials of its old sessions and its
        new events together."""
        old = moving[moving["old"]]
        new = moving[~moving["old"]]
        picked = events.iloc[new["row"].to_numpy(dtype="int64")].reset_index(drop=True)
        picked[WEIGHT] = 1
        picked["group"] = new["group"].to_numpy(dtype="int64")
        raw = pa.Table.from_pandas(
            picked[self.inputs.names], schema=self.inputs, preserve_index=False
        )
        folded = reduce_groups(raw, ["group"], self.aggregates, raw=True)
        prior = sessions.take(old["row"].to_numpy(dtype="int64")).select(self.partials)
        prior = prior.append_column("group", pa.array(old["group"].to_numpy(dtype="int64")))
        both = pa.concat_tables([prior, folded.select([*self.partials, "group"])])
        return reduce_groups(both, ["group"], self.aggregates, raw=False).sort_by("group")

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        stored = self._stored()
        if stored is None:
            return
        sessions = self._sessions(stored)
        ids = decode_ids(stored.ids)
        sessions, out = self._expire(sessions, watermark)
        self._save(sessions, ids, watermark)
        if out:
            yield pa.concat_tables(out)

    def _expire(self, sessions: pa.Table, watermark: int) -> tuple[pa.Table, list[pa.Table]]:
        """The sessions the watermark has passed made final (their ``final`` rows), and
        those past the allowed lateness forgotten. Run before a batch's events too, so
        that what an event meets does not depend on whether the timers ran first."""
        out: list[pa.Table] = []
        final = sessions["final"].to_numpy(zero_copy_only=False)
        end = sessions["end"].to_numpy()
        due = ~final & (end <= watermark)
        if due.any():
            version = sessions["version"].to_numpy() + due
            sessions = sessions.set_column(3, "version", pa.array(version, pa.int64()))
            sessions = sessions.set_column(4, "final", pa.array(final | due))
            ending = sessions.filter(pa.array(due))
            values = values_json(self.names, self.aggregates, ending)
            n = ending.num_rows
            out.append(
                output_table(
                    n,
                    kind=[FINAL] * n,
                    key=ending["key"],
                    window_start=ending["start"],
                    window_end=ending["end"],
                    watermark=np.full(n, watermark),
                    values=values,
                    previous=values,
                    version=ending["version"],
                )
            )
        gone = end + self.lateness_ms <= watermark
        if gone.any():
            closed = output_table(
                1, kind=[CLOSED], window_start=[SESSIONS_WINDOW], held=[-int(gone.sum())]
            )
            out.append(closed)
            sessions = sessions.filter(pa.array(~gone))
        return sessions, out

    def _save(self, sessions: pa.Table, ids: pd.DataFrame, watermark: int) -> None:
        """Keep what may still change; wake up when the next session is due."""
        # An older id can come back only as a late event, unless it touches a session
        # still held: those keep taking events however far behind the watermark.
        horizon = watermark - self.lateness_ms - self.gap_ms
        if sessions.num_rows:
            horizon = min(horizon, int(np.min(sessions["start"].to_numpy())) - self.gap_ms)
        ids = ids[ids["ts"] >= horizon]
        if not sessions.num_rows:
            self.state.clear()
            return
        self.state.update(SessionState(table_to_ipc(sessions), frame_to_ipc(ids)))
        final = sessions["final"].to_numpy(zero_copy_only=False)
        end = sessions["end"].to_numpy()
        self.handle.registerTimer(int(np.min(np.where(final, end + self.lateness_ms, end))))

    def _too_late(self, late: pd.DataFrame, watermark: int) -> pa.Table:
        """The too-late events, one row each, in the session each would have started."""
        reason = (
            f"too late: more than {self.lateness_ms} ms behind the watermark "
            f"({iso(from_epoch_ms(watermark))}) and touching no session still held"
        )
        times = late["ts"].to_numpy(dtype="int64")
        offsets = late["src_offset"].to_numpy(dtype="int64")
        n = len(late)
        return output_table(
            n,
            kind=[LATE] * n,
            key=late["key"].tolist(),
            window_start=times,
            window_end=times + self.gap_ms,
            watermark=np.full(n, watermark),
            events=np.ones(n, dtype="int64"),
            reason=[reason] * n,
            src_partition=late["src_partition"].to_numpy(dtype="int32"),
            src_offset=offsets,
            src_offset_end=offsets,
            offsets=[[int(o)] for o in offsets],
        )

    def _sessions(self, stored: SessionState | None) -> pa.Table:
        if stored is None or not stored.sessions:
            return self.held.empty_table()
        return table_from_ipc(stored.sessions).cast(self.held)

    def _stored(self) -> SessionState | None:
        """The state value, if the shard has one (Spark returns it as a plain tuple)."""
        stored = self.state.get()
        return SessionState(*stored) if stored is not None else None

    def close(self) -> None:
        pass


def decode_ids(blob: bytes | None) -> pd.DataFrame:
    if not blob:
        return pd.DataFrame({"hash": pd.Series(dtype="int64"), "ts": pd.Series(dtype="int64")})
    return frame_from_ipc(blob)


def fresh_ids(events: pd.DataFrame, ids: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
    """Which events count (not a repeat of an id seen before or earlier in ``events``:
    columns ``has_id``, ``id_hash``, ``ts``), and the ids seen with the new ones added."""
    has_id = events["has_id"].to_numpy(dtype=bool)
    values = events["id_hash"].to_numpy(dtype="int64")
    repeat = pd.Series(values).duplicated().to_numpy() & has_id
    known = np.isin(values, ids["hash"].to_numpy(dtype="int64")) & has_id
    fresh = ~repeat & ~known
    added = pd.DataFrame(
        {
            "hash": values[fresh & has_id],
            "ts": events["ts"].to_numpy(dtype="int64")[fresh & has_id],
        }
    )
    return fresh, pd.concat([ids, added], ignore_index=True)


def touches(keys: np.ndarray, times: np.ndarray, sessions: pd.DataFrame, gap: int) -> np.ndarray:
    """For each event, whether its interval [t, t + gap) overlaps a held session."""
    if sessions.empty:
        return np.zeros(len(keys), dtype=bool)
    probe = pd.DataFrame({"key": keys, "t": times, "i": np.arange(len(keys))})
    pairs = probe.merge(sessions[["key", "start", "end"]], on="key")
    hit = (pairs["t"] < pairs["end"]) & (pairs["start"] < pairs["t"] + gap)
    touching = np.zeros(len(keys), dtype=bool)
    touching[pairs.loc[hit, "i"].to_numpy(dtype="int64")] = True
    return touching
