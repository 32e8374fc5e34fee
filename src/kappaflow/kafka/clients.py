"""confluent-kafka clients built from the settings, with errors turned into ours."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

from kappaflow.errors import KafkaClusterError, KafkaUnreachableError
from kappaflow.settings import KafkaSettings

# librdkafka logs connection failures to stderr on its own; the CLI reports them once.
_QUIET = {"log_level": "0"}


def admin(kafka: KafkaSettings) -> AdminClient:
    return AdminClient({**kafka.client_config(), **_QUIET})


def producer(kafka: KafkaSettings, **extra: Any) -> Producer:
    config: dict[str, Any] = {
        **kafka.client_config(),
        **_QUIET,
        # Retries must not reorder or duplicate records.
        "enable.idempotence": True,
        "linger.ms": 5,
    }
    config.update(extra)
    return Producer(config)


def transactional_producer(kafka: KafkaSettings, transactional_id: str) -> Producer:
    """A producer of transactions under ``transactional_id``: what a previous producer of
    that id left open is aborted, and that producer fenced off, before it returns."""
    client = Producer(
        {
            **kafka.client_config(),
            **_QUIET,
            "transactional.id": transactional_id,
            "linger.ms": 20,
            # Java's partitioner, so that a key's records from Spark's own Kafka sink
            # (real-time mode) land in the same partition as these.
            "partitioner": "murmur2_random",
            "compression.type": "lz4",
        }
    )
    client.init_transactions(60)
    return client


def consumer(kafka: KafkaSettings, **extra: Any) -> Consumer:
    config: dict[str, Any] = {
        **kafka.client_config(),
        **_QUIET,
        # The tools read explicit offsets and never commit: a read must not move a group.
        "group.id": "kappaflow-tools",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        # An --offset below the log start (deleted by retention) reads from the start.
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    }
    config.update(extra)
    return Consumer(config)


def cluster_metadata(kafka: KafkaSettings, topic: str | None = None) -> ClusterMetadata:
    """Cluster metadata, or a KafkaClusterError that says the cluster cannot be reached."""
    client = admin(kafka)
    try:
        metadata = client.list_topics(topic=topic, timeout=kafka.timeout_s)
    except KafkaException as exc:
        raise unreachable(kafka, exc) from None
    if not metadata.brokers:
        raise unreachable(kafka, None)
    return metadata


def unreachable(kafka: KafkaSettings, exc: BaseException | None) -> KafkaClusterError:
    hint = "start it with `kappaflow kafka start`" if kafka.embedded else "check bootstrap_servers"
    detail = f" ({describe(exc)})" if exc is not None else ""
    return KafkaUnreachableError(f"cannot reach Kafka at {kafka.bootstrap}{detail}: {hint}")


def describe(exc: BaseException) -> str:
    """The human part of a confluent-kafka exception."""
    if isinstance(exc, KafkaException) and exc.args:
        err = exc.args[0]
        text = err.str() if hasattr(err, "str") else str(err)
        return str(text)
    return str(exc)
