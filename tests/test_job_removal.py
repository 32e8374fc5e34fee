"""Removing a job forgets its checkpoint wherever the job keeps it: under the state
directory, or under a custom ``checkpoint_dir`` (a path, a ``file:`` URI, or a URI of a
file system this machine cannot delete from, which is then named)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from conftest import RunCli

from kappaflow.counting.lifecycle import topics_of
from kappaflow.jobs.manager import JobManager, JobRecord, JobState
from kappaflow.kafka.topics import create_topic, list_topics
from kappaflow.settings import Settings, load_settings


def stopped_job(settings: Settings, name: str) -> JobManager:
    """A job of the job API that ran and stopped: its record and both checkpoint roots."""
    jobs = JobManager(settings)
    home = jobs.job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name=name, pipeline="revenue:build", params={}, state=JobState.STOPPED).save(
        home / "job.json"
    )
    (settings.checkpoint_root / name / "revenue" / "offsets").mkdir(parents=True)
    return jobs


@pytest.mark.parametrize("as_uri", [False, True], ids=["path", "file-uri"])
def test_a_local_checkpoint_dir_is_removed_with_the_job(tmp_path: Path, as_uri: bool) -> None:
    custom = tmp_path / "elsewhere"
    location = f"file://{custom}" if as_uri else str(custom)
    settings = load_settings(state_dir=tmp_path / "state", checkpoint_dir=location)
    jobs = stopped_job(settings, "revenue")
    (custom / "revenue" / "revenue" / "offsets").mkdir(parents=True)
    (custom / "other" / "revenue").mkdir(parents=True)

    kept = jobs.remove("revenue")

    assert not (custom / "revenue").exists()
    assert (custom / "other" / "revenue").is_dir()  # another job's checkpoint stays
    assert not (settings.checkpoint_root / "revenue").exists()
    assert jobs.get_state("revenue") is JobState.ABSENT
    assert kept == []


def test_a_checkpoint_on_another_file_system_is_named_not_removed(tmp_path: Path) -> None:
    settings = load_settings(state_dir=tmp_path / "state", checkpoint_dir="hdfs://nn:8020/ck/")
    jobs = stopped_job(settings, "revenue")

    kept = jobs.remove("revenue")

    assert jobs.get_state("revenue") is JobState.ABSENT
    assert not (settings.checkpoint_root / "revenue").exists()
    assert kept == ["hdfs://nn:8020/ck/revenue"]


def test_jobs_remove_forgets_a_count_job_as_count_remove_does(
    cli: RunCli, serving: Settings
) -> None:
    """``jobs remove`` of a counting job removes what ``count remove`` removes: its
    Redis keys and its four topics too, not only its record and checkpoint."""
    name = f"views-{uuid.uuid4().hex[:8]}"
    jobs = JobManager(serving)
    home = jobs.job_dir(name)
    home.mkdir(parents=True)
    JobRecord(name=name, pipeline="count", params={}, state=JobState.STOPPED).save(
        home / "job.json"
    )
    for topic in topics_of(name).values():
        create_topic(serving.kafka, topic)
    store = redis.Redis.from_url(serving.redis.effective_url)
    store.set(f"kf:{name}:stats", 1)  # CountStore's prefix

    removed = cli("jobs", "remove", name)

    assert removed.code == 0, removed.err
    assert "4 topics" in removed.err
    assert not set(topics_of(name).values()) & {t["name"] for t in list_topics(serving.kafka)}
    assert store.get(f"kf:{name}:stats") is None
    assert jobs.get_state(name) is JobState.ABSENT
