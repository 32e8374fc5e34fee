"""Fixed windows' state machine, in Spark's state store, vectorised per window and shard.

State is kept per (window, shard): the keys are spread over ``SHARDS`` shards by hash (rows.py), and
one state value holds, for all keys of a shard in a window, the count and the version
that orders its changes (an Arrow table), the ids already counted (with ``--id``), and
whether the window is final. A micro-batch costs one read and one write of that value per
(window, shard), whatever the number of keys; its input is already folded to one row per
(window, key) (preagg.py) and the work on it is Arrow compute over all of a shard's keys
at once. The output leaves packed (arrow_ipc.py): one Arrow stream per group, so Spark
moves a few binary rows instead of one row per change.

Per micro-batch a window's new events become one change per key: provisional before the
watermark passes the window's end, a correction after. Timers turn the watermark passing
the end into a ``final`` change for every key, and ``allowed_lateness`` later into
forgetting the window. Events for a window already forgotten are too late: they come out
as ``late`` rows (one per folded row, with its count and offset range), never silently
dropped. Besides changes, each group emits a ``stats`` row (events counted, duplicates,
and in ``count`` the keys new to the window) and, when forgotten, a ``closed`` row (in
``count`` the keys dropped): the store keeps from them how many keys each window holds.

The watermark Spark gives the timers is the largest event time seen minus ``--watermark``.
Spark would also drop input rows behind it before they reach this operator; the pipeline
prevents that by removing the watermarked column before the operator (see pipeline.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

from kappaflow.counting.arrow_ipc import table_from_ipc, table_to_ipc
from kappaflow.counting.rows import (
    CLOSED,
    CORRECTION,
    DEAD_WINDOW,
    FINAL,
    PROVISIONAL,
    STATS,
    dead_letter_rows,
    late_rows,
    output_table,
)
from kappaflow.timeutil import from_epoch_ms, iso

#: A window shard's counts: the count and version of each key.
COUNTS_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64()), ("version", pa.int64())])
STATE_SCHEMA = "counts BINARY, ids BINARY, final BOOLEAN"


class WindowState(NamedTuple):
    """A window shard's state value (STATE_SCHEMA)."""

    #: The keys' counts and versions: Arrow IPC bytes of COUNTS_SCHEMA.
    counts: bytes
    #: The id hashes already counted in the window (int64s; empty without ``--id``).
    ids: bytes
    #: Whether the watermark has passed the window's end.
    final: bool


def counts_table(blob: bytes | None) -> pa.Table:
    """A shard's counts from its state value (Arrow IPC bytes)."""
    if not blob:
        return COUNTS_SCHEMA.empty_table()
    return table_from_ipc(blob).select(COUNTS_SCHEMA.names).cast(COUNTS_SCHEMA)


def decode_counts(blob: bytes | None) -> pd.DataFrame:
    """A shard's counts as a DataFrame indexed by key (columns count, version)."""
    frame: pd.DataFrame = counts_table(blob).to_pandas()
    return frame.set_index("key")


def _window_rows(
    kind: str, keys: Any, start: int, end: int, watermark: int, **columns: Any
) -> pa.Table:
    """Rows of one kind about ``keys`` of the window [start, end), at ``watermark``."""
    n = len(keys)
    return output_table(
        n,
        kind=pa.repeat(pa.scalar(kind), n) if n else [],
        key=keys,
        window_start=np.full(n, start),
        window_end=np.full(n, end),
        watermark=np.full(n, watermark),
        **columns,
    )


_NO_IDS = np.zeros(0, dtype="int64")


class WindowCounter(StatefulProcessor):
    def __init__(self, size_ms: int, lateness_ms: int, dedup: bool) -> None:
        self.size_ms = size_ms
        self.lateness_ms = lateness_ms
        self.dedup = dedup

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("window", STATE_SCHEMA)

    # The pandas flavour of the API: rows arrive as DataFrames, not Rows. Each row is a
    # folded (window, key) with its number of events, offsets and id hashes (preagg.py).
    # Output leaves as Arrow tables, which PackedProcessor hands to Spark.
    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        folded = pd.concat(list(rows), ignore_index=True)
        start = int(key[0])
        if start == DEAD_WINDOW:
            yield dead_letter_rows(folded, "first_offset")
            return
        end = start + self.size_ms
        primary = folded["primary"].to_numpy(dtype=bool)
        if end + self.lateness_ms <= watermark:
            yield self._too_late(folded[primary], start, end, watermark)
            return
        stored = self._stored()
        counts = counts_table(stored.counts if stored else None)
        seen = np.frombuffer(stored.ids, dtype="int64") if stored and stored.ids else None
        final = bool(stored.final) if stored else False
        events = folded["events"].to_numpy(dtype="int64")
        fresh = events
        if self.dedup:
            fresh, seen = self._fresh(folded, seen)
        # A key can come in several folded rows (one per source partition): sum them.
        added = (
            pa.table({"key": pa.array(folded["key"].to_numpy(), pa.string()), "n": fresh})
            .group_by("key")
            .aggregate([("n", "sum")])
        )
        added = added.filter(pc.greater(added["n_sum"], 0))
        keys = added["key"]
        held = pc.index_in(keys, value_set=counts["key"])
        stats = output_table(
            1,
            kind=[STATS],
            window_start=[start],
            window_end=[end],
            count=[held.null_count],
            counted=[int(fresh[primary].sum())],
            duplicates=[int((events - fresh)[primary].sum())],
            watermark=[watermark],
        )
        behind = end <= watermark
        if stored is None:
            # A new window: its timers, once (re-registering one only logs a warning).
            if not behind:
                self.handle.registerTimer(end)
            if self.lateness_ms or behind:
                self.handle.registerTimer(end + self.lateness_ms)
        if added.num_rows == 0:
            if stored is None and seen is not None:
                self.state.update(
                    WindowState(table_to_ipc(counts), seen.tobytes(), final or behind)
                )
            yield stats
            return
        previous = pc.fill_null(pc.take(counts["count"], held), 0)
        version = pc.add(pc.fill_null(pc.take(counts["version"], held), 0), 1)
        now = pc.add(previous, added["n_sum"])
        counts = pa.concat_tables(
            [
                counts.filter(pc.invert(pc.is_in(counts["key"], value_set=keys))),
                pa.Table.from_arrays([keys, now, version], schema=COUNTS_SCHEMA),
            ]
        )
        self.state.update(
            WindowState(
                table_to_ipc(counts),
                seen.tobytes() if seen is not None else b"",
                final or behind,
            )
        )
        kind = CORRECTION if final or behind else PROVISIONAL
        changes = _window_rows(
            kind, keys, start, end, watermark, count=now, previous=previous, version=version
        )
        yield pa.concat_tables([stats, changes])

    @staticmethod
    def _fresh(folded: pd.DataFrame, seen: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Per folded row, its events not counted before in this window; and the ids now
        counted. Events without an id always count; an id counts once per window."""
        events = folded["events"].to_numpy(dtype="int64")
        lists = [ids if ids is not None else _NO_IDS for ids in folded["ids"]]
        sizes = np.fromiter((len(ids) for ids in lists), dtype="int64", count=len(lists))
        hashes = np.concatenate(lists).astype("int64") if lists else _NO_IDS
        owner = np.repeat(np.arange(len(lists)), sizes)
        known = seen if seen is not None else _NO_IDS
        first = ~pd.Series(hashes).duplicated().to_numpy()
        new = first & ~np.isin(hashes, known)
        fresh = (
            events - sizes + np.bincount(owner, weights=new, minlength=len(lists)).astype("int64")
        )
        return fresh, np.union1d(known, hashes[new])

    def _too_late(self, late: pd.DataFrame, start: int, end: int, watermark: int) -> pa.Table:
        """The too-late events, through their newest window: one row per folded row."""
        reason = (
            f"too late: window {iso(from_epoch_ms(start))}/{iso(from_epoch_ms(end))} "
            f"stopped taking corrections {self.lateness_ms} ms after the watermark "
            f"passed its end (watermark {iso(from_epoch_ms(watermark))})"
        )
        return late_rows(
            late,
            window_start=start,
            window_end=end,
            watermark=watermark,
            reason=reason,
            count=late["events"].to_numpy(dtype="int64"),
            offset_columns=("first_offset", "last_offset"),
        )

    def _stored(self) -> WindowState | None:
        """The state value, if the window has one (Spark returns it as a plain tuple)."""
        stored = self.state.get()
        return WindowState(*stored) if stored is not None else None

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
        counts = counts_table(stored.counts)
        tables: list[pa.Table] = []
        if expiry == end and not stored.final:
            version = pc.add(counts["version"], 1)
            counts = counts.set_column(2, "version", version)
            self.state.update(stored._replace(counts=table_to_ipc(counts), final=True))
            tables.append(
                _window_rows(
                    FINAL,
                    counts["key"],
                    start,
                    end,
                    watermark,
                    count=counts["count"],
                    previous=counts["count"],
                    version=version,
                )
            )
        if expiry == end + self.lateness_ms:
            # No correction can come any more: forget the window and its ids.
            self.state.clear()
            tables.append(
                _window_rows(CLOSED, [None], start, end, watermark, count=[counts.num_rows])
            )
        if tables:
            yield pa.concat_tables(tables)

    def close(self) -> None:
        pass
