"""The big-orders job under the test harness, against a real schema registry on the
test session's Kafka: Protobuf written by confluent-kafka's serializer in, Protobuf out,
read back by confluent-kafka's deserializer (examples/protobuf_orders.py)."""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import run_kappaflow
from google.protobuf import json_format
from pyspark.sql import SparkSession

import kappaflow as kf
from protobuf_orders import build, order_class


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


def test_big_orders_in_protobuf(
    registry: str, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = SchemaRegistryClient({"url": registry})
    cls = order_class()
    serializer = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    context = SerializationContext("orders", MessageField.VALUE)
    rows = [
        {"id": "o-1", "amount": 40.0, "at": "2023-11-14T22:13:20Z", "region": "us"},
        {
            "id": "o-2",
            "amount": 250.0,
            "at": "2023-11-14T22:13:21Z",
            "region": "eu",
            "lines": [{"sku": "tea", "qty": 3}],
        },
    ]
    orders = [serializer(json_format.ParseDict(row, cls()), context) for row in rows]
    broken = orders[1][:-1]  # its last string cut short
    params = {"subject": "orders-value", "out_subject": "big-orders-value"}
    # The job finds its registry in the settings, as under `kappaflow jobs start`.
    monkeypatch.setenv("KAPPAFLOW_REGISTRY__EXTERNAL_URL", registry)
    out = kf.testing.run(build, {"orders": [[*orders, broken]]}, params=params, spark=spark)
    written_schema = client.get_latest_version("big-orders-value").schema
    assert written_schema.schema_type == "PROTOBUF"
    text = written_schema.schema_str or ""
    # One message, named after the job and its output, in package kappaflow.
    [name] = re.findall(r"^message (\w+) \{", text, re.MULTILINE)
    big = order_class(text, f"kappaflow.{name}")
    reader = ProtobufDeserializer(big, {"use.deprecated.format": False})
    written = [
        reader(value, SerializationContext("big-orders", MessageField.VALUE))
        for _, value in out.publisher.topics["big-orders"]
    ]
    assert [(r.id, r.amount, r.region) for r in written] == [("o-2", 250.0, "eu")]
    assert [(line.sku, line.qty) for line in written[0].lines] == [("tea", 3)]
    [dead] = out.dead_letters
    assert "does not decode as Protobuf" in dead["error"] and dead["value"] == broken
