"""Big orders, from Avro records to Avro records, through the schema registry.

Orders arrive on ``orders`` as Avro, written by any registry-aware producer (Confluent's
serializers, for one) under the subject ``orders-value``; the job reads them as ``Order``
(a field the producers' schema lacks takes its default), keeps those over 100 and writes
them to ``big-orders`` as Avro under ``big-orders-value``, whose schema it registers when
it starts. A record that does not decode goes to the job's dead-letter topic with the
reason. Run it from this folder::

    kappaflow up && kappaflow registry start
    kappaflow registry register orders-value orders.avsc   # the producers' schema
    kappaflow jobs start big-orders --app avro_orders:build

``ORDER_SCHEMA`` is that schema; ``produce`` writes a few orders with it (it needs
confluent-kafka's Avro extra: ``pip install 'confluent-kafka[avro]'``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F

import kappaflow as kf

ORDER_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "region", "type": "string", "default": "eu"},
    ],
}


@dataclass
class Order:
    id: str
    amount: float
    at: kf.EventTime
    region: str | None = None


def build(job: kf.Job) -> None:
    orders = job.source(
        job.param("orders", "orders"),
        Order,
        format=kf.avro(job.param("subject", "orders-value")),
        key="id",
    )
    big = orders.where(F.col("amount") > 100).select("id", "amount", "region", "at")
    big.to(kf.topic("big-orders", format=kf.avro(job.param("out_subject", "big-orders-value"))))


def produce(rows: list[dict[str, Any]], *, topic: str = "orders") -> None:  # pragma: no cover
    """Write ``rows`` to ``topic`` as Avro with ``ORDER_SCHEMA`` (registered under
    ``TOPIC-value`` if new), through the settings' Kafka and registry."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    settings = kf.load_settings()
    serializer = AvroSerializer(
        SchemaRegistryClient({"url": settings.registry.url}), json.dumps(ORDER_SCHEMA)
    )
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap})
    for row in rows:
        producer.produce(topic, serializer(row, SerializationContext(topic, MessageField.VALUE)))
    producer.flush(30)


if __name__ == "__main__":  # pragma: no cover
    produce(
        [
            {"id": "o-1", "amount": 40.0, "at": 1_700_000_000_000, "region": "us"},
            {"id": "o-2", "amount": 250.0, "at": 1_700_000_001_000, "region": "eu"},
        ]
    )
