"""The session counter under PySpark's TwsTester: growth, new sessions, bridging,
retractions, then final, forgotten and too late.

As in test_window_counter.py, every event reports an event time no watermark reaches,
because the pipeline lets Spark drop no row before the operator, and the tester's key
is the group's window start (0 for sessions). One more difference from Spark bounds
what these tests can show: TwsTester refuses to register a timer at or behind the
watermark, which Spark accepts and fires at the end of the same batch. The session
counter does that when an event within the allowed lateness starts or grows a session
that already ended behind the watermark, so that case is left to test_counting.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from packed_rows import packed_rows
from pyspark.sql.streaming import TwsTester

from kappaflow.counting.arrow_ipc import PackedProcessor
from kappaflow.counting.rows import DEAD_WINDOW, SESSIONS_WINDOW
from kappaflow.counting.sessions import SessionCounter, SessionState, decode_sessions

GAP = 10
LATENESS = 20
#: The group of every countable event: sessions are keyed by shard only.
GROUP = 0
NEVER_LATE = 2**62

Change = tuple[str, str, int, int, int, int]


def session_counter() -> TwsTester:
    return TwsTester(
        PackedProcessor(SessionCounter(GAP, lateness_ms=LATENESS, dedup=False)),
        timeMode="EventTime",
        eventTimeExtractor=lambda _row: NEVER_LATE,
    )


def events(pairs: list[tuple[str, int]]) -> pd.DataFrame:
    """(key, time) events, as the pipeline hands them to the operator."""
    n = len(pairs)
    return pd.DataFrame(
        {
            "window_start": np.full(n, GROUP, dtype="int64"),
            "shard": np.zeros(n, dtype="int32"),
            "key": [k for k, _ in pairs],
            "ts": np.array([t for _, t in pairs], dtype="int64"),
            "has_id": np.zeros(n, dtype=bool),
            "id_hash": np.zeros(n, dtype="int64"),
            "src_partition": np.zeros(n, dtype="int32"),
            "src_offset": np.arange(n, dtype="int64"),
            "reason": [None] * n,
            "value": [None] * n,
        }
    )


def rows_of(packed: object) -> list[dict[str, Any]]:
    return packed_rows(packed)


def feed(counter: TwsTester, pairs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return rows_of(counter.testInPandas(GROUP, events(pairs)))


def changes(rows: list[dict[str, Any]]) -> list[Change]:
    """(kind, key, start, end, count, previous) of each change, in order."""
    return sorted(
        (r["kind"], r["key"], r["window_start"], r["window_end"], r["count"], r["previous"])
        for r in rows
        if r["kind"] in ("provisional", "correction", "final")
    )


def held_change(rows: list[dict[str, Any]]) -> int:
    """How many more sessions the state holds after the call (its ``stats`` row)."""
    (stats,) = (r for r in rows if r["kind"] == "stats")
    assert stats["window_start"] == SESSIONS_WINDOW
    return int(stats["count"])


def held(counter: TwsTester) -> list[list[Any]]:
    """The sessions held: [key, start, end, count, version, final], in order."""
    value = counter.peekValueState("sessions", GROUP)
    if value is None:
        return []
    sessions = decode_sessions(SessionState(*value).sessions)
    ordered = sessions.sort_values(["key", "start"], ignore_index=True)
    columns = ["key", "start", "end", "count", "version", "final"]
    return [list(row) for row in ordered[columns].itertuples(index=False)]


def test_events_form_sessions_per_key() -> None:
    counter = session_counter()
    out = feed(counter, [("a", 0), ("a", 5), ("b", 3), ("a", 30)])
    assert changes(out) == [
        ("provisional", "a", 0, 15, 2, 0),
        ("provisional", "a", 30, 40, 1, 0),
        ("provisional", "b", 3, 13, 1, 0),
    ]
    assert held_change(out) == 3
    assert held(counter) == [
        ["a", 0, 15, 2, 1, False],
        ["a", 30, 40, 1, 1, False],
        ["b", 3, 13, 1, 1, False],
    ]


def test_a_bridging_event_merges_sessions_and_retracts_the_later_one() -> None:
    counter = session_counter()
    feed(counter, [("a", 0), ("a", 15)])
    assert len(held(counter)) == 2
    counter.setWatermark(5)
    out = feed(counter, [("a", 8)])
    assert changes(out) == [
        ("correction", "a", 15, 25, 0, 1),  # merged away: retracted to 0
        ("provisional", "a", 0, 25, 3, 1),
    ]
    assert held_change(out) == -1
    assert held(counter) == [["a", 0, 25, 3, 2, False]]


def test_an_earlier_event_moves_the_start() -> None:
    counter = session_counter()
    feed(counter, [("a", 20)])
    out = feed(counter, [("a", 15)])
    assert changes(out) == [
        ("correction", "a", 20, 30, 0, 1),
        ("provisional", "a", 15, 30, 2, 0),
    ]
    assert [s[1:4] for s in held(counter)] == [[15, 30, 2]]


def test_untouched_sessions_stay_and_emit_nothing() -> None:
    counter = session_counter()
    feed(counter, [("a", 0), ("b", 0)])
    counter.setWatermark(5)
    out = feed(counter, [("b", 100)])
    assert changes(out) == [("provisional", "b", 100, 110, 1, 0)]
    assert held_change(out) == 1
    assert len(held(counter)) == 3


def test_a_session_becomes_final_is_forgotten_then_its_events_are_too_late() -> None:
    counter = session_counter()
    feed(counter, [("a", 0)])

    # The watermark passes the session's end: its count, final, one version on.
    out = rows_of(counter.setWatermark(GAP))
    assert [(r["kind"], r["count"], r["previous"], r["version"]) for r in out] == [
        ("final", 1, 1, 2)
    ]
    assert held(counter) == [["a", 0, 10, 1, 2, True]]

    # The allowed lateness runs out: the session is forgotten, counted as one closed.
    out = rows_of(counter.setWatermark(GAP + LATENESS))
    assert [(r["kind"], r["window_start"], r["count"]) for r in out] == [
        ("closed", SESSIONS_WINDOW, 1)
    ]
    assert held(counter) == []

    # More than the allowed lateness behind the watermark, touching nothing held.
    counter.setWatermark(100)
    out = feed(counter, [("a", 50)])
    late = [r for r in out if r["kind"] == "late"]
    assert [(r["key"], r["window_start"], r["window_end"], r["count"]) for r in late] == [
        ("a", 50, 60, 1)
    ]
    assert "too late" in late[0]["reason"]
    assert held_change(out) == 0 and held(counter) == []


def test_records_that_cannot_be_counted_pass_as_dead_letters() -> None:
    counter = session_counter()
    dead = events([("", 0)])
    dead["key"] = [None]
    dead["reason"] = ["key field 'page' missing"]
    dead["value"] = [b'{"ts": 1}']
    dead["src_offset"] = [7]
    out = rows_of(counter.testInPandas(DEAD_WINDOW, dead))
    assert [(r["kind"], r["reason"], r["value"], r["src_offset"]) for r in out] == [
        ("dlq", "key field 'page' missing", b'{"ts": 1}', 7)
    ]
