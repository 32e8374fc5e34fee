"""`kappaflow topics …` against the real broker."""

from __future__ import annotations

import json
import os

from conftest import RunCli

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


def test_create_twice(cli: RunCli, topic_name: str) -> None:
    assert cli("topics", "create", topic_name).code == 0
    # Without --partitions: one per core of this machine.
    described = json.loads(cli("topics", "describe", topic_name).out)
    assert len(described["partitions"]) == (os.cpu_count() or 1)
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
