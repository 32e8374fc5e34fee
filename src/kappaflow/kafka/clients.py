"""confluent-kafka clients built from the settings, with errors turned into ours."""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata

from kappaflow.errors import (
    AuthenticationFailedError,
    ConsumeError,
    KafkaClusterError,
    KafkaUnreachableError,
    NotAuthorizedError,
    SecurityError,
    TlsHandshakeError,
)
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


class _SecurityErrors:
    """librdkafka's error callback: keeps the first authentication or TLS failure, which
    a metadata request that fails reports only as a transport failure."""

    def __init__(self) -> None:
        self.first: KafkaError | None = None

    def __call__(self, err: KafkaError) -> None:
        if self.first is None and err.code() in (KafkaError._AUTHENTICATION, KafkaError._SSL):
            self.first = err


def cluster_metadata(kafka: KafkaSettings, topic: str | None = None) -> ClusterMetadata:
    """Cluster metadata, or a KafkaClusterError that says the cluster cannot be reached
    (a SecurityError where it refused the credentials or the TLS handshake failed)."""
    seen = _SecurityErrors()
    config: dict[str, Any] = {**kafka.client_config(), **_QUIET, "error_cb": seen}
    client = AdminClient(config)
    deadline = time.monotonic() + kafka.timeout_s
    while True:
        # A second at a time: a refused password or certificate is final, and said at
        # once rather than after the whole timeout.
        wait = max(0.1, min(1.0, deadline - time.monotonic()))
        try:
            metadata = client.list_topics(topic=topic, timeout=wait)
            break
        except KafkaException as exc:
            client.poll(0)  # serves the error callbacks queued meanwhile
            if seen.first is not None:
                raise unreachable(kafka, KafkaException(seen.first)) from None
            if time.monotonic() >= deadline:
                raise unreachable(kafka, exc) from None
    if not metadata.brokers:
        raise unreachable(kafka, None)
    return metadata


_AUTHORIZATION = frozenset(
    {
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
        KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        KafkaError.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
    }
)


def kafka_error(kafka: KafkaSettings, exc: BaseException) -> SecurityError | None:
    """The security failure ``exc`` is, as our error; None if it is none."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if not isinstance(err, KafkaError):
        return None
    code, text = err.code(), describe(exc)
    if code in _AUTHORIZATION:
        return NotAuthorizedError(
            f"Kafka refused this to {kafka.sasl_username or 'an anonymous client'}: {text} "
            "(an ACL must allow it: `kappaflow acls grant`)"
        )
    if code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
        return AuthenticationFailedError(
            f"Kafka at {kafka.bootstrap} refused the credentials of "
            f"{kafka.sasl_username or 'this client'}: {text}"
        )
    if code == KafkaError._SSL:
        return TlsHandshakeError(
            f"the TLS handshake with Kafka at {kafka.bootstrap} failed: {text} (is "
            "kafka.ssl_ca_location the authority that signed the broker's certificate?)"
        )
    return None


def unreachable(
    kafka: KafkaSettings, exc: BaseException | None
) -> KafkaClusterError | SecurityError:
    if exc is not None:
        refused = kafka_error(kafka, exc)
        if refused is not None:
            return refused
    hint = "start it with `kappaflow kafka start`" if kafka.embedded else "check bootstrap_servers"
    detail = f" ({describe(exc)})" if exc is not None else ""
    return KafkaUnreachableError(f"cannot reach Kafka at {kafka.bootstrap}{detail}: {hint}")


def at_end(message: Message, topic: str) -> bool:
    """Whether ``message``, polled from ``topic``, tells that its partition was read to
    its end (a reader with ``enable.partition.eof``) rather than holding a record;
    ConsumeError for any other error it carries."""
    error = message.error()
    if error is None:
        return False
    if error.code() == KafkaError._PARTITION_EOF:
        return True
    raise ConsumeError(f"reading {topic!r} failed: {error.str()}")


def describe(exc: BaseException) -> str:
    """The human part of a confluent-kafka exception."""
    if isinstance(exc, KafkaException) and exc.args:
        err = exc.args[0]
        text = err.str() if hasattr(err, "str") else str(err)
        return str(text)
    return str(exc)
