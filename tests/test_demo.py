"""`make demo`'s command, run for real: the clickstream, the counting job, the live table."""

import json
import re

from conftest import run_kappaflow
from kappaflow.counting.store import CountStore
from kappaflow.jobs.manager import JobManager
from kappaflow.services import status
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings

#: A row of the live table with a final window: a page, then a count marked final.
FINAL_CELL = re.compile(r"^\W*/\S*.*\s\d+ ✓", re.MULTILINE)


def test_demo_counts_page_views_and_stops_its_job(serving: Settings) -> None:
    result = run_kappaflow(serving, "demo", "--seconds", "30", "--rate", "300", timeout=300)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    out = result.out
    assert "starting counting job demo-views" in out
    assert "views per page per minute" in out
    assert FINAL_CELL.search(out), "no window of the live table became final"
    assert "job demo-views stopped" in out
    assert JobManager(serving).get_state("demo-views") == "stopped"
    # The broker and Redis ran before the demo: it leaves them running.
    assert {row.service: row.state for row in status(serving)} == {
        "kafka": "running",
        "redis": "running",
    }

    stats = CountStore(redis_client(serving), "demo-views").stats()
    # The generated stream has duplicates, too-late events and malformed records.
    assert stats.counted > 0 and stats.duplicates > 0 and stats.dead_letters > 0
    final = [w for w in CountStore(redis_client(serving), "demo-views").windows() if w.final]
    assert final and all(w.count > 0 for w in final)
    status_ = json.loads(run_kappaflow(serving, "count", "status", "demo-views").out)
    # Measured from the source offsets the job consumed, against what it accounted for.
    assert status_["events_read"] > 0
    assert status_["events_read"] == status_["accounted"]
