"""The window counter's state machine, without Spark: its packed output and state.

The handle below keeps state and timers in memory, as Spark's state store does between
calls; the end-to-end tests in test_counting.py run the same processor inside Spark.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from kappaflow.counting.arrow_ipc import PackedProcessor, unpack
from kappaflow.counting.windows import WindowCounter, decode_counts

SIZE = 60_000
START = 600_000
END = START + SIZE


class Clock:
    def __init__(self, watermark: int) -> None:
        self.watermark = watermark

    def getCurrentWatermarkInMs(self) -> int:  # noqa: N802 (Spark's names)
        return self.watermark


class Expiry:
    def __init__(self, at: int) -> None:
        self.at = at

    def getExpiryTimeInMs(self) -> int:  # noqa: N802
        return self.at


class Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def get(self) -> tuple[Any, ...] | None:
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class Handle:
    def __init__(self) -> None:
        self.state = Value()
        self.timers: set[int] = set()

    def getValueState(self, name: str, schema: str) -> Value:  # noqa: N802
        return self.state

    def registerTimer(self, at: int) -> None:  # noqa: N802
        self.timers.add(at)


def folded(rows: list[tuple[str, int]], partition: int = 0) -> pd.DataFrame:
    """Folded input: (key, events) per row, as preagg.py would hand it over."""
    n = len(rows)
    return pd.DataFrame(
        {
            "window_start": np.full(n, START),
            "shard": np.zeros(n, dtype="int32"),
            "key": [k for k, _ in rows],
            "primary": np.ones(n, dtype=bool),
            "src_partition": np.full(n, partition, dtype="int32"),
            "events": np.array([e for _, e in rows], dtype="int64"),
            "first_offset": np.arange(n, dtype="int64"),
            "last_offset": np.arange(n, dtype="int64"),
            "ids": [None] * n,
            "reason": [None] * n,
            "value": [None] * n,
        }
    )


def rows_of(frames: Iterator[pd.DataFrame]) -> list[dict[str, Any]]:
    packed = list(frames)
    assert len(packed) <= 1, "one packed row per call"
    if not packed:
        return []
    table = unpack(pa.Table.from_pandas(packed[0], preserve_index=False))
    return sorted(table.to_pylist(), key=lambda r: (r["kind"], r["key"] or ""))


def changes(rows: list[dict[str, Any]]) -> list[tuple[str, str, int, int, int]]:
    return [
        (r["kind"], r["key"], r["count"], r["previous"], r["version"])
        for r in rows
        if r["kind"] in ("provisional", "correction", "final")
    ]


def feed(counter: Any, frames: list[pd.DataFrame], watermark: int) -> list[dict[str, Any]]:
    return rows_of(counter.handleInputRows((START, 0), iter(frames), Clock(watermark)))


def fire(counter: Any, at: int, watermark: int) -> list[dict[str, Any]]:
    return rows_of(counter.handleExpiredTimer((START, 0), Clock(watermark), Expiry(at)))


def test_counts_grow_then_become_final_then_take_corrections_then_close() -> None:
    handle = Handle()
    counter = PackedProcessor(WindowCounter(SIZE, lateness_ms=30_000, dedup=False))
    counter.init(handle)  # type: ignore[arg-type]  # the in-memory handle above

    # The same key from two source partitions sums into one change.
    out = feed(counter, [folded([("a", 2), ("b", 1)]), folded([("a", 3)], partition=1)], 0)
    assert changes(out) == [("provisional", "a", 5, 0, 1), ("provisional", "b", 1, 0, 1)]
    stats = next(r for r in out if r["kind"] == "stats")
    assert (stats["counted"], stats["count"]) == (6, 2)  # events counted, keys new
    assert handle.timers == {END, END + 30_000}

    out = feed(counter, [folded([("a", 1), ("c", 4)])], 0)
    assert changes(out) == [("provisional", "a", 6, 5, 2), ("provisional", "c", 4, 0, 1)]
    assert next(r for r in out if r["kind"] == "stats")["count"] == 1

    # The watermark passes the end: every key's count, final, one version on.
    out = fire(counter, END, watermark=END)
    assert changes(out) == [
        ("final", "a", 6, 6, 3),
        ("final", "b", 1, 1, 2),
        ("final", "c", 4, 4, 2),
    ]

    # Behind the watermark, within the allowed lateness: a correction.
    out = feed(counter, [folded([("b", 2)])], END + 5_000)
    assert changes(out) == [("correction", "b", 3, 1, 3)]
    state = handle.state.get()
    assert state is not None and state[2] is True
    assert decode_counts(state[0]).to_dict("index") == {
        "a": {"count": 6, "version": 3},
        "b": {"count": 3, "version": 3},
        "c": {"count": 4, "version": 2},
    }

    # The allowed lateness runs out: the window is forgotten, with how many keys it held.
    out = fire(counter, END + 30_000, watermark=END + 30_000)
    assert [(r["kind"], r["count"]) for r in out] == [("closed", 3)]
    assert handle.state.get() is None

    # Later still: too late, reported with its count, never counted.
    out = feed(counter, [folded([("a", 7)])], END + 31_000)
    assert [(r["kind"], r["key"], r["count"]) for r in out] == [("late", "a", 7)]
    assert "too late" in out[0]["reason"]
