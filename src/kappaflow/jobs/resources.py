"""What a job creates (topics, lake tables, store keys), recorded in its directory so that
removing the job removes them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from kappaflow.jobs.files import write_atomically
from kappaflow.streams.job import Job
from kappaflow.streams.output.backends import commits_topic
from kappaflow.streams.runtime import lake_paths, output_topics

RESOURCES = "resources.json"


@dataclass(frozen=True)
class Resources:
    """Where a job writes: topics (its commit markers' included), whether it keeps keys in
    the serving store, and its lake tables."""

    topics: tuple[str, ...] = ()
    redis: bool = False
    lakes: tuple[str, ...] = ()

    def union(self, other: Resources) -> Resources:
        return Resources(
            topics=tuple(sorted({*self.topics, *other.topics})),
            redis=self.redis or other.redis,
            lakes=tuple(sorted({*self.lakes, *other.lakes})),
        )


def job_resources(job: Job, lake_root: str, redis: bool) -> Resources:
    return Resources(
        topics=tuple(sorted({*output_topics(job), commits_topic(job.name)})),
        redis=redis,
        lakes=tuple(sorted(lake_paths(job, lake_root))),
    )


def record_resources(home: Path, resources: Resources) -> None:
    """Add ``resources`` to what the job's home records it writes to."""
    home.mkdir(parents=True, exist_ok=True)
    held = read_resources(home).union(resources)
    body = {"topics": list(held.topics), "redis": held.redis, "lakes": list(held.lakes)}
    write_atomically(home / RESOURCES, json.dumps(body, indent=2) + "\n")


def read_resources(home: Path) -> Resources:
    """What the job's home records (nothing for a job that never started)."""
    try:
        body = json.loads((home / RESOURCES).read_text())
    except FileNotFoundError:
        return Resources()
    return Resources(
        topics=tuple(body["topics"]), redis=bool(body["redis"]), lakes=tuple(body["lakes"])
    )
