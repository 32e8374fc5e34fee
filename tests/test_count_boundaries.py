"""How long a counting job remembers: dedup by id until its window is forgotten, and no
state to read before the job's first batch."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from conftest import RunCli, error_line, make_settings, run_kappaflow
from live_jobs import topic_values

from kappaflow.counting.spec import CountSpec
from kappaflow.counting.store import CountStore, WindowCount
from kappaflow.jobs.manager import JobManager, JobRecord
from kappaflow.settings import Settings
from kappaflow.waiting import wait_for
from test_counting import (
    BASE,
    job_name,  # noqa: F401 (a fixture, the job's name: see its use)
    send,
    start,
    stats,
    wait_stats,
)


def test_an_id_is_dropped_while_its_window_can_change_and_too_late_after(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
) -> None:
    """With test_counting's definition: 10 s windows, a 5 s watermark, 20 s lateness."""
    source, job = new_topic(), job_name

    def view(page: str, at: int, event_id: str) -> dict[str, Any]:
        return {"page": page, "ts": BASE + at, "id": event_id}

    def first_window() -> WindowCount:
        store = CountStore(redis.Redis.from_url(serving.redis.effective_url), job)
        return next(w for w in store.windows("/p") if w.window_start == BASE)

    def outcome(accounted: int) -> tuple[int, int, int]:
        done = wait_stats(serving, job, accounted=accounted)
        return done.counted, done.duplicates, done.late

    repeated = view("/p", 1000, "d0")  # in the window [0, 10 s)
    send(serving, source, [repeated, view("/q", 15_000, "d1")])
    start(cli, job, source)
    wait_stats(serving, job, counted=2)
    # The watermark (15 s - 5 s) has passed the window's end: it is final, and takes
    # corrections until the watermark is 20 s past its end.
    wait_for(
        lambda: True if first_window().final else None,
        timeout=120,
        what="the window [0, 10 s) to be final",
    )

    send(serving, source, [repeated])  # within the allowed lateness: a duplicate
    assert outcome(3) == (2, 1, 0)
    assert first_window().count == 1

    # 36 s moves the watermark to 31 s, past the window's end plus the lateness (30 s):
    # the window is forgotten, with the ids it had counted.
    send(serving, source, [view("/q", 36_000, "d2")])
    wait_for(
        lambda: (lambda s: s if (s.counted, s.open_windows) == (3, 2) else None)(
            stats(serving, job)
        ),
        timeout=120,
        interval=0.5,
        what="the window [0, 10 s) to be forgotten",
    )

    send(serving, source, [repeated])  # its window is gone: too late, not counted again
    assert outcome(5) == (3, 1, 1)
    assert (first_window().count, first_window().final) == (1, True)
    late = topic_values(serving, f"{job}.late", at_least=1)
    assert [json.loads(e["event"])["id"] for e in late] == ["d0"]
    assert late[0]["reason"].startswith("too late: window")


def test_counts_from_state_before_the_first_batch(tmp_path: Path) -> None:
    """A counting job whose query has committed nothing has no state to show: an error
    with its code, not an empty list."""
    settings = make_settings(tmp_path / "state")
    spec = CountSpec(source="views", key_field="page", time_field="ts", window_ms=60_000)
    home = JobManager(settings).job_dir("fresh")
    home.mkdir(parents=True)
    JobRecord(name="fresh", pipeline="count", params=spec.to_params()).save(home / "job.json")
    result = run_kappaflow(settings, "counts", "fresh", "--from-state", timeout=60)
    assert "has no committed state yet" in error_line(result, "KF612", 1)
    assert result.out == ""
