"""Where a job keeps its checkpoint and lake: on HDFS as well as on the local disk; and a
job whose sinks cannot be reached (a checkpoint or lake path Spark has no file system
for, a serving store that does not answer) is refused in one line, before it creates or
writes anything."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import RunCli, error_line
from hdfs_cluster import mini_hdfs
from live_jobs import send_json, topic_values
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from kappaflow.jobs.contract import JobContext
from kappaflow.jobs.from_build import start_app
from kappaflow.jobs.status import outputs_status
from kappaflow.kafka.topics import list_topics
from kappaflow.procs import free_port
from kappaflow.settings import Settings
from kappaflow.streams.output.lake_fs import HadoopFs
from kappaflow.streams.output.lake_read import read_spark
from kappaflow.waiting import wait_for
from revenue import build as revenue
from test_app_jobs import PATH, order


@pytest.fixture(scope="module")
def hdfs(kafka: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with mini_hdfs(kafka, tmp_path_factory.mktemp("hdfs")) as uri:
        yield uri


@pytest.mark.long
def test_a_job_keeps_its_checkpoint_and_lake_on_hdfs(
    serving: Settings, spark: SparkSession, new_topic: Callable[..., str], hdfs: str
) -> None:
    """The revenue job with ``checkpoint_dir`` and ``lake_dir`` on HDFS: its offsets,
    state and lake commits land there (nothing local), and a restart resumes from them."""
    settings = serving.model_copy(
        update={"checkpoint_dir": f"{hdfs}/checkpoints", "lake_dir": f"{hdfs}/lake"}
    )
    topic = new_topic()
    job = f"revenue-{uuid.uuid4().hex[:8]}"
    context = JobContext(job, {"topic": topic}, spark, settings)
    changelog, lake = f"{job}.revenue", f"{hdfs}/lake/{job}/revenue"
    first = order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z")
    send_json(serving, topic, [first, first], key="buyer")
    run(start_app(revenue, context), lambda: len(topic_values(serving, changelog)) == 1)
    checkpoint = HadoopFs(spark, f"{hdfs}/checkpoints/{job}")
    assert checkpoint.exists("revenue/offsets") and checkpoint.exists("revenue/state")
    assert checkpoint.exists("revenue.plan.json")
    assert not (serving.checkpoint_root / job).exists()
    assert not Path(serving.checkpoint_location, job).exists()
    assert [(r["version"], r["total"]) for r in read_spark(spark, lake).collect()] == [(1, 10.0)]

    # Restarted, the job resumes from the offsets and state on HDFS: the new order
    # corrects the window it left (version 2), and o1 is not counted again.
    second = order("o2", "bob", "DE", 5.0, "2026-11-23T10:00:10Z")
    send_json(serving, topic, [second], key="buyer")
    run(start_app(revenue, context), lambda: len(topic_values(serving, changelog)) == 2)
    changes = topic_values(serving, changelog)
    assert [(c["version"], c["values"]["total"]) for c in changes] == [(1, 10.0), (2, 15.0)]
    rows = sorted((r["version"], r["total"]) for r in read_spark(spark, lake).collect())
    assert rows == [(1, 10.0), (2, 15.0)]


@pytest.mark.long
def test_the_events_a_job_read_are_accounted_with_its_checkpoint_on_hdfs(
    serving: Settings, spark: SparkSession, new_topic: Callable[..., str], hdfs: str
) -> None:
    """``jobs status``'s ``events_read`` is measured from the checkpoint's offsets, which
    on HDFS only the job's driver reaches: it measures them after each batch, and the
    status reports what it measured, a duplicate and a record that does not parse
    included."""
    settings = serving.model_copy(
        update={"checkpoint_dir": f"{hdfs}/checkpoints", "lake_dir": f"{hdfs}/lake"}
    )
    topic = new_topic()
    job = f"revenue-{uuid.uuid4().hex[:8]}"
    context = JobContext(job, {"topic": topic}, spark, settings)
    first = order("o1", "ada", "DE", 10.0, "2026-11-23T10:00:05Z")
    send_json(serving, topic, [first, first, b"{not an order"], key="buyer")

    def accounted() -> int:
        """The records the job's own code accounted for: passed, duplicate, dead letter."""
        found = outputs_status(settings, job).get("revenue", {})
        return sum(int(found.get(k) or 0) for k in ("events", "duplicates", "dead_letters"))

    run(start_app(revenue, context), lambda: accounted() == 3)
    status = outputs_status(settings, job)["revenue"]
    assert (status["events"], status["duplicates"], status["dead_letters"]) == (1, 1, 1)
    assert status["events_read"] == 3
    # Restarted, it counts on from the checkpoint: what it read before, and the new order.
    second = order("o2", "bob", "DE", 5.0, "2026-11-23T10:00:10Z")
    send_json(serving, topic, [second], key="buyer")
    run(start_app(revenue, context), lambda: accounted() == 4)
    assert outputs_status(settings, job)["revenue"]["events_read"] == 4
    assert not Path(serving.checkpoint_location, job).exists()


def run(queries: list[StreamingQuery], done: Callable[[], bool]) -> None:
    """Run ``queries`` until ``done``, then stop them."""
    try:
        wait_for(lambda: True if done() else None, timeout=120, what="the job's results")
    finally:
        for query in queries:
            query.stop()


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
