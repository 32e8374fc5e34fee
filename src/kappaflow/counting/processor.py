"""The counting state machine, one instance per (key, window), in Spark's state store.

For each window it keeps the count, a version that orders its changes, and whether it is
final; with ``--id`` also the ids it has counted. Per micro-batch it turns the window's
new events into one change (provisional before the watermark passes the window's end, a
correction after), and timers turn the watermark passing the end into a ``final`` change
and, ``allowed_lateness`` later, into forgetting the window. Events for a window already
forgotten are too late: they come out as ``late`` rows, never silently dropped.

The watermark Spark gives the timers is the largest event time seen minus ``--watermark``.
Spark would also drop input rows behind it before they reach this operator; the pipeline
prevents that by removing the watermarked column before the operator (see pipeline.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.timeutil import from_epoch_ms, iso

#: One schema for everything the operator emits, and for dead letters unioned after it.
OUTPUT_SCHEMA = (
    "kind STRING, key STRING, window_start BIGINT, window_end BIGINT, count BIGINT, "
    "previous BIGINT, version BIGINT, watermark BIGINT, counted BIGINT, duplicates BIGINT, "
    "reason STRING, value BINARY, src_topic STRING, src_partition INT, src_offset BIGINT"
)
COLUMNS = [part.split()[0] for part in OUTPUT_SCHEMA.split(", ")]

PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
LATE, DEAD, STATS, CLOSED = "late", "dlq", "stats", "closed"
CHANGE_KINDS = (PROVISIONAL, FINAL, CORRECTION)


#: The BIGINT columns: 0 where a kind of row has no value for them.
_LONGS = [c for c in COLUMNS if f"{c} BIGINT" in OUTPUT_SCHEMA]


def _row(**values: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(dict.fromkeys(_LONGS, 0))
    row["src_partition"] = -1
    row.update(values)
    return row


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS)
    for column in _LONGS:
        frame[column] = frame[column].astype("int64")
    frame["src_partition"] = frame["src_partition"].astype("int32")
    return frame


class WindowCounter(StatefulProcessor):
    def __init__(self, size_ms: int, lateness_ms: int, dedup: bool) -> None:
        self.size_ms = size_ms
        self.lateness_ms = lateness_ms
        self.dedup = dedup

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.window = handle.getValueState("window", "count BIGINT, version BIGINT, final BOOLEAN")
        self.ids = handle.getListState("ids", "id STRING")

    # The pandas flavour of the API: rows arrive as DataFrames, not Rows.
    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        watermark = timerValues.getCurrentWatermarkInMs()
        events = pd.concat(list(rows), ignore_index=True)
        name, start = str(key[0]), int(key[1])
        end = start + self.size_ms
        primary = events["primary"].astype(bool)
        if end + self.lateness_ms <= watermark:
            # Forgotten already (or never seen before it became too late): report each
            # event once, through its newest window, with the watermark that made it late.
            late = events[primary]
            reason = (
                f"too late: window {iso(from_epoch_ms(start))}/{iso(from_epoch_ms(end))} "
                f"stopped taking corrections {self.lateness_ms} ms after the watermark "
                f"passed its end (watermark {iso(from_epoch_ms(watermark))})"
            )
            yield _frame(
                [
                    _row(
                        kind=LATE,
                        key=name,
                        window_start=start,
                        window_end=end,
                        watermark=watermark,
                        reason=reason,
                        value=r.value,
                        src_topic=r.src_topic,
                        src_partition=int(str(r.src_partition)),
                        src_offset=int(str(r.src_offset)),
                    )
                    for r in late.itertuples(index=False)
                ]
            )
            return
        fresh = self._fresh(events) if self.dedup else pd.Series(True, index=events.index)
        counted = events[fresh]
        rows_out = [
            _row(
                kind=STATS,
                key=name,
                window_start=start,
                window_end=end,
                counted=int((fresh & primary).sum()),
                duplicates=int((~fresh & primary).sum()),
                watermark=watermark,
            )
        ]
        if len(counted):
            state = self.window.get()
            count, version, final = state or (0, 0, False)
            behind = end <= watermark
            kind = CORRECTION if final or behind else PROVISIONAL
            self.window.update((count + len(counted), version + 1, final or behind))
            if state is None:
                # A new window: its timers, once (re-registering one only logs a warning).
                if not behind:
                    self.handle.registerTimer(end)
                if self.lateness_ms or behind:
                    self.handle.registerTimer(end + self.lateness_ms)
            rows_out.append(
                _row(
                    kind=kind,
                    key=name,
                    window_start=start,
                    window_end=end,
                    count=count + len(counted),
                    previous=count,
                    version=version + 1,
                    watermark=watermark,
                )
            )
        yield _frame(rows_out)

    def _fresh(self, events: pd.DataFrame) -> pd.Series:
        """Events not seen before in this window (by id); events without an id count."""
        has_id = events["id"].notna()
        seen = {row[0] for row in self.ids.get()} if self.ids.exists() else set()
        first = ~events.duplicated("id") & ~events["id"].isin(seen)
        fresh = first | ~has_id
        new_ids = events.loc[fresh & has_id, "id"].tolist()
        if new_ids:
            self.ids.appendList([(str(i),) for i in new_ids])
        return fresh

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        name, start = str(key[0]), int(key[1])
        end = start + self.size_ms
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        rows: list[dict[str, Any]] = []
        state = self.window.get() if self.window.exists() else None
        if state is not None and expiry == end and not state[2]:
            count, version, _ = state
            self.window.update((count, version + 1, True))
            rows.append(
                _row(
                    kind=FINAL,
                    key=name,
                    window_start=start,
                    window_end=end,
                    count=count,
                    previous=count,
                    version=version + 1,
                    watermark=watermark,
                )
            )
        if expiry == end + self.lateness_ms:
            # No correction can come any more: forget the window and its ids.
            self.window.clear()
            self.ids.clear()
            rows.append(
                _row(kind=CLOSED, key=name, window_start=start, window_end=end, watermark=watermark)
            )
        if rows:
            yield _frame(rows)

    def close(self) -> None:
        pass
