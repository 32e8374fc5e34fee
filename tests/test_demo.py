"""`make demo`'s command, run for real: the clickstream, the counting job, the live table."""

import json

from conftest import run_kappaflow
from kappaflow.counting.store import CountStore
from kappaflow.jobs.manager import JobManager
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings


def test_demo_counts_page_views_and_stops_its_job(serving: Settings) -> None:
    result = run_kappaflow(serving, "demo", "--seconds", "30", "--rate", "300", timeout=300)
    assert result.code == 0, result.err
    assert "Traceback" not in result.err
    out = result.out
    assert "starting counting job demo-views" in out
    assert "views per page per minute" in out and "✓" in out  # some windows became final
    assert "job demo-views stopped" in out
    assert JobManager(serving).get_state("demo-views") == "stopped"

    stats = CountStore(redis_client(serving), "demo-views").stats()
    # The generated stream has duplicates, too-late events and malformed records.
    assert stats["counted"] > 0 and stats["duplicates"] > 0 and stats["dlq"] > 0
    final = [w for w in CountStore(redis_client(serving), "demo-views").windows() if w.final]
    assert final and all(w.count > 0 for w in final)
    status = json.loads(run_kappaflow(serving, "count", "status", "demo-views").out)
    assert status["events_read"] == (
        status["counted"] + status["duplicates_dropped"] + status["late"] + status["dead_letters"]
    )
