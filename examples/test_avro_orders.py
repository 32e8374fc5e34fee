"""The big-orders job under the test harness, against a real schema registry on the
test session's Kafka: Avro written by confluent-kafka's serializer in, Avro out
(examples/avro_orders.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession

import kappaflow as kf
from avro_orders import ORDER_SCHEMA, build
from kappaflow.procs import free_port
from kappaflow.registry.service import EmbeddedRegistry
from kappaflow.settings import Settings


@pytest.fixture(scope="module")
def registry(kafka: Settings) -> Iterator[str]:
    settings = kafka.model_copy(
        update={
            "registry": kafka.registry.model_copy(
                update={"port": free_port(), "topic": f"_schemas-{uuid.uuid4().hex[:8]}"}
            )
        }
    )
    service = EmbeddedRegistry(settings)
    service.start()
    try:
        yield settings.registry.url
    finally:
        service.stop()


def test_big_orders_in_avro(
    registry: str, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SchemaRegistryClient({"url": registry})
    serializer = AvroSerializer(client, json.dumps(ORDER_SCHEMA))
    context = SerializationContext("orders", MessageField.VALUE)
    orders = [
        serializer(row, context)
        for row in [
            {"id": "o-1", "amount": 40.0, "at": 1_700_000_000_000, "region": "us"},
            {"id": "o-2", "amount": 250.0, "at": 1_700_000_001_000, "region": "eu"},
        ]
    ]
    broken = b"\x00\x00\x00\x00\x01\xff"
    params = {"subject": "orders-value", "out_subject": "big-orders-value"}
    # The job finds its registry in the settings, as under `kappaflow jobs start`.
    monkeypatch.setenv("KAPPAFLOW_REGISTRY__EXTERNAL_URL", registry)
    out = kf.testing.run(build, {"orders": [[*orders, broken]]}, params=params, spark=spark)
    reader = AvroDeserializer(client)
    written = [
        reader(value, SerializationContext("big-orders", MessageField.VALUE))
        for _, value in out.publisher.topics["big-orders"]
    ]
    assert [(r["id"], r["amount"], r["region"]) for r in written] == [("o-2", 250.0, "eu")]
    [dead] = out.dead_letters
    assert "does not decode as Avro" in dead["error"] and dead["value"] == broken
