"""The web sessions job under the test harness: visits grow, are bridged by a late view,
become final, are corrected, and a view too late for any is reported."""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

import kappaflow as kf
from web_sessions import build


def view(view_id: str, visitor: str, path: str, seconds: int, at: str) -> dict[str, Any]:
    return {"view_id": view_id, "visitor": visitor, "path": path, "seconds": seconds, "at": at}


def at(hh_mm: str) -> str:
    return f"2026-11-23T{hh_mm}:00Z"


def test_visits_grow_merge_finish_and_correct(spark: SparkSession) -> None:
    batches: list[list[Any]] = [
        [
            view("v1", "ada", "/", 10, at("10:00")),
            view("v2", "ada", "/pricing", 20, at("10:10")),
            view("v3", "bob", "/", 5, at("10:05")),
        ],
        # 10:50 is more than 30 minutes after 10:10: a second visit; v2 again is dropped.
        [
            view("v4", "ada", "/docs", 30, at("10:50")),
            view("v2", "ada", "/pricing", 20, at("10:10")),
            # No visitor: a dead letter, not a view.
            {"view_id": "v9", "path": "/", "seconds": 3, "at": at("10:51")},
        ],
        # 10:30 is within 30 minutes of both visits: it bridges them into one.
        [view("v5", "ada", "/pricing", 40, at("10:30"))],
        # 14:00 moves the watermark to 13:59: every visit so far ends behind it.
        [view("v6", "cy", "/", 1, at("14:00"))],
        # Within the hour allowed: a visit of bob's, behind the watermark (a correction) ...
        [view("v7", "bob", "/docs", 7, at("13:10"))],
        # ... and a view from 11:00 touches no visit still held and is too late.
        [view("v8", "ada", "/", 9, at("11:00"))],
    ]
    out = kf.testing.run(build, {"views": batches}, spark=spark, name="web")

    ada = [c for c in out.changes("visits") if c["visitor"] == "ada"]
    assert [(c["window_start"], c["kind"]) for c in ada] == [
        ("2026-11-23T10:00:00.000Z", "provisional"),
        ("2026-11-23T10:50:00.000Z", "provisional"),
        # The watermark (10:49) has passed the first visit's end (10:40) ...
        ("2026-11-23T10:00:00.000Z", "final"),
        # ... so the bridged visit corrects a final result.
        ("2026-11-23T10:00:00.000Z", "correction"),
        ("2026-11-23T10:50:00.000Z", "correction"),
        ("2026-11-23T10:00:00.000Z", "final"),
    ]
    first, second, _, bridged, retracted, final = ada
    assert first["values"] == {"views": 2, "pages": 2, "seconds": 30}
    assert second["values"] == {"views": 1, "pages": 1, "seconds": 30}
    assert bridged["previous"] == first["values"]
    assert bridged["values"] == {"views": 4, "pages": 3, "seconds": 100}
    assert bridged["window_end"] == "2026-11-23T11:20:00.000Z"
    assert retracted["values"] is None and retracted["previous"] == second["values"]
    assert final["values"] == bridged["values"]

    current = out.current("visits")
    assert set(current) == {
        ("ada", "2026-11-23T10:00:00.000Z"),
        ("bob", "2026-11-23T10:05:00.000Z"),
        ("bob", "2026-11-23T13:10:00.000Z"),
        ("cy", "2026-11-23T14:00:00.000Z"),
    }
    assert current[("ada", "2026-11-23T10:00:00.000Z")]["final"] is True
    assert current[("bob", "2026-11-23T13:10:00.000Z")]["values"]["views"] == 1

    [late] = out.late
    assert late["key"] == {"visitor": "ada"}
    assert '"v8"' in late["event"]
    stats = out.stats("visits")
    assert (stats["events"], stats["duplicates"], stats["late"]) == (7, 1, 1)
    [dead] = out.dead_letters
    assert "visitor" in dead["error"] and b'"v9"' in dead["value"]
    assert (dead["source_partition"], dead["source_offset"]) == (0, 5)
    assert stats["dead_letters"] == 1
