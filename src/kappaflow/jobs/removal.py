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

import shutil
from dataclasses import dataclass, field

from kappaflow.jobs.files import local_path, read_resources
from kappaflow.jobs.manager import JobManager
from kappaflow.kafka.topics import delete_topic, list_topics
from kappaflow.serving.client import drop_job_keys, redis_client
from kappaflow.settings import Settings


@dataclass
class Removal:
    """What a removal deleted, and what it left (and where)."""

    topics: list[str] = field(default_factory=list)
    redis_keys: int = 0
    lakes: list[str] = field(default_factory=list)
    kept_topics: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


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
