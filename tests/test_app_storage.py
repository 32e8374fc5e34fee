"""A job whose sinks cannot be reached (a checkpoint or lake path Spark has no file
system for, a serving store that does not answer) is refused in one line, before it
creates or writes anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import RunCli, error_line, free_port

from kappaflow.kafka.topics import list_topics
from kappaflow.settings import Settings
from test_app_jobs import PATH


def test_a_lake_or_checkpoint_without_a_file_system_is_refused(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = new_topic()
    job = f"storage-{topic}"
    lake = {"PYTHONPATH": PATH, "KAPPAFLOW_LAKE_DIR": "s3a://bucket/lake"}
    started = cli("jobs", "start", job, "--app", "revenue:build", "-P", f"topic={topic}", env=lake)
    line = error_line(started, "KF607", 1)
    assert "error[KF726]: cannot reach 's3a://bucket/lake/" in line
    assert "S3AFileSystem not found" in line
    # Nothing was created: no output topic, no checkpoint.
    assert not [t for t in list_topics(serving.kafka) if t["name"].startswith(f"{job}.")]
    assert not (serving.checkpoint_root / job).exists()

    elsewhere = {"PYTHONPATH": PATH, "KAPPAFLOW_CHECKPOINT_DIR": "foo://nowhere/checkpoints"}
    checked = cli("jobs", "check", "--app", "revenue:build", "-P", f"topic={topic}", env=elsewhere)
    assert 'No FileSystem for scheme "foo"' in error_line(checked, "KF726", 2)


def test_a_job_whose_serving_store_is_down_creates_nothing(
    cli: RunCli, serving: Settings, new_topic: Callable[..., str]
) -> None:
    topic = new_topic()
    job = f"storeless-{topic}"
    nowhere = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    env = {"PYTHONPATH": PATH, "KAPPAFLOW_REDIS__URL": nowhere}
    started = cli("jobs", "start", job, "--app", "revenue:build", "-P", f"topic={topic}", env=env)
    line = error_line(started, "KF607", 1)
    assert f"error[KF306]: cannot reach Redis at {nowhere}" in line
    assert not [t for t in list_topics(serving.kafka) if t["name"].startswith(f"{job}.")]
    assert not (serving.checkpoint_root / job).exists()
