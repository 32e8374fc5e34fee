"""The big-orders job under the test harness, against a real schema registry on the
test session's Kafka: Avro written by confluent-kafka's serializer in, Avro out
(examples/avro_orders.py)."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import run_kappaflow
from pyspark.sql import SparkSession

import kappaflow as kf
from avro_orders import ORDER_SCHEMA, build


@pytest.fixture(scope="module")
def registry(kafka: kf.Settings) -> Iterator[str]:
    """A registry of this module's own on the test session's Kafka, started and stopped
    by the CLI."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "KAPPAFLOW_REGISTRY__PORT": str(port),
        "KAPPAFLOW_REGISTRY__TOPIC": f"_schemas-{uuid.uuid4().hex[:8]}",
    }
    started = run_kappaflow(kafka, "registry", "start", env=env)
    assert started.code == 0, started.err
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        run_kappaflow(kafka, "registry", "stop", env=env)


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
