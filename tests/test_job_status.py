"""The figures ``jobs status`` takes from a query's progress report."""

from __future__ import annotations

from kappaflow.jobs.status import query_progress


def _source(behind: str | None) -> dict[str, object]:
    return {"metrics": {} if behind is None else {"maxOffsetsBehindLatest": behind}}


def test_the_lag_is_the_furthest_behind_partition_of_every_source() -> None:
    # A join reads two topics: the second is the one behind.
    progress = {"sources": [_source("3"), _source("41")], "stateOperators": []}
    assert query_progress(progress)["lag_records"] == 41
    assert query_progress({"sources": [_source("7"), _source(None)]})["lag_records"] == 7


def test_no_lag_is_reported_before_the_source_reports_one() -> None:
    assert query_progress({"sources": [_source(None)]})["lag_records"] is None
    assert query_progress({"sources": []})["lag_records"] is None
    assert query_progress(None) == {}


def test_state_figures_sum_over_the_stateful_operators() -> None:
    progress = {
        "stateOperators": [
            {"numRowsTotal": 5, "memoryUsedBytes": 100},
            {"numRowsTotal": 2, "memoryUsedBytes": 50},
        ],
        "durationMs": {"triggerExecution": 120},
        "eventTime": {"watermark": "2026-01-01T00:00:00.000Z"},
    }
    figures = query_progress(progress)
    assert (figures["state_rows"], figures["state_memory_bytes"]) == (7, 150)
    assert figures["batch_duration_ms"] == 120
    assert figures["event_time_watermark"] == "2026-01-01T00:00:00.000Z"
