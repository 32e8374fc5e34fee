"""Removing a job forgets its checkpoint wherever the job keeps it: under the state
directory, or under a custom ``checkpoint_dir`` (a path, a ``file:`` URI, or a URI of a
file system this machine cannot delete from, which is then named)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kappaflow.jobs.manager import JobManager, JobRecord, JobState
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
