"""Session windows through their life: merged, final, corrected, forgotten, then too late.

One job shows the whole life of a session, step by step, against the real broker, Redis
and Spark; each step waits for what it needs from the one before (the watermark Spark
gives a batch comes from the batches before it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
import redis
from conftest import RunCli
from live_jobs import topic_values

from kappaflow.counting.store import CountStore, WindowCount
from kappaflow.settings import Settings
from kappaflow.timeutil import from_epoch_ms, iso
from kappaflow.waiting import wait_for
from test_counting import (
    BASE,
    changelog,
    job_name,  # noqa: F401 (a fixture, the job's name: see its use)
    send,
    stats,
    wait_stats,
)

pytestmark = pytest.mark.long

SESSIONS = ("--session-gap", "3s", "--watermark", "1s", "--allowed-lateness", "10s")


def view(page: str, at: int, n: int) -> dict[str, Any]:
    """A view of ``page`` at BASE + ``at`` ms, with the id v<n>."""
    return {"page": page, "ts": BASE + at, "id": f"v{n}"}


def sessions(settings: Settings, job: str, page: str) -> dict[int, WindowCount]:
    """``page``'s sessions in Redis by start (ms after BASE)."""
    store = CountStore(redis.Redis.from_url(settings.redis.effective_url), job)
    return {w.window_start - BASE: w for w in store.windows(page)}


def at(ms: int) -> str:
    """BASE + ``ms`` as the changelog writes a window start."""
    return iso(from_epoch_ms(BASE + ms))


def histories(settings: Settings, job: str) -> dict[tuple[str, str], list[tuple[str, int, int]]]:
    """Per (key, window start), the changelog's (kind, count, previous) in order."""
    by_window: dict[tuple[str, str], list[tuple[str, int, int]]] = defaultdict(list)
    for change in changelog(settings, job):
        by_window[(change["key"], change["window_start"])].append(
            (change["kind"], change["count"], change["previous"])
        )
    return dict(by_window)


def test_a_session_is_merged_final_corrected_forgotten_and_then_too_late(
    cli: RunCli,
    serving: Settings,
    new_topic: Callable[..., str],
    job_name: str,  # noqa: F811 (pytest passes the fixture imported above)
) -> None:
    source, job = new_topic(), job_name

    def wait_session(page: str, start: int, what: str, **wanted: Any) -> WindowCount:
        def reached() -> WindowCount | None:
            window = sessions(serving, job, page).get(start)
            if window is None or any(getattr(window, k) != v for k, v in wanted.items()):
                return None
            return window

        return wait_for(reached, timeout=120, interval=0.5, what=what)

    # /a: a session [0, 4 s) of two views and one [6 s, 9 s) of one.
    send(serving, source, [view("/a", 0, 0), view("/a", 1000, 1), view("/a", 6000, 2)])
    result = cli(
        "count", "start", job, "--source", source, "--key", "page", "--time", "ts",
        "--id", "id", *SESSIONS,
    )  # fmt: skip
    assert result.code == 0, result.err
    wait_stats(serving, job, counted=3)

    # Final once the watermark (6 s - 1 s = 5 s) passes a session's end: the first
    # session's (4 s), not yet the second's (9 s).
    wait_session("/a", 0, "the session [0, 4 s) to be final", final=True)
    held = sessions(serving, job, "/a")
    assert {s: (w.window_end - BASE, w.count, w.final) for s, w in held.items()} == {
        0: (4000, 2, True),
        6000: (9000, 1, False),
    }
    assert stats(serving, job).open_windows == 2

    # A view at 3.5 s ([3.5 s, 6.5 s)) bridges them: one session [0, 9 s) of four, a
    # correction of the final one; the session merged away gets a correction to 0
    # under its old start, which removes it from Redis.
    send(serving, source, [view("/a", 3500, 3)])
    assert wait_stats(serving, job, counted=4).open_windows == 1
    merged = wait_session("/a", 0, "the sessions to merge", count=4)
    assert (merged.window_end - BASE, merged.final) == (9000, False)
    assert set(sessions(serving, job, "/a")) == {0}

    # The store is written before the batch's transaction commits: the changelog holds
    # the merge's changes once that commit is in.
    def merge_published() -> dict[tuple[str, str], list[tuple[str, int, int]]] | None:
        found = histories(serving, job)
        shown = [len(found.get(("/a", at(start)), [])) for start in (6000, 0)]
        return found if shown[0] >= 2 and shown[1] >= 3 else None

    history = wait_for(merge_published, timeout=60, interval=0.5, what="the merge's changes")
    assert history[("/a", at(6000))] == [("provisional", 1, 0), ("correction", 0, 1)]
    assert history[("/a", at(0))] == [("provisional", 2, 0), ("final", 2, 2), ("correction", 4, 2)]

    # /c at 15 s moves the watermark to 14 s: the merged session is final ...
    send(serving, source, [view("/c", 15_000, 4)])
    wait_session("/a", 0, "the merged session to be final", final=True)
    # ... and, final, still takes a correction: 8 s is behind the watermark but within
    # the allowed lateness, and touches the session.
    send(serving, source, [view("/a", 8000, 5)])
    wait_stats(serving, job, counted=6)
    wait_session("/a", 0, "the correction of the final session", count=5)
    # Again the changelog a moment after the store.
    history = wait_for(
        lambda: (
            found if len((found := histories(serving, job)).get(("/a", at(0)), [])) >= 5 else None
        ),
        timeout=60,
        interval=0.5,
        what="the correction's changes",
    )
    assert history[("/a", at(0))][3:] == [("final", 4, 4), ("correction", 5, 4)]
    assert stats(serving, job).open_windows == 2  # /a and /c

    # /d at 25 s moves the watermark to 24 s, past the merged session's end (9 s) plus the
    # allowed lateness (10 s): the session is forgotten (it stays in Redis, final).
    send(serving, source, [view("/d", 25_000, 6)])
    wait_for(
        lambda: (lambda s: s if (s.counted, s.open_windows) == (7, 2) else None)(
            stats(serving, job)
        ),
        timeout=120,
        interval=0.5,
        what="the merged session to be forgotten (/c and /d held)",
    )
    assert sessions(serving, job, "/a")[0].count == 5

    # Now a new view at 8.5 s and a repeat of v1 (1 s) are more than the allowed lateness
    # behind the watermark and touch no session still held: too late, not counted, and
    # the repeat is not a duplicate either (its session, and its id, are forgotten).
    send(serving, source, [view("/a", 8500, 7), view("/a", 1000, 1)])
    final = wait_stats(serving, job, accounted=9)
    assert (final.counted, final.duplicates, final.late, final.dead_letters) == (7, 0, 2, 0)
    late = topic_values(serving, f"{job}.late", at_least=2)
    assert sorted(json.loads(e["event"])["id"] for e in late) == ["v1", "v7"]
    assert all(e["reason"].startswith("too late") for e in late)
    assert {s: w.count for s, w in sessions(serving, job, "/a").items()} == {0: 5}

    status = json.loads(cli("count", "status", job).out)
    assert (status["events_read"], status["accounted"], status["open_windows"]) == (9, 9, 2)
    from_state = {
        (r["key"], r["window_start"], r["count"])
        for r in map(json.loads, cli("counts", job, "--from-state").lines())
    }
    assert from_state == {
        ("/c", at(15_000), 1),
        ("/d", at(25_000), 1),
    }

    # A long session keeps its ids as long as it is held: /e's views from 16 s to 32 s
    # make one session [16 s, 35 s) and move the watermark to 31 s, and a view at 33 s
    # keeps the session growing; a repeat of its first view, now more than the allowed
    # lateness behind the watermark but inside a session that can still change, is a
    # duplicate.
    chain = [view("/e", at, 10 + n) for n, at in enumerate(range(16_000, 34_000, 2000))]
    send(serving, source, chain)
    wait_stats(serving, job, accounted=18)
    send(serving, source, [view("/e", 33_000, 20)])
    wait_stats(serving, job, accounted=19)
    send(serving, source, [chain[0]])
    final = wait_stats(serving, job, accounted=20)
    assert (final.counted, final.duplicates, final.late) == (17, 1, 2)
    assert {s: w.count for s, w in sessions(serving, job, "/e").items()} == {16_000: 10}
