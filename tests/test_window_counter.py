"""The window counter's state machine under PySpark's TwsTester: packed output and state.

TwsTester keeps state and event-time timers in memory and fires the timers as the
watermark is set; the end-to-end tests in test_counting.py run the same processor
inside Spark. Two things differ from the pipeline and are set up here to match it:
- TwsTester drops input rows at or behind the watermark unless told their event time;
  the pipeline removes the watermarked column before the operator so that Spark drops
  none (the processor counts them as corrections or reports them as too late), so every
  row here reports an event time no watermark reaches;
- the tester's grouping key is one value where Spark's is (window_start, shard): the
  processor reads only the window start, which is the key here.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from packed_rows import packed_rows
from pyspark.sql.streaming import TwsTester

from kappaflow.counting.arrow_ipc import PackedProcessor
from kappaflow.counting.rows import DEAD_WINDOW
from kappaflow.counting.windows import WindowCounter, WindowState, decode_counts

SIZE = 60_000
START = 600_000
END = START + SIZE
#: An event time no watermark of these tests reaches (see the module's docstring).
NEVER_LATE = 2**62


def window_counter(lateness_ms: int, dedup: bool = False) -> TwsTester:
    return TwsTester(
        PackedProcessor(WindowCounter(SIZE, lateness_ms=lateness_ms, dedup=dedup)),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )


def folded(
    rows: list[tuple[str, int]], partition: int = 0, ids: list[list[int]] | None = None
) -> pd.DataFrame:
    """Folded input: (key, events) per row, with their id hashes, as preagg.py would hand
    it over."""
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
            "ids": [np.array(i, dtype="int64") for i in ids] if ids else [None] * n,
            "reason": [None] * n,
            "value": [None] * n,
        }
    )


def rows_of(packed: object) -> list[dict[str, Any]]:
    return sorted(packed_rows(packed), key=lambda r: (r["kind"], r["key"] or ""))


def feed(counter: TwsTester, frame: pd.DataFrame, key: int = START) -> list[dict[str, Any]]:
    return rows_of(counter.testInPandas(key, frame))


def advance(counter: TwsTester, watermark: int) -> list[dict[str, Any]]:
    """Set the watermark, firing the timers it passes."""
    return rows_of(counter.setWatermark(watermark))


def changes(rows: list[dict[str, Any]]) -> list[tuple[str, str, int, int, int]]:
    return [
        (r["kind"], r["key"], r["count"], r["previous"], r["version"])
        for r in rows
        if r["kind"] in ("provisional", "correction", "final")
    ]


def stored(counter: TwsTester) -> WindowState | None:
    value = counter.peekValueState("window", START)
    return WindowState(*value) if value is not None else None


def test_counts_grow_then_become_final_then_take_corrections_then_close() -> None:
    counter = window_counter(lateness_ms=30_000)

    # The same key from two source partitions sums into one change.
    out = feed(counter, pd.concat([folded([("a", 2), ("b", 1)]), folded([("a", 3)], 1)]))
    assert changes(out) == [("provisional", "a", 5, 0, 1), ("provisional", "b", 1, 0, 1)]
    stats = next(r for r in out if r["kind"] == "stats")
    assert (stats["counted"], stats["count"]) == (6, 2)  # events counted, keys new
    counter.handle.setGroupingKey(START)
    assert list(counter.handle.listTimers()) == [END, END + 30_000]

    out = feed(counter, folded([("a", 1), ("c", 4)]))
    assert changes(out) == [("provisional", "a", 6, 5, 2), ("provisional", "c", 4, 0, 1)]
    assert next(r for r in out if r["kind"] == "stats")["count"] == 1

    # The watermark passes the end: every key's count, final, one version on.
    assert changes(advance(counter, END)) == [
        ("final", "a", 6, 6, 3),
        ("final", "b", 1, 1, 2),
        ("final", "c", 4, 4, 2),
    ]

    # Behind the watermark, within the allowed lateness: a correction.
    assert advance(counter, END + 5_000) == []
    assert changes(feed(counter, folded([("b", 2)]))) == [("correction", "b", 3, 1, 3)]
    state = stored(counter)
    assert state is not None and state.final is True
    assert decode_counts(state.counts).to_dict("index") == {
        "a": {"count": 6, "version": 3},
        "b": {"count": 3, "version": 3},
        "c": {"count": 4, "version": 2},
    }

    # The allowed lateness runs out: the window is forgotten, with how many keys it held.
    out = advance(counter, END + 30_000)
    assert [(r["kind"], r["count"]) for r in out] == [("closed", 3)]
    assert stored(counter) is None

    # Later still: too late, reported with its count and offsets, never counted.
    advance(counter, END + 31_000)
    out = feed(counter, folded([("a", 7)]))
    assert [(r["kind"], r["key"], r["count"]) for r in out] == [("late", "a", 7)]
    assert (out[0]["window_start"], out[0]["window_end"]) == (START, END)
    assert "too late" in out[0]["reason"]
    assert stored(counter) is None


def test_an_id_counts_once_per_window() -> None:
    counter = window_counter(lateness_ms=0, dedup=True)
    out = feed(counter, folded([("a", 3), ("b", 1)], ids=[[11, 12, 11], [13]]))
    assert changes(out) == [("provisional", "a", 2, 0, 1), ("provisional", "b", 1, 0, 1)]
    stats = next(r for r in out if r["kind"] == "stats")
    assert (stats["counted"], stats["duplicates"]) == (3, 1)

    # A later batch: id 12 was counted already, id 14 is new.
    out = feed(counter, folded([("a", 2)], ids=[[12, 14]]))
    assert changes(out) == [("provisional", "a", 3, 2, 2)]
    assert next(r for r in out if r["kind"] == "stats")["duplicates"] == 1


def test_records_that_cannot_be_counted_pass_as_dead_letters() -> None:
    counter = window_counter(lateness_ms=0)
    dead = folded([("", 1), ("", 1)])
    dead["key"] = [None, None]
    dead["reason"] = ["not valid JSON", "empty record"]
    dead["value"] = [b"{oops", None]
    dead["first_offset"] = [41, 42]
    out = feed(counter, dead, key=DEAD_WINDOW)
    assert [
        (r["kind"], r["reason"], r["value"], r["src_offset"], r["src_offset_end"]) for r in out
    ] == [
        ("dlq", "not valid JSON", b"{oops", 41, 41),
        ("dlq", "empty record", None, 42, 42),
    ]
    assert counter.peekValueState("window", DEAD_WINDOW) is None
