"""Session merging, without Spark: growth, new sessions, bridging, retractions."""

from __future__ import annotations

import numpy as np
import pandas as pd

from kappaflow.counting.sessions import _merge, decode_sessions

GAP = 10


def merge(
    sessions: pd.DataFrame, events: list[tuple[str, int]], watermark: int = 0
) -> tuple[pd.DataFrame, list[tuple[str, str, int, int, int, int]], int]:
    keys = pd.Series([k for k, _ in events], dtype=object)
    times = np.array([t for _, t in events], dtype="int64")
    now, changes, held = _merge(sessions, keys, times, GAP, watermark)
    rows = sorted(
        (
            str(r["kind"]),
            str(r["key"]),
            int(r["window_start"]),
            int(r["window_end"]),
            int(r["count"]),
            int(r["previous"]),
        )
        for r in changes.to_dict("records")
    )
    return now.sort_values(["key", "start"], ignore_index=True), rows, held


def test_events_form_sessions_per_key() -> None:
    now, changes, held = merge(decode_sessions(None), [("a", 0), ("a", 5), ("b", 3), ("a", 30)])
    assert now[["key", "start", "end", "count"]].values.tolist() == [
        ["a", 0, 15, 2],
        ["a", 30, 40, 1],
        ["b", 3, 13, 1],
    ]
    assert changes == [
        ("provisional", "a", 0, 15, 2, 0),
        ("provisional", "a", 30, 40, 1, 0),
        ("provisional", "b", 3, 13, 1, 0),
    ]
    assert held == 3


def test_a_bridging_event_merges_sessions_and_retracts_the_later_one() -> None:
    first, _, _ = merge(decode_sessions(None), [("a", 0), ("a", 15)])
    assert len(first) == 2
    now, changes, held = merge(first, [("a", 8)], watermark=5)
    assert now[["key", "start", "end", "count", "version"]].values.tolist() == [["a", 0, 25, 3, 2]]
    assert changes == [
        ("correction", "a", 15, 25, 0, 1),  # merged away: retracted to 0
        ("provisional", "a", 0, 25, 3, 1),
    ]
    assert held == -1


def test_an_earlier_event_moves_the_start() -> None:
    first, _, _ = merge(decode_sessions(None), [("a", 20)])
    now, changes, _ = merge(first, [("a", 15)])
    assert now[["start", "end", "count"]].values.tolist() == [[15, 30, 2]]
    assert changes == [
        ("correction", "a", 20, 30, 0, 1),
        ("provisional", "a", 15, 30, 2, 0),
    ]


def test_untouched_sessions_stay_and_emit_nothing() -> None:
    first, _, _ = merge(decode_sessions(None), [("a", 0), ("b", 0)])
    now, changes, held = merge(first, [("b", 100)], watermark=50)
    assert len(now) == 3 and held == 1
    assert changes == [("provisional", "b", 100, 110, 1, 0)]
