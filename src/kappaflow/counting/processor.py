"""The counting state machine, in Spark's state store, vectorised per window and shard.

State is kept per (window, shard): the keys are spread over ``SHARDS`` shards by hash, and
one state value holds, for all keys of a shard in a window, the count and the version
that orders its changes (an Arrow table), the ids already counted (with ``--id``), and
whether the window is final. A micro-batch costs one read and one write of that value per
(window, shard), whatever the number of keys; its input is already folded to one row per
(window, key) (preagg.py) and the work on it is Arrow compute over all of a shard's keys
at once. The output leaves packed (``Packed``): one Arrow stream per group,
so Spark moves a few binary rows instead of one row per change.

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
from typing import Any

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

from kappaflow.timeutil import from_epoch_ms, iso

#: Keys of a window are spread over this many state values (and parallel tasks).
SHARDS = 16
#: The group (window -1) of records that cannot be counted: they pass as dead letters.
DEAD_WINDOW = -1

#: One schema for everything the operator emits, and for dead letters unioned after it.
OUTPUT_SCHEMA = (
    "kind STRING, key STRING, window_start BIGINT, window_end BIGINT, count BIGINT, "
    "previous BIGINT, version BIGINT, watermark BIGINT, counted BIGINT, duplicates BIGINT, "
    "reason STRING, value BINARY, src_partition INT, src_offset BIGINT, src_offset_end BIGINT"
)
#: OUTPUT_SCHEMA in Arrow's terms.
OUTPUT_ARROW_SCHEMA = pa.schema(
    [
        pa.field(
            name,
            {"STRING": pa.string(), "BIGINT": pa.int64(), "INT": pa.int32()}.get(sql, pa.binary()),
        )
        for name, sql in (part.split() for part in OUTPUT_SCHEMA.split(", "))
    ]
)
#: What the operator hands Spark: each group's output rows packed into one Arrow stream.
PACKED_SCHEMA = "rows BINARY"
STATE_SCHEMA = "counts BINARY, ids BINARY, final BOOLEAN"

PROVISIONAL, FINAL, CORRECTION = "provisional", "final", "correction"
LATE, DEAD, STATS, CLOSED = "late", "dlq", "stats", "closed"
CHANGE_KINDS = (PROVISIONAL, FINAL, CORRECTION)


def output_table(n: int, **columns: Any) -> pa.Table:
    """``n`` output rows as Arrow; columns not given are 0 (numbers), -1 (partition) or
    null. Values may be lists, numpy arrays or Arrow arrays."""
    arrays: list[pa.Array | pa.ChunkedArray] = []
    for field in OUTPUT_ARROW_SCHEMA:
        values = columns.get(field.name)
        if isinstance(values, pa.ChunkedArray | pa.Array):
            arrays.append(values.cast(field.type))
        elif values is not None:
            arrays.append(pa.array(values, type=field.type))
        elif field.name == "src_partition":
            arrays.append(pa.array(np.full(n, -1, dtype="int32")))
        elif field.type == pa.int64():
            arrays.append(pa.array(np.zeros(n, dtype="int64")))
        else:
            arrays.append(pa.nulls(n, field.type))
    return pa.Table.from_arrays(arrays, schema=OUTPUT_ARROW_SCHEMA)


def output_rows(n: int, **columns: Any) -> pd.DataFrame:
    """``output_table`` as a DataFrame, for the processors that work in pandas."""
    frame: pd.DataFrame = output_table(n, **columns).to_pandas()
    return frame


class Packed(StatefulProcessor):
    """``processor`` with its output packed: one row per group and call, holding all the
    rows it emitted as Arrow IPC bytes (``unpack`` restores them).

    A micro-batch emits about one change per key; packed, Spark moves a few binary rows
    per group instead of converting and shuffling thousands of narrow rows one by one.
    """

    def __init__(self, processor: StatefulProcessor) -> None:
        self.processor = processor

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.processor.init(handle)

    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        yield from _packed(self.processor.handleInputRows(key, rows, timerValues))

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        yield from _packed(self.processor.handleExpiredTimer(key, timerValues, expiredTimerInfo))

    def close(self) -> None:
        self.processor.close()


def _packed(parts: Iterator[Any]) -> Iterator[pd.DataFrame]:
    """Output parts (Arrow tables, or DataFrames) as one packed row."""
    tables = [
        part
        if isinstance(part, pa.Table)
        else pa.Table.from_pandas(part, schema=OUTPUT_ARROW_SCHEMA, preserve_index=False)
        for part in parts
        if len(part)
    ]
    if tables:
        yield pd.DataFrame({"rows": [_ipc_bytes(pa.concat_tables(tables))]})


def unpack(packed: pa.Table) -> pa.Table:
    """The rows packed by ``Packed``, as one table of OUTPUT_SCHEMA."""
    tables = [
        pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
        for blob in packed["rows"].to_pylist()
        if blob
    ]
    return pa.concat_tables(tables) if tables else OUTPUT_ARROW_SCHEMA.empty_table()


def _ipc_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


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


#: A window shard's state: the count and version of each key.
COUNTS_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64()), ("version", pa.int64())])


def counts_table(blob: bytes | None) -> pa.Table:
    """A shard's counts from its state value (Arrow IPC bytes)."""
    if not blob:
        return COUNTS_SCHEMA.empty_table()
    table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
    return table.select(COUNTS_SCHEMA.names).cast(COUNTS_SCHEMA)


def decode_counts(blob: bytes | None) -> pd.DataFrame:
    """A shard's counts as a DataFrame indexed by key (columns count, version)."""
    frame: pd.DataFrame = counts_table(blob).to_pandas()
    return frame.set_index("key")


def arrow_bytes(frame: pd.DataFrame) -> bytes:
    """A DataFrame (without its index) as Arrow IPC stream bytes, for a state value."""
    return _ipc_bytes(pa.Table.from_pandas(frame, preserve_index=False))


def arrow_frame(blob: bytes) -> pd.DataFrame:
    frame: pd.DataFrame = pa.ipc.open_stream(pa.py_buffer(blob)).read_all().to_pandas()
    return frame


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
    # Output leaves as Arrow tables, which Packed hands to Spark.
    def handleInputRows(  # type: ignore[override]
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pa.Table]:
        watermark = timerValues.getCurrentWatermarkInMs()
        folded = pd.concat(list(rows), ignore_index=True)
        start = int(key[0])
        if start == DEAD_WINDOW:
            yield self._dead(folded)
            return
        end = start + self.size_ms
        primary = folded["primary"].to_numpy(dtype=bool)
        if end + self.lateness_ms <= watermark:
            yield self._late(folded[primary], start, end, watermark)
            return
        stored = self.state.get()
        counts = counts_table(stored[0] if stored else None)
        seen = np.frombuffer(stored[1], dtype="int64") if stored and stored[1] else None
        final = bool(stored[2]) if stored else False
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
                self.state.update((_ipc_bytes(counts), seen.tobytes(), final or behind))
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
            (_ipc_bytes(counts), seen.tobytes() if seen is not None else b"", final or behind)
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

    @staticmethod
    def _dead(folded: pd.DataFrame) -> pa.Table:
        n = len(folded)
        return output_table(
            n,
            kind=[DEAD] * n,
            reason=folded["reason"].tolist(),
            value=folded["value"].tolist(),
            src_partition=folded["src_partition"].to_numpy(),
            src_offset=folded["first_offset"].to_numpy(dtype="int64"),
            src_offset_end=folded["first_offset"].to_numpy(dtype="int64"),
        )

    def _late(self, late: pd.DataFrame, start: int, end: int, watermark: int) -> pa.Table:
        """The too-late events, through their newest window, with the watermark: one row
        per folded row, with its number of events (``count``) and offset range, from which
        the batch writer reads them back to report each one."""
        reason = (
            f"too late: window {iso(from_epoch_ms(start))}/{iso(from_epoch_ms(end))} "
            f"stopped taking corrections {self.lateness_ms} ms after the watermark "
            f"passed its end (watermark {iso(from_epoch_ms(watermark))})"
        )
        n = len(late)
        return _window_rows(
            LATE,
            late["key"].tolist(),
            start,
            end,
            watermark,
            count=late["events"].to_numpy(dtype="int64"),
            reason=[reason] * n,
            src_partition=late["src_partition"].to_numpy(dtype="int32"),
            src_offset=late["first_offset"].to_numpy(dtype="int64"),
            src_offset_end=late["last_offset"].to_numpy(dtype="int64"),
        )

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pa.Table]:
        start = int(key[0])
        end = start + self.size_ms
        expiry = expiredTimerInfo.getExpiryTimeInMs()
        watermark = timerValues.getCurrentWatermarkInMs()
        stored = self.state.get()
        if stored is None:
            return
        counts = counts_table(stored[0])
        tables: list[pa.Table] = []
        if expiry == end and not stored[2]:
            version = pc.add(counts["version"], 1)
            counts = counts.set_column(2, "version", version)
            self.state.update((_ipc_bytes(counts), stored[1], True))
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
