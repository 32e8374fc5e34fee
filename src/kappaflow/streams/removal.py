"""Forgetting a job of the job API (``kappaflow jobs remove``), so that it can begin again
from nothing under the same name.

A job keeps its progress in five places: its checkpoint (Spark's offsets and state), its
commit markers (``JOB.commits``: the last batch each output published), its serving-store
keys (``kf:JOB:*``), its lake tables (whose manifests say which batches they hold) and the
topics it publishes to. They go together: with the checkpoint gone and the markers kept,
a new run would skip publishing its first batches, which the markers say went out; with
the manifests kept, it would skip writing them to the lake.

What a job writes to is known when it starts (its outputs are declared then), so each
start records it in the job's home (``resources.json``, the union over its starts); a
removal reads it back. Topics outside the job's name (``JOB.``), named by a sink, hold no
bookkeeping and may have other readers: they stay, and are named. Locations on another
file system than this machine's (``hdfs://``, ``s3a://``) are named, not deleted.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from kappaflow.jobs.manager import JobManager, local_path, write_atomically
from kappaflow.kafka.topics import delete_topic, list_topics
from kappaflow.serving.client import drop_job_keys, redis_client
from kappaflow.settings import Settings
from kappaflow.streams.backends import commits_topic
from kappaflow.streams.job import Job
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


@dataclass
class Removal:
    """What a removal deleted, and what it left (and where)."""

    topics: list[str] = field(default_factory=list)
    redis_keys: int = 0
    lakes: list[str] = field(default_factory=list)
    kept_topics: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


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


def remove_job(settings: Settings, name: str) -> Removal:
    """Forget job ``name``, which must not be running: its outputs first, then its record
    and checkpoint, so that a removal cut short can be run again."""
    jobs = JobManager(settings)
    jobs.get(name)
    jobs.check_stopped(name)
    resources = read_resources(jobs.job_dir(name))
    removal = Removal()
    if resources.redis:
        removal.redis_keys = drop_job_keys(redis_client(settings), name)
    existing = {t["name"] for t in list_topics(settings.kafka)}
    for topic in resources.topics:
        if topic not in existing:
            continue
        if topic.startswith(f"{name}."):
            delete_topic(settings.kafka, topic)
            removal.topics.append(topic)
        else:
            removal.kept_topics.append(topic)
    for location in resources.lakes:
        path = local_path(location)
        if path is None:
            removal.left.append(location)
        elif path.exists():
            shutil.rmtree(path)
            removal.lakes.append(location)
    removal.left += jobs.remove(name)
    return removal
