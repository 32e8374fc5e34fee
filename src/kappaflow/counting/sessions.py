"""Session windows: per key, events closer than the gap form one window.

A session is [first event, last event + gap). Each event is the interval [t, t + gap);
a key's sessions are the unions of overlapping intervals, so an event can grow a
session, start a new one, or bridge two into one. State is kept per shard of keys (one
Arrow table of sessions, plus the id hashes already counted with ``--id``), like the
fixed windows' state in processor.py.

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
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.counting.processor import (
    CLOSED,
    CORRECTION,
    DEAD,
    DEAD_WINDOW,
    FINAL,
    LATE,
    PROVISIONAL,
    STATS,
    arrow_bytes,
    arrow_frame,
    output_rows,
)
from kappaflow.counting.store import SESSIONS
from kappaflow.timeutil import from_epoch_ms, iso

STATE_SCHEMA = "sessions BINARY, ids BINARY"
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
    return arrow_frame(blob)


def _decode_ids(blob: bytes | None) -> pd.DataFrame:
    if not blob:
        return pd.DataFrame({"hash": pd.Series(dtype="int64"), "ts": pd.Series(dtype="int64")})
    return arrow_frame(blob)


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
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        events = pd.concat(list(rows), ignore_index=True)
        if int(key[0]) == DEAD_WINDOW:
            yield _dead(events)
            return
        stored = self.state.get()
        sessions = decode_sessions(stored[0] if stored else None)
        ids = _decode_ids(stored[1] if stored else None)
        times = events["ts"].to_numpy(dtype="int64")
        fresh = np.ones(len(events), dtype=bool)
        if self.dedup:
            fresh, ids = _fresh(events, ids)
        touching = _touches(events["key"].to_numpy(dtype=object), times, sessions, self.gap_ms)
        late = fresh & (times < watermark - self.lateness_ms) & ~touching
        counted = fresh & ~late
        frames = [
            output_rows(
                1,
                kind=[STATS],
                window_start=[SESSIONS],
                window_end=[SESSIONS],
                counted=[int(counted.sum())],
                duplicates=[int((~fresh).sum())],
                watermark=[watermark],
            )
        ]
        if late.any():
            frames.append(self._late(events[late], watermark))
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
        stored = self.state.get()
        if stored is None:
            return
        sessions = decode_sessions(stored[0])
        ids = _decode_ids(stored[1])
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
                    window_start=[SESSIONS],
                    window_end=[SESSIONS],
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
        self.state.update((arrow_bytes(sessions.reset_index(drop=True)), arrow_bytes(ids)))
        due = np.where(sessions["final"], sessions["end"] + self.lateness_ms, sessions["end"])
        self.handle.registerTimer(int(due.min()))

    def _late(self, late: pd.DataFrame, watermark: int) -> pd.DataFrame:
        n = len(late)
        reason = (
            f"too late: more than {self.lateness_ms} ms behind the watermark "
            f"({iso(from_epoch_ms(watermark))}) and touching no session still held"
        )
        times = late["ts"].to_numpy(dtype="int64")
        return output_rows(
            n,
            kind=[LATE] * n,
            key=late["key"].tolist(),
            window_start=times,
            window_end=times + self.gap_ms,
            watermark=np.full(n, watermark),
            reason=[reason] * n,
            src_partition=late["src_partition"].to_numpy(dtype="int32"),
            count=np.ones(n, dtype="int64"),
            src_offset=late["src_offset"].to_numpy(dtype="int64"),
            src_offset_end=late["src_offset"].to_numpy(dtype="int64"),
        )

    def close(self) -> None:
        pass


def _fresh(events: pd.DataFrame, ids: pd.DataFrame) -> tuple[np.ndarray, pd.DataFrame]:
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


def _touches(keys: np.ndarray, times: np.ndarray, sessions: pd.DataFrame, gap: int) -> np.ndarray:
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


def _dead(events: pd.DataFrame) -> pd.DataFrame:
    n = len(events)
    return output_rows(
        n,
        kind=[DEAD] * n,
        reason=events["reason"].tolist(),
        value=events["value"].tolist(),
        src_partition=events["src_partition"].to_numpy(dtype="int32"),
        src_offset=events["src_offset"].to_numpy(dtype="int64"),
        src_offset_end=events["src_offset"].to_numpy(dtype="int64"),
    )
