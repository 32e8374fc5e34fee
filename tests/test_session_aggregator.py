"""The session aggregator under PySpark's TwsTester, counting as ``kappaflow count``
does: growth, new sessions, bridging, retractions, then final, forgotten and too late.

The processor is built as session_windows.aggregate_sessions builds it for one
``count`` aggregate (no input column), wrapped in its PackedProcessor, and fed the
columns that function selects; the tester's grouping key is the shard. Every event
reports an event time no watermark reaches, because the job lets Spark drop no row
before the operator (the processor itself counts late events as corrections or reports
them as too late). One more difference from Spark bounds what these tests can show:
TwsTester refuses to register a timer at or behind the watermark, which Spark accepts
and fires at the end of the same batch. The aggregator does that when an event within
the allowed lateness starts a session that already ended behind the watermark, so that
case is left to the end-to-end tests (test_session_windows.py).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from packed_rows import dead_letters, packed_rows, packed_tester
from pyspark.sql.streaming import TwsTester

import kappaflow.streams.aggregates as kf
from kappaflow.streams.kinds import SESSIONS_WINDOW
from kappaflow.streams.ops.arrow_ipc import table_from_ipc
from kappaflow.streams.ops.folding import partial_name
from kappaflow.streams.ops.session_windows import DEAD_SHARD, SessionAggregator, SessionState
from kappaflow.streams.ops.windowing import OUTPUT_ARROW_SCHEMA

GAP = 10
LATENESS = 20
#: The shard of every countable event here: one state value holds all their sessions.
SHARD = 0
COUNT = kf.count().bind(None)
#: The state's column of each session's count (the count aggregate's one partial).
COUNTED = partial_name(0, COUNT.partials()[0])

#: (kind, key, start, end, values, previous, version), values JSON decoded.
Change = tuple[str, str, int, int, Any, Any, int]


def session_aggregator() -> TwsTester:
    processor = SessionAggregator(["count"], [COUNT], [], GAP, LATENESS, dedup=False)
    return packed_tester(processor)


def key(name: str) -> str:
    """A key as the job hands it over: the JSON array of the key field's value."""
    return json.dumps([name])


def events(pairs: list[tuple[str, int]]) -> pd.DataFrame:
    """(key, time) events, with the columns aggregate_sessions selects for ``count``."""
    n = len(pairs)
    return pd.DataFrame(
        {
            "shard": np.full(n, SHARD, dtype="int32"),
            "key": [key(k) for k, _ in pairs],
            "ts": np.array([t for _, t in pairs], dtype="int64"),
            "has_id": np.zeros(n, dtype=bool),
            "id_hash": np.zeros(n, dtype="int64"),
            "src_partition": np.zeros(n, dtype="int32"),
            "src_offset": np.arange(n, dtype="int64"),
            "reason": pd.Series([None] * n, dtype=object),
            "value": pd.Series([None] * n, dtype=object),
        }
    )


def rows_of(packed: object) -> list[dict[str, Any]]:
    return packed_rows(packed, OUTPUT_ARROW_SCHEMA)


def feed(t: TwsTester, pairs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return rows_of(t.testInPandas(SHARD, events(pairs)))


def decoded(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def changes(rows: list[dict[str, Any]]) -> list[Change]:
    """(kind, key, start, end, values, previous, version) of each change, sorted."""
    found = [
        (
            r["kind"],
            r["key"],
            r["window_start"],
            r["window_end"],
            decoded(r["values"]),
            decoded(r["previous"]),
            r["version"],
        )
        for r in rows
        if r["kind"] in ("provisional", "correction", "final")
    ]
    return sorted(found, key=lambda c: (c[0], c[1], c[2]))


def stats(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """The call's ``stats`` row: (events counted, change in the sessions held)."""
    (row,) = (r for r in rows if r["kind"] == "stats")
    assert row["window_start"] == SESSIONS_WINDOW
    return row["events"], row["held"]


def held(t: TwsTester) -> list[list[Any]]:
    """The sessions held: [key, start, end, count, version, final], in order."""
    value = t.peekValueState("sessions", SHARD)
    if value is None:
        return []
    sessions = table_from_ipc(SessionState(*value).sessions)
    ordered = sessions.sort_by([("key", "ascending"), ("start", "ascending")])
    columns = ["key", "start", "end", COUNTED, "version", "final"]
    return [list(row.values()) for row in ordered.select(columns).to_pylist()]


A, B = key("a"), key("b")


def test_events_form_sessions_per_key() -> None:
    t = session_aggregator()
    out = feed(t, [("a", 0), ("a", 5), ("b", 3), ("a", 30)])
    assert changes(out) == [
        ("provisional", A, 0, 15, {"count": 2}, None, 1),
        ("provisional", A, 30, 40, {"count": 1}, None, 1),
        ("provisional", B, 3, 13, {"count": 1}, None, 1),
    ]
    assert stats(out) == (4, 3)
    assert held(t) == [
        [A, 0, 15, 2, 1, False],
        [A, 30, 40, 1, 1, False],
        [B, 3, 13, 1, 1, False],
    ]


def test_a_bridging_event_merges_sessions_and_retracts_the_later_one() -> None:
    t = session_aggregator()
    feed(t, [("a", 0), ("a", 15)])
    assert len(held(t)) == 2
    t.setWatermark(5)
    out = feed(t, [("a", 8)])
    assert changes(out) == [
        # Merged away: a correction under its old start whose values are null.
        ("correction", A, 15, 25, None, {"count": 1}, 2),
        ("provisional", A, 0, 25, {"count": 3}, {"count": 1}, 2),
    ]
    retraction = next(r for r in out if r["kind"] == "correction")
    assert retraction["values"] is None
    assert stats(out) == (1, -1)
    assert held(t) == [[A, 0, 25, 3, 2, False]]


def test_an_earlier_event_moves_the_start() -> None:
    t = session_aggregator()
    feed(t, [("a", 20)])
    out = feed(t, [("a", 15)])
    # The old start is retracted; the new start had nothing before (previous null).
    assert changes(out) == [
        ("correction", A, 20, 30, None, {"count": 1}, 2),
        ("provisional", A, 15, 30, {"count": 2}, None, 2),
    ]
    assert stats(out) == (1, 0)
    assert held(t) == [[A, 15, 30, 2, 2, False]]


def test_untouched_sessions_stay_and_emit_nothing() -> None:
    t = session_aggregator()
    feed(t, [("a", 0), ("b", 0)])
    t.setWatermark(5)
    out = feed(t, [("b", 100)])
    assert changes(out) == [("provisional", B, 100, 110, {"count": 1}, None, 1)]
    assert stats(out) == (1, 1)
    assert held(t) == [
        [A, 0, 10, 1, 1, False],
        [B, 0, 10, 1, 1, False],
        [B, 100, 110, 1, 1, False],
    ]


def test_a_session_becomes_final_is_forgotten_then_its_events_are_too_late() -> None:
    t = session_aggregator()
    feed(t, [("a", 0)])

    # The watermark passes the session's end: its values, final, one version on.
    out = rows_of(t.setWatermark(GAP))
    assert changes(out) == [("final", A, 0, 10, {"count": 1}, {"count": 1}, 2)]
    assert len(out) == 1
    assert held(t) == [[A, 0, 10, 1, 2, True]]

    # The allowed lateness runs out: the session is forgotten, one session held fewer.
    out = rows_of(t.setWatermark(GAP + LATENESS))
    assert [(r["kind"], r["window_start"], r["held"]) for r in out] == [
        ("closed", SESSIONS_WINDOW, -1)
    ]
    assert held(t) == []

    # More than the allowed lateness behind the watermark, touching nothing held.
    t.setWatermark(100)
    out = feed(t, [("a", 50)])
    late = [r for r in out if r["kind"] == "late"]
    assert [
        (r["key"], r["window_start"], r["window_end"], r["events"], r["src_offset"]) for r in late
    ] == [(A, 50, 60, 1, 0)]
    assert late[0]["reason"].startswith("too late")
    assert changes(out) == []
    assert stats(out) == (0, 0) and held(t) == []


def test_records_that_cannot_be_counted_pass_as_dead_letters() -> None:
    t = session_aggregator()
    dead = events([("", 0)])
    dead["shard"] = [DEAD_SHARD]
    dead["key"] = [None]
    dead["reason"] = ["key field 'page' missing"]
    dead["value"] = [b'{"ts": 1}']
    dead["src_partition"] = [2]
    dead["src_offset"] = [7]
    out = rows_of(t.testInPandas(DEAD_SHARD, dead))
    assert dead_letters(out) == [("dlq", "key field 'page' missing", b'{"ts": 1}', 2, 7, 7)]
    assert t.peekValueState("sessions", DEAD_SHARD) is None
