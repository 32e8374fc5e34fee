"""`kappaflow topics …` against the real broker."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

from conftest import Result, RunCli, settings_env

from kappaflow.errors import TopicNotFoundError
from kappaflow.settings import Settings


def test_create_describe_list_delete(cli: RunCli, topic_name: str) -> None:
    created = cli(
        "topics",
        "create",
        topic_name,
        "--partitions",
        "3",
        "--config",
        "retention.ms=3600000",
        "-c",
        "cleanup.policy=compact",
    )
    assert created.code == 0, created.err
    described = json.loads(cli("topics", "describe", topic_name).out)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert described["configs"]["retention.ms"] == "3600000"
    assert described["configs"]["cleanup.policy"] == "compact"
    assert described["messages"] == 0
    listed = [json.loads(line) for line in cli("topics", "list").lines()]
    assert {"name": topic_name, "partitions": 3} in listed
    assert not any(row["name"].startswith("__") for row in listed)

    deleted = cli("topics", "delete", topic_name)
    assert deleted.code == 0, deleted.err
    assert topic_name not in cli("topics", "list").out
    missing = cli("topics", "describe", topic_name)
    assert missing.code == 1
    assert "does not exist" in missing.err


def create_on_cores(kafka: Settings, topic: str, cores: int | None) -> Result:
    """`kappaflow topics create TOPIC` in a process whose machine has ``cores`` cores (None:
    a count Python cannot tell)."""
    code = (
        f"import os, sys; os.cpu_count = lambda: {cores!r}; "
        f"from kappaflow.cli import main; sys.exit(main(['topics', 'create', {topic!r}]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **settings_env(kafka)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_create_twice(cli: RunCli, kafka: Settings, topic_name: str) -> None:
    # Without --partitions: one per core of the machine, or one if its cores are unknown.
    unknown = f"{topic_name}-unknown"
    for topic, cores, partitions in ((topic_name, 3, 3), (unknown, None, 1)):
        created = create_on_cores(kafka, topic, cores)
        assert created.code == 0, created.err
        described = json.loads(cli("topics", "describe", topic).out)
        assert len(described["partitions"]) == partitions, cores
    assert cli("topics", "delete", unknown).code == 0
    again = cli("topics", "create", topic_name)
    assert again.code == 1
    assert "already exists" in again.err
    assert cli("topics", "create", topic_name, "--if-not-exists").code == 0


def test_bad_topic_arguments(cli: RunCli, topic_name: str) -> None:
    bad_config = cli("topics", "create", topic_name, "--config", "retention.ms")
    assert bad_config.code != 0
    assert "key=value" in bad_config.err
    assert cli("topics", "create", topic_name, "--partitions", "0").code == 2
    unknown_config = cli("topics", "create", topic_name, "-c", "no.such.config=1")
    assert unknown_config.code == 1
    assert "cannot create topic" in unknown_config.err
    assert cli("topics", "delete", topic_name).code == 1


def test_same_tools_through_the_external_cluster_path(
    cli: RunCli, kafka: Settings, topic_name: str
) -> None:
    """With bootstrap servers given, the tools treat Kafka as external and start nothing."""
    external = ("--bootstrap-servers", kafka.kafka.bootstrap)
    assert cli(*external, "topics", "create", topic_name, "-p", "2").code == 0
    sent = cli(*external, "produce", topic_name, input='{"a": 1}\n{"a": 2}\n')
    assert sent.code == 0, sent.err
    read = cli(*external, "consume", topic_name, "--from-beginning")
    assert sorted(json.loads(line)["value"]["a"] for line in read.lines()) == [1, 2]
    status = {
        json.loads(line)["service"]: json.loads(line)
        for line in cli(*external, "status", "--json").lines()
    }
    assert status["kafka"]["state"] == "external"
    assert status["kafka"]["address"] == kafka.kafka.bootstrap
    refused = cli(*external, "kafka", "stop")
    assert refused.code == 1 and "external" in refused.err


def test_a_created_topic_has_its_leaders_when_create_returns(kafka: Settings) -> None:
    """A job creates its topics and reads their offsets or writes to them at once: the
    create returns only once every partition has a leader."""
    from confluent_kafka import TopicPartition

    from kappaflow.kafka.clients import cluster_metadata, consumer
    from kappaflow.kafka.topics import create_topic, delete_topic

    names = [f"leaders-{os.getpid()}-{i}" for i in range(5)]
    try:
        for name in names:
            assert create_topic(kafka.kafka, name, partitions=12)
            topic = cluster_metadata(kafka.kafka, name).topics[name]
            assert all(p.leader >= 0 for p in topic.partitions.values())
            reader = consumer(kafka.kafka)
            try:
                for partition in range(12):
                    assert reader.get_watermark_offsets(
                        TopicPartition(name, partition), timeout=0.5
                    ) == (0, 0)
            finally:
                reader.close()
    finally:
        for name in names:
            with contextlib.suppress(TopicNotFoundError):
                delete_topic(kafka.kafka, name)
