"""Session windows: per key, events closer than the gap form one window.

A session is [first event, last event + gap). Each event is the interval [t, t + gap);
a key's sessions are the unions of overlapping intervals, so an event can grow a
session, start a new one, or bridge two into one. State is kept per shard of keys (one
Arrow table of sessions, plus the id hashes already counted with ``--id``), like the
fixed windows' state in windows.py.

What a session's change looks like on the changelog:
- it grows: ``provisional`` (or ``correction`` once final or behind the watermark) with
  the previous count, under the session's start;
- its start moves earlier, or it is merged into another: the old start gets a
  ``correction`` to count 0 (the retraction), the merged session its new count;
- the watermark passes its end: ``final``; ``allowed_lateness`` later it is forgotten.

An event is too late (``NAME.late``) when its time is more than the allowed lateness
behind the watermark and it touches no session still held: sessions have no fixed end,
so lateness is measured on the event's own time. Such an event could otherwise only
start a session beside one already forgotten.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.counting.arrow_ipc import frame_from_ipc, frame_to_ipc
from kappaflow.counting.rows import (
    CLOSED,
    CORRECTION,
    DEAD_WINDOW,
    FINAL,
    PROVISIONAL,
    SESSIONS_WINDOW,
    STATS,
    dead_letter_rows,
    late_rows,
    output_rows,
)
from kappaflow.timeutil import from_epoch_ms, iso

STATE_SCHEMA = "sessions BINARY, ids BINARY"


class SessionState(NamedTuple):
    """A shard's state value (STATE_SCHEMA)."""

    #: The sessions held: Arrow IPC bytes of a table of ``_SESSION_COLUMNS``.
    sessions: bytes
    #: The id hashes already counted, with their event times (Arrow IPC bytes).
    ids: bytes


_SESSION_COLUMNS = {
    "key": "object",
    "start": "int64",
    "end": "int64",
    "count": "int64",
    "version": "int64",
    "final": "bool",
}


def decode_sessions(blob: bytes | None) -> pd.DataFrame:
    if not blob:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in _SESSION_COLUMNS.items()})
    return frame_from_ipc(blob)


def decode_ids(blob: bytes | None) -> pd.DataFrame:
    if not blob:
        return pd.DataFrame({"hash": pd.Series(dtype="int64"), "ts": pd.Series(dtype="int64")})
    return frame_from_ipc(blob)


class SessionCounter(StatefulProcessor):
    def __init__(self, gap_ms: int, lateness_ms: int, dedup: bool) -> None:
        self.gap_ms = gap_ms
        self.lateness_ms = lateness_ms
        self.dedup = dedup

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("sessions", STATE_SCHEMA)

    # Rows are single events (key, ts, has_id, id_hash, source coordinates), not folded.
    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame | pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        events = pd.concat(list(rows), ignore_index=True)
        if int(key[0]) == DEAD_WINDOW:
            yield dead_letter_rows(events, "src_offset")
            return
        stored = self._stored()
        sessions = decode_sessions(stored.sessions if stored else None)
        ids = decode_ids(stored.ids if stored else None)
        times = events["ts"].to_numpy(dtype="int64")
        fresh = np.ones(len(events), dtype=bool)
        if self.dedup:
            fresh, ids = fresh_ids(events, ids)
        touching = touches(events["key"].to_numpy(dtype=object), times, sessions, self.gap_ms)
        late = fresh & (times < watermark - self.lateness_ms) & ~touching
        counted = fresh & ~late
        frames = [
            output_rows(
                1,
                kind=[STATS],
                window_start=[SESSIONS_WINDOW],
                window_end=[SESSIONS_WINDOW],
                counted=[int(counted.sum())],
                duplicates=[int((~fresh).sum())],
                watermark=[watermark],
            )
        ]
        if late.any():
            frames.append(self._too_late(events[late], watermark))
        if counted.any():
            sessions, changes, held = _merge(
                sessions, events["key"][counted], times[counted], self.gap_ms, watermark
            )
            frames.append(changes)
            frames[0].loc[0, "count"] = held
        self._save(sessions, ids, watermark)
        yield pd.concat(frames, ignore_index=True)

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        stored = self._stored()
        if stored is None:
            return
        sessions = decode_sessions(stored.sessions)
        ids = decode_ids(stored.ids)
        frames: list[pd.DataFrame] = []
        due = (~sessions["final"]) & (sessions["end"] <= watermark)
        if due.any():
            ending = sessions[due]
            version = ending["version"] + 1
            frames.append(
                _changes(FINAL, ending, ending["count"], ending["count"], version, watermark)
            )
            sessions.loc[due, "version"] = version
            sessions.loc[due, "final"] = True
        gone = sessions["end"] + self.lateness_ms <= watermark
        if gone.any():
            frames.append(
                output_rows(
                    1,
                    kind=[CLOSED],
                    window_start=[SESSIONS_WINDOW],
                    window_end=[SESSIONS_WINDOW],
                    count=[int(gone.sum())],
                    watermark=[watermark],
                )
            )
            sessions = sessions[~gone].reset_index(drop=True)
        self._save(sessions, ids, watermark)
        if frames:
            yield pd.concat(frames, ignore_index=True)

    def _save(self, sessions: pd.DataFrame, ids: pd.DataFrame, watermark: int) -> None:
        """Keep what may still change; wake up when the next session is due."""
        # An id older than this can come back only as a late event, never counted, unless
        # it touches a session still held: a session that keeps growing takes in events
        # however far behind the watermark, so its ids stay as long as it does.
        horizon = watermark - self.lateness_ms - self.gap_ms
        if not sessions.empty:
            horizon = min(horizon, int(sessions["start"].min()) - self.gap_ms)
        ids = ids[ids["ts"] >= horizon]
        if sessions.empty:
            self.state.clear()
            return
        self.state.update(
            SessionState(frame_to_ipc(sessions.reset_index(drop=True)), frame_to_ipc(ids))
        )
        due = np.where(sessions["final"], sessions["end"] + self.lateness_ms, sessions["end"])
        self.handle.registerTimer(int(due.min()))

    def _too_late(self, late: pd.DataFrame, watermark: int) -> pd.DataFrame:
        """The too-late events, one row each, in the session each would have started."""
        reason = (
            f"too late: more than {self.lateness_ms} ms behind the watermark "
            f"({iso(from_epoch_ms(watermark))}) and touching no session still held"
        )
        times = late["ts"].to_numpy(dtype="int64")
        rows: pd.DataFrame = late_rows(
            late,
            window_start=times,
            window_end=times + self.gap_ms,
            watermark=watermark,
            reason=reason,
            count=1,
            offset_columns=("src_offset", "src_offset"),
        ).to_pandas()
        return rows

    def _stored(self) -> SessionState | None:
        """The state value, if the shard has one (Spark returns it as a plain tuple)."""
        stored = self.state.get()
        return SessionState(*stored) if stored is not None else None

    def close(self) -> None:
        pass


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


def _merge(
    sessions: pd.DataFrame, keys: pd.Series, times: np.ndarray, gap: int, watermark: int
) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Fold events into the sessions: (sessions now, change rows, change in sessions held)."""
    old = sessions.assign(old=True)
    new = pd.DataFrame(
        {
            "key": keys.to_numpy(dtype=object),
            "start": times,
            "end": times + gap,
            "count": np.ones(len(times), dtype="int64"),
            "version": np.zeros(len(times), dtype="int64"),
            "final": np.zeros(len(times), dtype=bool),
            "old": np.zeros(len(times), dtype=bool),
        }
    )
    rows = pd.concat([old, new], ignore_index=True).sort_values(
        ["key", "start"], kind="stable", ignore_index=True
    )
    same_key = rows["key"].eq(rows["key"].shift())
    reach = rows.groupby("key", sort=False)["end"].cummax().shift()
    rows["group"] = (~(same_key & (rows["start"] < reach))).cumsum()
    touched = rows.groupby("group")["old"].transform("all") == False  # noqa: E712
    grouped = rows[touched].groupby("group", sort=False)
    merged = grouped.agg(
        key=("key", "first"),
        start=("start", "min"),
        end=("end", "max"),
        count=("count", "sum"),
        version=("version", "max"),
        final=("final", "any"),
    )
    merged["version"] += 1
    before = rows[touched & rows["old"]]
    # The count the merged session had under the same start, if it had one.
    kept = before.merge(merged[["key", "start"]], on=["key", "start"])
    previous = (
        merged.merge(
            kept[["key", "start", "count"]], on=["key", "start"], how="left", suffixes=("", "_was")
        )["count_was"]
        .fillna(0)
        .astype("int64")
        .to_numpy()
    )
    behind = merged["final"].to_numpy() | (merged["end"].to_numpy() <= watermark)
    kinds = np.where(behind, CORRECTION, PROVISIONAL)
    changes = [
        _changes(list(kinds), merged, merged["count"], previous, merged["version"], watermark)
    ]
    starts = set(zip(merged["key"], merged["start"], strict=True))
    retracted = before[
        [(k, s) not in starts for k, s in zip(before["key"], before["start"], strict=True)]
    ]
    if len(retracted):
        changes.append(
            _changes(
                CORRECTION,
                retracted,
                np.zeros(len(retracted), dtype="int64"),
                retracted["count"],
                retracted["version"] + 1,
                watermark,
            )
        )
    merged["final"] = merged["final"] & (merged["end"] <= watermark)
    untouched = rows[~touched & rows["old"]]
    now = pd.concat(
        [untouched[list(_SESSION_COLUMNS)], merged.reset_index(drop=True)[list(_SESSION_COLUMNS)]],
        ignore_index=True,
    )
    held = len(now) - len(sessions)
    return now, pd.concat(changes, ignore_index=True), held


def _changes(
    kind: str | list[str],
    sessions: pd.DataFrame,
    count: Any,
    previous: Any,
    version: Any,
    watermark: int,
) -> pd.DataFrame:
    n = len(sessions)
    return output_rows(
        n,
        kind=kind if isinstance(kind, list) else [kind] * n,
        key=sessions["key"].tolist(),
        window_start=sessions["start"].to_numpy(dtype="int64"),
        window_end=sessions["end"].to_numpy(dtype="int64"),
        count=np.asarray(count, dtype="int64"),
        previous=np.asarray(previous, dtype="int64"),
        version=np.asarray(version, dtype="int64"),
        watermark=np.full(n, watermark),
    )
