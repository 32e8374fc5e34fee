"""Topic administration: create, list, describe, delete."""

from __future__ import annotations

import os
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic

from kappaflow.errors import (
    InvalidPairError,
    KafkaRequestError,
    KappaflowError,
    OutOfRangeError,
    TopicExistsError,
    TopicNotFoundError,
    WaitTimeoutError,
)
from kappaflow.kafka.clients import admin, cluster_metadata, consumer, describe, kafka_error
from kappaflow.settings import KafkaSettings
from kappaflow.waiting import wait_for

INTERNAL_PREFIX = "__"


def parse_configs(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["retention.ms=1000", ...]`` as a dict; a pair without ``=`` is an error."""
    configs: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InvalidPairError(
                f"invalid topic config {pair!r}: use key=value, e.g. retention.ms=60000"
            )
        configs[key.strip()] = value.strip()
    return configs


#: Partitions of a topic kappaflow creates when none are given: one per core of this
#: machine, so that a local Spark job reading it runs a task on every core (a partition
#: is read by one task). On a cluster, give a number that fits the cluster.
DEFAULT_PARTITIONS = os.cpu_count() or 1
#: A compacted topic's configuration: segments roll every ten minutes and are cleaned
#: once a tenth of the log is superseded, so that a table read of it (``job.table``, the
#: device registry) reads little more than the latest record per key.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": "600000",
    "min.cleanable.dirty.ratio": "0.1",
}


def create_topic(
    kafka: KafkaSettings,
    name: str,
    *,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int | None = None,
    configs: dict[str, str] | None = None,
    exist_ok: bool = False,
) -> bool:
    """Create a topic; True if created, False if it existed and ``exist_ok``.

    Without a ``replication_factor`` the topic has the cluster's default (its
    ``default.replication.factor``, and its ``min.insync.replicas`` unless ``configs``
    say otherwise): one replica on a single broker, three on the embedded cluster."""
    if partitions < 1 or (replication_factor is not None and replication_factor < 1):
        raise OutOfRangeError("partitions and replication factor must be at least 1")
    existing = cluster_metadata(kafka).topics.get(name)
    if exist_ok and existing is not None and existing.error is None:
        # Not asked again: the broker refuses a create to a user without `create` on the
        # topic even where it exists, and a job's sink needs only `write` on it.
        return False
    # -1: the broker's default.replication.factor (KIP-464).
    factor = replication_factor if replication_factor is not None else -1
    new = NewTopic(name, partitions, factor, config=configs or {})
    # Keep the client referenced until the future resolves: a collected client aborts it.
    client = admin(kafka)
    future = client.create_topics([new], request_timeout=kafka.timeout_s)[name]
    try:
        future.result(timeout=kafka.timeout_s)
    except KafkaException as exc:
        err = exc.args[0]
        if err.name() == "TOPIC_ALREADY_EXISTS":
            if exist_ok:
                return False
            raise TopicExistsError(f"topic {name!r} already exists") from None
        raise refused(kafka, exc, f"cannot create topic {name!r}") from None
    _wait_for_leaders(kafka, name, partitions)
    return True


def _wait_for_leaders(kafka: KafkaSettings, name: str, partitions: int) -> None:
    """Wait until every partition of the new topic ``name`` is served by its leader: the
    broker answers a create once the controller has the topic, and a read of its offsets
    or a transaction writing to it fails until each leader has taken its partition."""
    reader = consumer(kafka)

    def served() -> bool | None:
        try:
            for partition in range(partitions):
                reader.get_watermark_offsets(TopicPartition(name, partition), timeout=1.0)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                return True  # a user who may create but not describe: nothing to wait on
            return None  # not yet: unknown partition, or not the leader yet
        return True

    try:
        wait_for(served, timeout=kafka.timeout_s, what=f"the leaders of topic {name!r}")
    except WaitTimeoutError:
        raise KafkaRequestError(
            f"topic {name!r} was created but its partitions have no leader after "
            f"{kafka.timeout_s:.0f}s: check the brokers (`kappaflow status`)"
        ) from None
    finally:
        reader.close()


def list_topics(kafka: KafkaSettings, *, include_internal: bool = False) -> list[dict[str, Any]]:
    metadata = cluster_metadata(kafka)
    rows = [
        {"name": name, "partitions": len(topic.partitions)}
        for name, topic in metadata.topics.items()
        if include_internal or not name.startswith(INTERNAL_PREFIX)
    ]
    return sorted(rows, key=lambda row: str(row["name"]))


def topic_partitions(kafka: KafkaSettings, name: str) -> list[int]:
    """Partition ids of ``name``; TopicNotFoundError if it does not exist."""
    metadata = cluster_metadata(kafka)
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None:
        raise TopicNotFoundError(f"topic {name!r} does not exist (see `kappaflow topics list`)")
    return sorted(topic.partitions)


def describe_topic(kafka: KafkaSettings, name: str) -> dict[str, Any]:
    """Partitions with leaders, replicas, ISR and offsets; non-default configs."""
    metadata = cluster_metadata(kafka)
    topic = metadata.topics.get(name)
    if topic is None or topic.error is not None:
        raise TopicNotFoundError(f"topic {name!r} does not exist (see `kappaflow topics list`)")
    reader = consumer(kafka)
    try:
        partitions: list[dict[str, Any]] = []
        for pid in sorted(topic.partitions):
            part = topic.partitions[pid]
            low, high = reader.get_watermark_offsets(
                TopicPartition(name, pid), timeout=kafka.timeout_s
            )
            partitions.append(
                {
                    "partition": pid,
                    "leader": part.leader,
                    "replicas": list(part.replicas),
                    "isr": list(part.isrs),
                    "low_offset": low,
                    "high_offset": high,
                }
            )
    finally:
        reader.close()
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    client = admin(kafka)
    try:
        entries = client.describe_configs([resource])[resource].result(timeout=kafka.timeout_s)
    except KafkaException as exc:
        raise refused(kafka, exc, f"cannot read configs of {name!r}") from None
    configs = {
        key: entry.value
        for key, entry in sorted(entries.items())
        if not entry.is_default and entry.value is not None
    }
    return {
        "name": name,
        "partitions": partitions,
        "replication_factor": len(partitions[0]["replicas"]) if partitions else 0,
        "messages": sum(p["high_offset"] - p["low_offset"] for p in partitions),
        "configs": configs,
    }


def delete_topic(kafka: KafkaSettings, name: str) -> None:
    topic_partitions(kafka, name)
    client = admin(kafka)
    future = client.delete_topics([name], request_timeout=kafka.timeout_s)[name]
    try:
        future.result(timeout=kafka.timeout_s)
    except KafkaException as exc:
        raise refused(kafka, exc, f"cannot delete topic {name!r}") from None


def refused(kafka: KafkaSettings, exc: KafkaException, what: str) -> KappaflowError:
    """A failed request as our error: a security refusal as such, else a request error."""
    return kafka_error(kafka, exc) or KafkaRequestError(f"{what}: {describe(exc)}")
