"""Big orders, from Protobuf records to Protobuf records, through the schema registry.

Orders arrive on ``orders`` as Protobuf, written by any registry-aware producer
(Confluent's serializers, in any language) under the subject ``orders-value``; the job
reads them as ``Order`` (its ``lines`` a repeated message, its ``at`` a
``google.protobuf.Timestamp``), keeps those over 100 and writes them to ``big-orders`` as
Protobuf under ``big-orders-value``, whose ``.proto`` it registers when it starts. A
record that does not decode goes to the job's dead-letter topic with the reason. Run it
from this folder::

    kappaflow up && kappaflow registry start
    python protobuf_orders.py        # registers ORDER_PROTO by producing two orders
    kappaflow jobs start big-orders --app protobuf_orders:build

``ORDER_PROTO`` is the producers' schema; ``order_class`` builds its Python class at run
time with protoc (``pip install grpcio-tools 'confluent-kafka[protobuf]'``); a project
would generate it once with ``protoc --python_out``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import kappaflow as kf

ORDER_PROTO = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  string id = 1;
  double amount = 2;
  google.protobuf.Timestamp at = 3;
  message Line { string sku = 1; int64 qty = 2; }
  repeated Line lines = 4;
  string region = 5;
}
"""


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class Order:
    id: str
    amount: float
    at: kf.EventTime
    lines: list[Line]
    region: str | None = None


def build(job: kf.Job) -> None:
    orders = job.source(
        job.param("orders", "orders"),
        Order,
        format=kf.protobuf(job.param("subject", "orders-value")),
        key="id",
    )
    big = orders.where(F.col("amount") > 100).select("id", "amount", "region", "at", "lines")
    big.to(kf.topic("big-orders", format=kf.protobuf(job.param("out_subject", "big-orders-value"))))


def order_class(text: str = ORDER_PROTO, name: str = "shop.Order") -> Any:
    """The Python class of message ``name`` of the ``.proto`` ``text``, compiled with the
    protoc that grpcio-tools embeds."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    include = Path(str(resources.files("grpc_tools").joinpath("_proto")))
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        (work / "order.proto").write_text(text)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{work}",
                f"-I{include}",
                f"--descriptor_set_out={work / 'set.pb'}",
                "--include_imports",
                "order.proto",
            ],
            check=True,
        )
        files = descriptor_pb2.FileDescriptorSet.FromString((work / "set.pb").read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for proto in files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def produce(rows: list[dict[str, Any]], *, topic: str = "orders") -> None:  # pragma: no cover
    """Write ``rows`` to ``topic`` as Protobuf with ``ORDER_PROTO`` (registered under
    ``TOPIC-value`` if new), through the settings' Kafka and registry."""
    from confluent_kafka import Producer
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import json_format

    settings = kf.load_settings()
    cls = order_class()
    serializer = ProtobufSerializer(
        cls, SchemaRegistryClient({"url": settings.registry.url}), {"use.deprecated.format": False}
    )
    producer = Producer({"bootstrap.servers": settings.kafka.bootstrap})
    for row in rows:
        message = json_format.ParseDict(row, cls())
        producer.produce(
            topic, serializer(message, SerializationContext(topic, MessageField.VALUE))
        )
    producer.flush(30)


if __name__ == "__main__":  # pragma: no cover
    produce(
        [
            {"id": "o-1", "amount": 40.0, "at": "2023-11-14T22:13:20Z", "region": "us"},
            {
                "id": "o-2",
                "amount": 250.0,
                "at": "2023-11-14T22:13:21Z",
                "region": "eu",
                "lines": [{"sku": "tea", "qty": 3}],
            },
        ]
    )
