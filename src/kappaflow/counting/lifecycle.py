"""Where a counting job's results live, and forgetting all of it."""

from __future__ import annotations

from kappaflow.counting.store import CountStore
from kappaflow.jobs.manager import JobManager, JobState
from kappaflow.kafka.topics import delete_topic, list_topics
from kappaflow.serving.client import redis_client
from kappaflow.settings import Settings


def topics_of(job: str) -> dict[str, str]:
    """The job's topics: changelog, too-late events, dead letters, committed batches."""
    return {
        "counts": f"{job}.counts",
        "late": f"{job}.late",
        "dlq": f"{job}.dlq",
        "commits": f"{job}.commits",
    }


def remove(settings: Settings, job: str, *, missing_ok: bool = False) -> list[str]:
    """Forget a counting job that is not running: its Redis keys, its topics (the names
    of those it deleted), then its record and checkpoint. All of them go together: a
    checkpoint removed while ``NAME.commits`` stayed would make a new job of the same
    name skip publishing its first batches, which that topic says were published. The
    record goes last, so that a removal cut short can be run again; with ``missing_ok``,
    outputs left without a record are removed too."""
    jobs = JobManager(settings)
    state = jobs.get_state(job)
    if state is JobState.ABSENT and not missing_ok:
        jobs.get(job)  # raises: no job of that name
    jobs.check_stopped(job)
    CountStore(redis_client(settings), job).drop()
    existing = {t["name"] for t in list_topics(settings.kafka)}
    deleted = [topic for topic in topics_of(job).values() if topic in existing]
    for topic in deleted:
        delete_topic(settings.kafka, topic)
    if state is not JobState.ABSENT:
        jobs.remove(job)
    return deleted
