"""`make demo`'s command, run for real: the clickstream, the counting job, the live table."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXTERNAL_KAFKA, make_settings, run_kappaflow

from kappaflow import services
from kappaflow.counting.store import CountStore, WindowCount
from kappaflow.demos.clicks import live_columns
from kappaflow.jobs.manager import JobManager
from kappaflow.serving.client import redis_client
from kappaflow.serving.redis_server import EmbeddedRedis
from kappaflow.settings import Settings

# Starts services of its own.
pytestmark = [
    pytest.mark.long,
    pytest.mark.integration,
    pytest.mark.skipif(bool(EXTERNAL_KAFKA), reason="starts an embedded broker"),
]

#: A row of the live table with a final window: a page, then a count marked final.
FINAL_CELL = re.compile(r"^\W*/\S*.*\s\d+ ✓", re.MULTILINE)


@pytest.fixture
def own(tmp_path: Path) -> Iterator[Settings]:
    settings = make_settings(tmp_path / "state")
    yield settings
    services.down(settings)


def test_demo_counts_page_views_and_stops_what_it_started(own: Settings) -> None:
    # Redis runs before the demo, the broker does not: the demo starts the broker and
    # stops it at the end, and leaves Redis running.
    assert EmbeddedRedis(own).start() is True
    result = run_kappaflow(own, "demo", "--seconds", "30", "--rate", "300", timeout=400)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    out = result.out
    assert "kafka started" in out and "redis started" not in out
    assert "starting counting job demo-views" in out
    assert "views per page per minute" in out
    assert FINAL_CELL.search(out), "no window of the live table became final"
    assert "job demo-views stopped" in out and "kafka stopped" in out
    assert JobManager(own).get_state("demo-views") == "stopped"
    assert {row.service: row.state for row in services.status(own)} == {
        "kafka": "stopped",
        "redis": "running",
        "mqtt": "stopped",
        "api": "stopped",
    }

    store = CountStore(redis_client(own), "demo-views")
    stats = store.stats()
    # The generated stream has duplicates, too-late events and malformed records.
    assert stats.counted > 0 and stats.duplicates > 0 and stats.dead_letters > 0
    assert stats.late > 0
    final = [w for w in store.windows() if w.final]
    assert final and all(w.count > 0 for w in final)
    # count status needs the broker for the lag: start it again for that.
    assert services.up(own)
    status = json.loads(run_kappaflow(own, "count", "status", "demo-views").out)
    # Measured from the source offsets the job consumed, against what it accounted for.
    assert status["events_read"] > 0
    assert status["events_read"] == status["accounted"]


def _windows(*spec: tuple[int, bool]) -> list[WindowCount]:
    return [WindowCount("/", s, s + 1, 1, 1, final) for s, final in spec]


def test_the_live_table_shows_the_newest_final_window() -> None:
    # The job caught up, but its watermark has closed only the third-newest window.
    closed = _windows((1, True), (2, True), (3, False), (4, False), (5, False))
    assert live_columns(closed) == [2, 3, 4]
    # Closed far enough: the newest three.
    assert live_columns(_windows((1, True), (2, True), (3, True), (4, False))) == [2, 3, 4]
    # Nothing final yet: the newest three.
    assert live_columns(_windows((1, False), (2, False), (3, False), (4, False))) == [2, 3, 4]
    assert live_columns(_windows((1, True))) == [1]
