"""The schema registry against the real components: the registry process started,
asked and stopped by `kappaflow registry`, its schemas in a Kafka topic (a restart serves
the same ids), confluent-kafka's own registry client and Avro serializer talking to it,
compatibility refused with the field named, and Avro and Protobuf records decoded by a
job's source in Spark, evolved ones included, with what does not decode in the dead
letters, and written by a job's sink for confluent-kafka's deserializers."""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from conftest import Result, error_line, run_kappaflow
from google.protobuf import json_format
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.errors import RegistryRequestError, SchemaFormatError, SchemaIncompatibleError
from kappaflow.kafka.clients import producer
from kappaflow.kafka.records import StartAt, read_records
from kappaflow.procs import free_port
from kappaflow.registry.client import Registered, RegistryClient
from kappaflow.registry.compat import can_read, check
from kappaflow.registry.protobuf import check as proto_check
from kappaflow.registry.protobuf import parse as proto_parse
from kappaflow.settings import Settings

pytestmark = pytest.mark.integration

V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}
# A field added with a default: BACKWARD compatible.
V2 = {**V1, "fields": [*V1["fields"], {"name": "region", "type": "string", "default": "eu"}]}
# A field added without a default: the new schema cannot read old orders.
BREAKING = {**V1, "fields": [*V1["fields"], {"name": "coupon", "type": "string"}]}


# -- compatibility, without a registry


def test_compatibility_names_the_field() -> None:
    assert check("BACKWARD", json.dumps(V2), [json.dumps(V1)]) == []
    [problem] = check("BACKWARD", json.dumps(BREAKING), [json.dumps(V1)])
    assert "'coupon'" in problem and "no default" in problem
    # FORWARD: old readers of new data; dropping a field without default breaks them.
    dropped = {**V1, "fields": V1["fields"][:2]}
    [problem] = check("FORWARD", json.dumps(dropped), [json.dumps(V1)])
    assert "'at'" in problem
    assert check("BACKWARD", json.dumps(dropped), [json.dumps(V1)]) == []
    assert check("NONE", json.dumps(BREAKING), [json.dumps(V1)]) == []
    # A type change: a long widens to a double, a string does not become a long.
    longer = {**V1, "fields": [{"name": "id", "type": "long"}, *V1["fields"][1:]]}
    [problem] = can_read(longer, V1)
    assert "'id'" in problem and "long cannot read string" in problem
    wider = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "double"}]}
    narrow = {"type": "record", "name": "R", "fields": [{"name": "n", "type": "int"}]}
    assert can_read(wider, narrow) == [] and can_read(narrow, wider) != []
    # Nested paths and unions.
    outer = {
        "type": "record",
        "name": "Outer",
        "fields": [{"name": "inner", "type": ["null", {**V1, "name": "Inner"}]}],
    }
    changed = {
        "type": "record",
        "name": "Outer",
        "fields": [{"name": "inner", "type": ["null", {**BREAKING, "name": "Inner"}]}],
    }
    [problem] = can_read(changed, outer)
    assert "'inner.coupon'" in problem


# -- the registry as a service


@pytest.fixture(scope="module")
def registry(kafka: Settings) -> Iterator[Settings]:
    """Kafka's settings with a registry of this module's own (port and topic), started by
    the CLI and stopped by it after."""
    settings = kafka.model_copy(
        update={
            "registry": kafka.registry.model_copy(
                update={"port": free_port(), "topic": f"_schemas-{uuid.uuid4().hex[:8]}"}
            )
        }
    )
    assert _status(settings)["state"] == "stopped"
    started = _kf(settings, "registry", "start")
    try:
        assert started.code == 0, started.err
        assert f"registry started: {settings.registry.url}" in started.err
        yield settings
    finally:
        _kf(settings, "registry", "stop")


def _env(settings: Settings) -> dict[str, str]:
    return {
        "KAPPAFLOW_REGISTRY__PORT": str(settings.registry.port),
        "KAPPAFLOW_REGISTRY__TOPIC": settings.registry.topic,
    }


def _kf(settings: Settings, *args: str) -> Result:
    return run_kappaflow(settings, *args, env=_env(settings), timeout=120)


def _status(settings: Settings) -> dict[str, Any]:
    result = _kf(settings, "registry", "status", "--json")
    assert result.code == 0, result.err
    found: dict[str, Any] = json.loads(result.out)
    return found


def _subject() -> str:
    return f"orders-{uuid.uuid4().hex[:8]}-value"


def test_register_evolve_refuse_and_restart(registry: Settings, tmp_path: Any) -> None:
    subject = _subject()
    v1, v2, breaking = tmp_path / "v1.avsc", tmp_path / "v2.avsc", tmp_path / "bad.avsc"
    v1.write_text(json.dumps(V1))
    v2.write_text(json.dumps(V2))
    breaking.write_text(json.dumps(BREAKING))
    first = _kf(registry, "registry", "register", subject, str(v1))
    assert first.code == 0, first.err
    second = _kf(registry, "registry", "register", subject, str(v2))
    assert second.code == 0, second.err
    assert "latest version 2" in second.err
    refused = _kf(registry, "registry", "register", subject, str(breaking))
    line = error_line(refused, "KF431", 1)
    assert "409" in line and "'coupon'" in line and "no default" in line
    listed = json.loads(_kf(registry, "registry", "subjects", "--json").out)
    ids = listed[subject]
    assert ids["version"] == 2 and ids["type"] == "AVRO"
    assert subject in _status(registry)["subjects"]
    # The same schema again is the same version; under another subject, the same id.
    again = _kf(registry, "registry", "register", subject, str(v2))
    assert "latest version 2" in again.err
    # NONE lets the breaking change in, for that subject only.
    assert _kf(registry, "registry", "compatibility", "NONE", "--subject", subject).code == 0
    assert _kf(registry, "registry", "register", subject, str(breaking)).code == 0
    # A restart reads the topic: same subjects, versions and ids.
    assert _kf(registry, "registry", "stop").code == 0
    assert _status(registry)["state"] == "stopped"
    restarted = _kf(registry, "registry", "start")
    assert restarted.code == 0, restarted.err
    after = json.loads(_kf(registry, "registry", "subjects", "--json").out)
    assert after[subject] == {"version": 3, "id": after[subject]["id"], "type": "AVRO"}
    assert after[subject]["id"] > ids["id"]
    schema = _kf(registry, "registry", "schema", subject, "--version", "2")
    assert json.loads(schema.out) == V2
    status = _kf(registry, "status")
    assert "registry" in status.out and registry.registry.url in status.out


# -- Avro sources


@dataclass
class Order:
    id: str
    amount: float
    at: kf.EventTime
    region: str | None = None


@dataclass
class WantsCoupon:
    id: str
    at: kf.EventTime
    coupon: str


def _serialized(
    settings: Settings, subject: str, schema: dict[str, Any], rows: list[Any]
) -> list[bytes]:
    """Rows as confluent-kafka's Avro serializer writes them, registering ``schema``
    under ``subject`` in our registry through confluent-kafka's own client."""
    client = SchemaRegistryClient({"url": settings.registry.url})
    serializer = AvroSerializer(
        client,
        json.dumps(schema),
        conf={"auto.register.schemas": True, "subject.name.strategy": lambda *_: subject},
    )
    context = SerializationContext("orders", MessageField.VALUE)
    out = [serializer(row, context) for row in rows]
    assert all(isinstance(b, bytes) for b in out)
    return [b for b in out if b is not None]


def test_an_avro_source_through_kafka(
    registry: Settings, spark: SparkSession, new_topic: Any
) -> None:
    subject = _subject()
    old = _serialized(registry, subject, V1, [{"id": "a", "amount": 2.5, "at": 1_700_000_000_000}])
    new = _serialized(
        registry,
        subject,
        V2,
        [{"id": "b", "amount": 4.0, "at": 1_700_000_001_000, "region": "us"}],
    )
    versions = [_registered(registry, subject, n) for n in (1, 2)]
    assert old[0][0] == 0 and struct.unpack(">I", old[0][1:5])[0] == versions[0].id
    assert struct.unpack(">I", new[0][1:5])[0] == versions[1].id
    unknown = b"\x00" + struct.pack(">I", 99_999) + old[0][5:]
    truncated = new[0][:7]
    # Through the real Kafka: the bytes a job's source reads are the bytes produced.
    topic = new_topic()
    sent = producer(registry.kafka)
    for value in [*old, *new, b'{"id": "json"}', unknown, truncated]:
        sent.produce(topic, value)
    sent.flush(30)
    logged = [m.value() for m in read_records(registry.kafka, topic, start=StartAt(beginning=True))]
    assert logged == [*old, *new, b'{"id": "json"}', unknown, truncated]
    url = registry.registry.url

    def orders(job: kf.Job) -> None:
        job.source("orders", Order, format=kf.avro(subject, url=url), key="id").to(
            kf.topic("decoded")
        )

    out = kf.testing.run(orders, {"orders": [logged]}, spark=spark, name="orders")
    assert out.records("decoded") == [
        {"id": "a", "amount": 2.5, "at": "2023-11-14T22:13:20.000Z", "region": "eu"},
        {"id": "b", "amount": 4.0, "at": "2023-11-14T22:13:21.000Z", "region": "us"},
    ]
    dead = sorted(out.dead_letters, key=lambda d: d["source_offset"])
    assert [d["source_offset"] for d in dead] == [2, 3, 4]
    assert "wire format" in dead[0]["error"]
    assert "schema id 99999 is not a version" in dead[1]["error"]
    assert f"does not decode as Avro with schema id {versions[1].id}" in dead[2]["error"]
    assert [d["value"] for d in dead] == [b'{"id": "json"}', unknown, truncated]

    # Without a record type: the subject's latest schema is the record type.
    def latest(job: kf.Job) -> None:
        job.source("orders", kf.avro(subject, url=url), time="at").select("id", F.col("region")).to(
            kf.topic("plain")
        )

    plain = kf.testing.run(latest, {"orders": [logged[:2]]}, spark=spark, name="latest")
    assert plain.records("plain") == [{"id": "a", "region": "eu"}, {"id": "b", "region": "us"}]


def test_a_record_type_that_cannot_read_the_subject_is_refused(
    registry: Settings, spark: SparkSession
) -> None:
    subject = _subject()
    _serialized(registry, subject, V1, [{"id": "a", "amount": 1.0, "at": 1}])
    url = registry.registry.url

    def coupons(job: kf.Job) -> None:
        job.source("orders", WantsCoupon, format=kf.avro(subject, url=url)).to(kf.topic("x"))

    with pytest.raises(SchemaIncompatibleError) as refused:
        kf.testing.run(coupons, {"orders": [[]]}, spark=spark, name="coupons")
    assert refused.value.code == "KF755"
    assert "'coupon'" in str(refused.value) and "no default" in str(refused.value)


def test_an_avro_sink_that_confluent_clients_read(registry: Settings, spark: SparkSession) -> None:
    source, sink = _subject(), _subject()
    orders = _serialized(
        registry,
        source,
        V2,
        [
            {"id": "a", "amount": 2.5, "at": 1_700_000_000_000, "region": "us"},
            {"id": "b", "amount": 900.0, "at": 1_700_000_001_000, "region": "eu"},
        ],
    )
    url = registry.registry.url

    def big(job: kf.Job) -> None:
        job.source("orders", Order, format=kf.avro(source, url=url), key="id").where(
            F.col("amount") > 100
        ).select("id", "amount", "at").to(kf.topic("big", format=kf.avro(sink, url=url)))

    out = kf.testing.run(big, {"orders": [orders]}, spark=spark, name="big")
    [(key, value)] = out.publisher.topics["big"]
    assert key is not None and json.loads(key) == ["b"]
    registered = _registered(registry, sink, 1)
    assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] == registered.id
    reader = AvroDeserializer(SchemaRegistryClient({"url": url}))
    decoded = reader(value, SerializationContext("big", MessageField.VALUE))
    assert decoded == {
        "id": "b",
        "amount": 900.0,
        "at": datetime(2023, 11, 14, 22, 13, 21, tzinfo=UTC),
    }

    # The job changed to write the amount as text: a breaking change for the subject
    # (BACKWARD), refused at the start, naming the field.
    def as_text(job: kf.Job) -> None:
        job.source("orders", Order, format=kf.avro(source, url=url), key="id").select(
            "id", F.col("amount").cast("string").alias("amount"), "at"
        ).to(kf.topic("big", format=kf.avro(sink, url=url)))

    with pytest.raises(SchemaIncompatibleError) as refused:
        kf.testing.run(as_text, {"orders": [orders]}, spark=spark, name="big")
    assert refused.value.code == "KF755"
    assert "'amount'" in str(refused.value) and "cannot read" in str(refused.value)


def test_a_format_that_cannot_be_used(registry: Settings, spark: SparkSession) -> None:
    with pytest.raises(SchemaFormatError) as bad_name:
        kf.avro("orders/value")
    assert bad_name.value.code == "KF756"
    url = registry.registry.url
    proto, mapped = _subject(), _subject()
    client = _client(registry)
    client.register(proto, 'syntax = "proto3"; message Order { string id = 1; }', "PROTOBUF")
    assert client.version(proto).schema_type == "PROTOBUF"
    with_map = {
        "type": "record",
        "name": "M",
        "fields": [{"name": "tags", "type": {"type": "map", "values": "string"}}],
    }
    client.register(mapped, json.dumps(with_map))
    for subject, said in ((proto, "PROTOBUF schema, not Avro"), (mapped, "'tags'")):

        def build(job: kf.Job, subject: str = subject) -> None:
            job.source("t", kf.avro(subject, url=url), time="at").to(kf.topic("x"))

        with pytest.raises(SchemaFormatError) as refused:
            kf.testing.run(build, {"t": [[]]}, spark=spark)
        assert refused.value.code == "KF756" and said in str(refused.value), str(refused.value)

    def unknown(job: kf.Job) -> None:
        job.source("t", Order, format=kf.avro("no-such-subject", url=url)).to(kf.topic("x"))

    with pytest.raises(RegistryRequestError) as missing:
        kf.testing.run(unknown, {"t": [[]]}, spark=spark)
    assert missing.value.code == "KF431" and "404" in str(missing.value)


def test_start_without_kafka_is_refused(offline: Settings) -> None:
    settings = offline.model_copy(
        update={"registry": offline.registry.model_copy(update={"port": free_port()})}
    )
    result = _kf(settings, "registry", "start")
    line = error_line(result, "KF430", 1)
    assert "does not answer" in line and "nothing was started" in line
    assert _status(settings)["state"] == "stopped"


def _client(settings: Settings) -> RegistryClient:
    return RegistryClient(settings.registry.url)


def _registered(settings: Settings, subject: str, version: int) -> Registered:
    return RegistryClient(settings.registry.url).version(subject, str(version))


# -- Protobuf: the registry's compatibility, sources and sinks

PROTO_V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  string id = 1;
  double amount = 2;
  google.protobuf.Timestamp at = 3;
  enum Status { NEW = 0; PAID = 1; }
  Status status = 4;
  message Line { string sku = 1; int64 qty = 2; }
  repeated Line lines = 5;
  map<string, string> tags = 6;
}
"""
# A field added: compatible.
PROTO_V2 = PROTO_V1.replace(
    "  map<string, string> tags = 6;\n", "  map<string, string> tags = 6;\n  string region = 7;\n"
)
# amount removed and its number reused for a string: old and new data no longer agree.
PROTO_REUSED = PROTO_V1.replace("double amount = 2;", "string coupon = 2;")


def _proto_class(text: str, name: str = "shop.Order") -> Any:
    """The Python message class of ``name`` in ``text``, built at test time (a pool of
    its own, so versions of one file do not clash)."""
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for proto in proto_parse(text).files.file:
        pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def test_protobuf_compatibility_names_the_field() -> None:
    assert proto_check("BACKWARD", PROTO_V2, [PROTO_V1]) == []
    [problem] = proto_check("BACKWARD", PROTO_REUSED, [PROTO_V1])
    assert "'amount' (number 2)" in problem and "'coupon'" in problem
    assert "was double, is string" in problem
    assert proto_check("NONE", PROTO_REUSED, [PROTO_V1]) == []
    # Removing a field alone is compatible; a message removed is not.
    removed = PROTO_V1.replace("  double amount = 2;\n", "")
    assert proto_check("FULL", removed, [PROTO_V1]) == []
    renamed = PROTO_V1.replace("message Line", "message Item").replace("Line lines", "Item lines")
    assert any(
        "message shop.Order.Line was removed" in p
        for p in proto_check("BACKWARD", renamed, [PROTO_V1])
    )
    # int32 and int64 read each other's bytes: compatible.
    widened = PROTO_V1.replace("int64 qty", "int32 qty")
    assert proto_check("BACKWARD", widened, [PROTO_V1]) == []


def test_protobuf_subjects_in_the_registry(registry: Settings) -> None:
    subject, client = _subject(), _client(registry)
    first = client.register(subject, PROTO_V1, "PROTOBUF")
    assert client.register(subject, PROTO_V2, "PROTOBUF") > first
    with pytest.raises(RegistryRequestError) as refused:
        client.register(subject, PROTO_REUSED, "PROTOBUF")
    said = str(refused.value)
    assert ": 409 " in said and "'amount' (number 2)" in said and "string" in said
    with pytest.raises(RegistryRequestError) as invalid:
        client.register(subject, 'syntax = "proto3"; message X { strin id = 1; }', "PROTOBUF")
    assert ": 422 " in str(invalid.value) and '"strin" is not defined' in str(invalid.value)
    # confluent-kafka's clients ask for the descriptor form of a text schema.
    found = SchemaRegistryClient({"url": registry.registry.url}).get_schema(first, fmt="serialized")
    assert found.schema_type == "PROTOBUF"
    assert "shop" in base64.b64decode(found.schema_str or "").decode(errors="replace")


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class Tag:
    key: str
    value: str


@dataclass
class ProtoOrder:
    id: str
    amount: float
    at: kf.EventTime
    status: str
    lines: list[Line]
    tags: list[Tag]
    region: str | None = None


@dataclass
class Mistyped:
    id: int
    at: kf.EventTime
    coupon: str


def _proto_serialized(
    settings: Settings, subject: str, text: str, rows: list[dict[str, Any]]
) -> list[bytes]:
    """Rows as confluent-kafka's Protobuf serializer writes them, registering ``text``
    (as its descriptor, as that client does) under ``subject`` in our registry."""
    cls = _proto_class(text)
    serializer = ProtobufSerializer(
        cls,
        SchemaRegistryClient({"url": settings.registry.url}),
        {"auto.register.schemas": True, "subject.name.strategy": lambda *_: subject},
    )
    context = SerializationContext("orders", MessageField.VALUE)
    out = []
    for row in rows:
        message = cls()
        json_format.ParseDict(row, message)
        out.append(serializer(message, context))
    assert all(isinstance(b, bytes) for b in out)
    return [b for b in out if b is not None]


def test_a_protobuf_source_through_kafka(
    registry: Settings, spark: SparkSession, new_topic: Any
) -> None:
    subject = _subject()
    old = _proto_serialized(
        registry,
        subject,
        PROTO_V1,
        [
            {
                "id": "a",
                "amount": 2.5,
                "at": "2023-11-14T22:13:20Z",
                "status": "PAID",
                "lines": [{"sku": "x", "qty": 2}],
                "tags": {"k": "v"},
            }
        ],
    )
    new = _proto_serialized(
        registry,
        subject,
        PROTO_V2,
        [{"id": "b", "amount": 4.0, "at": "2023-11-14T22:13:21.500Z", "region": "us"}],
    )
    versions = [_registered(registry, subject, n) for n in (1, 2)]
    assert [v.schema_type for v in versions] == ["PROTOBUF", "PROTOBUF"]
    assert old[0][0] == 0 and struct.unpack(">I", old[0][1:5])[0] == versions[0].id
    assert old[0][5] == 0  # message indexes: [0], the first message
    assert struct.unpack(">I", new[0][1:5])[0] == versions[1].id
    unknown = b"\x00" + struct.pack(">I", 99_999) + old[0][5:]
    truncated = old[0][:12]
    topic = new_topic()
    sent = producer(registry.kafka)
    for value in [*old, *new, b'{"id": "json"}', unknown, truncated]:
        sent.produce(topic, value)
    sent.flush(30)
    logged = [m.value() for m in read_records(registry.kafka, topic, start=StartAt(beginning=True))]
    assert logged == [*old, *new, b'{"id": "json"}', unknown, truncated]
    url = registry.registry.url

    def orders(job: kf.Job) -> None:
        job.source("orders", ProtoOrder, format=kf.protobuf(subject, url=url), key="id").to(
            kf.topic("decoded")
        )

    out = kf.testing.run(orders, {"orders": [logged]}, spark=spark, name="orders")
    assert out.records("decoded") == [
        {
            "id": "a",
            "amount": 2.5,
            "at": "2023-11-14T22:13:20.000Z",
            "status": "PAID",
            "lines": [{"sku": "x", "qty": 2}],
            "tags": [{"key": "k", "value": "v"}],
            "region": "",
        },
        {
            "id": "b",
            "amount": 4.0,
            "at": "2023-11-14T22:13:21.500Z",
            "status": "NEW",
            "lines": [],
            "tags": [],
            "region": "us",
        },
    ]
    dead = sorted(out.dead_letters, key=lambda d: d["source_offset"])
    assert [d["source_offset"] for d in dead] == [2, 3, 4]
    assert "wire format" in dead[0]["error"]
    assert "schema id 99999 is not a version" in dead[1]["error"]
    assert f"does not decode as Protobuf with schema id {versions[0].id}" in dead[2]["error"]
    assert [d["value"] for d in dead] == [b'{"id": "json"}', unknown, truncated]

    # Without a record type: the subject's latest message is the record type.
    def latest(job: kf.Job) -> None:
        job.source("orders", kf.protobuf(subject, url=url), time="at").select(
            "id", "status", F.col("region")
        ).to(kf.topic("plain"))

    plain = kf.testing.run(latest, {"orders": [logged[:2]]}, spark=spark, name="latest")
    assert plain.records("plain") == [
        {"id": "a", "status": "PAID", "region": ""},
        {"id": "b", "status": "NEW", "region": "us"},
    ]

    # A record type that cannot read the message: refused at the start, naming fields.
    def mistyped(job: kf.Job) -> None:
        job.source("orders", Mistyped, format=kf.protobuf(subject, url=url)).to(kf.topic("x"))

    with pytest.raises(SchemaIncompatibleError) as refused:
        kf.testing.run(mistyped, {"orders": [[]]}, spark=spark, name="mistyped")
    said = str(refused.value)
    assert refused.value.code == "KF755" and "message shop.Order" in said
    assert "field 'id' is string, which a int cannot read" in said
    assert "field 'coupon' is not in message Order" in said


def test_a_protobuf_sink_that_confluent_clients_read(
    registry: Settings, spark: SparkSession
) -> None:
    source, sink = _subject(), _subject()
    orders = _proto_serialized(
        registry,
        source,
        PROTO_V2,
        [
            {"id": "a", "amount": 2.5, "at": "2023-11-14T22:13:20Z", "region": "us"},
            {"id": "b", "amount": 900.0, "at": "2023-11-14T22:13:21Z", "region": "eu"},
        ],
    )
    url = registry.registry.url

    def big(job: kf.Job) -> None:
        job.source("orders", ProtoOrder, format=kf.protobuf(source, url=url), key="id").where(
            F.col("amount") > 100
        ).select("id", "amount", "at", "lines").to(
            kf.topic("big", format=kf.protobuf(sink, url=url))
        )

    out = kf.testing.run(big, {"orders": [orders]}, spark=spark, name="big")
    [(key, value)] = out.publisher.topics["big"]
    assert key is not None and json.loads(key) == ["b"]
    registered = _registered(registry, sink, 1)
    assert registered.schema_type == "PROTOBUF" and "message big_big" in registered.schema
    assert value[0] == 0 and struct.unpack(">I", value[1:5])[0] == registered.id
    cls = _proto_class(registered.schema, "kappaflow.big_big")
    reader = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    decoded = reader(value, SerializationContext("big", MessageField.VALUE))
    assert decoded.id == "b" and decoded.amount == 900.0
    assert decoded.at.ToDatetime(tzinfo=UTC) == datetime(2023, 11, 14, 22, 13, 21, tzinfo=UTC)
    assert list(decoded.lines) == []

    # The job changed to write the amount as text: its number now holds a string, a
    # breaking change for the subject, refused at the start, naming the field.
    def as_text(job: kf.Job) -> None:
        job.source("orders", ProtoOrder, format=kf.protobuf(source, url=url), key="id").select(
            "id", F.col("amount").cast("string").alias("amount"), "at", "lines"
        ).to(kf.topic("big", format=kf.protobuf(sink, url=url)))

    with pytest.raises(SchemaIncompatibleError) as refused:
        kf.testing.run(as_text, {"orders": [orders]}, spark=spark, name="big")
    assert refused.value.code == "KF755"
    assert "'amount' (number 2)" in str(refused.value) and "was double, is string" in str(
        refused.value
    )


PRODUCT_PROTO = """syntax = "proto3";
package shop;
message Product { string sku = 1; string category = 2; }
"""
# Debezium's change event of a prices table, as its Avro converter writes it.
ENVELOPE = {
    "type": "record",
    "name": "Envelope",
    "namespace": "pg.public.prices",
    "fields": [
        {
            "name": "before",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Value",
                    "fields": [
                        {"name": "sku", "type": "string"},
                        {"name": "list_price", "type": "double"},
                    ],
                },
            ],
            "default": None,
        },
        {"name": "after", "type": ["null", "Value"], "default": None},
        {"name": "op", "type": "string"},
        {"name": "ts_ms", "type": ["null", "long"], "default": None},
    ],
}


@dataclass
class Product:
    sku: str
    category: str


@dataclass
class Price:
    sku: str
    list_price: float


@dataclass
class Sale:
    sku: str
    at: kf.EventTime


def _change(op: str, sku: str, price: float | None) -> dict[str, Any]:
    row = None if price is None else {"sku": sku, "list_price": price}
    before = {"sku": sku, "list_price": 0.0} if op in ("u", "d") else None
    return {"before": before, "after": row, "op": op, "ts_ms": 1_700_000_000_000}


def test_reference_tables_of_registry_records(registry: Settings, spark: SparkSession) -> None:
    """A table of Protobuf records and a change table of Avro envelopes, joined."""
    products, prices = _subject(), _subject()
    cls = _proto_class(PRODUCT_PROTO, "shop.Product")
    serializer = ProtobufSerializer(
        cls,
        SchemaRegistryClient({"url": registry.registry.url}),
        {"auto.register.schemas": True, "subject.name.strategy": lambda *_: products},
    )
    context = SerializationContext("products", MessageField.VALUE)
    rows = [cls(sku="s1", category="tea"), cls(sku="s2", category="cups")]
    catalog = [serializer(row, context) for row in rows]
    broken_product = (catalog[1] or b"")[:-1]
    events = [_change("c", "s1", 4.5), _change("c", "s2", 9.0), _change("u", "s1", 5.0)]
    events.append(_change("d", "s2", None))
    encoded = _serialized(registry, prices, ENVELOPE, events)
    broken_change = encoded[2][:-3]
    keys = ["s1", "s2", "s1", "s2"]
    changes = [kf.testing.Record(v, key=k) for v, k in zip(encoded, keys, strict=True)]
    # An event of s1 that does not decode: a dead letter, not a delete of s1's row.
    changes.append(kf.testing.Record(broken_change, key="s1"))
    url = registry.registry.url

    def priced(job: kf.Job) -> None:
        known = job.table("products", Product, key="sku", format=kf.protobuf(products, url=url))
        price = job.changes("prices", Price, key="sku", format=kf.avro(prices, url=url))
        job.source("sales", Sale).join(known).join(price).to(kf.topic("priced"))

    sales = [json.dumps({"sku": s, "at": 1_700_000_000_000}).encode() for s in ("s1", "s2")]
    out = kf.testing.run(
        priced,
        {"products": [[*catalog, broken_product]], "prices": [changes], "sales": [sales]},
        spark=spark,
        name="priced",
    )
    by_sku = {r["sku"]: r for r in out.records("priced")}
    assert by_sku["s1"]["category"] == "tea" and by_sku["s1"]["list_price"] == 5.0
    assert by_sku["s2"]["category"] == "cups" and by_sku["s2"].get("list_price") is None
    dead = {bytes(d["value"]): d["error"] for d in out.dead_letters}
    assert "does not decode as Protobuf" in dead.pop(broken_product)
    assert "does not decode as Avro" in dead.pop(broken_change)
    assert dead == {}

    # Record types the subjects cannot fill are refused at the start: a table's against
    # its message, a change table's against the envelope's after record.
    def wrong_table(job: kf.Job) -> None:
        job.source("sales", Sale).join(
            job.table("products", Price, key="sku", format=kf.protobuf(products, url=url))
        ).to(kf.topic("x"))

    def wrong_changes(job: kf.Job) -> None:
        job.source("sales", Sale).join(
            job.changes("prices", Product, key="sku", format=kf.avro(prices, url=url))
        ).to(kf.topic("x"))

    # Debezium's envelope as its Protobuf converter registers it.
    envelope = _subject()
    _client(registry).register(
        envelope,
        'syntax = "proto3"; package pg; message Envelope { message Value { string sku = 1; '
        "double list_price = 2; } Value before = 1; Value after = 2; string op = 3; }",
        "PROTOBUF",
    )

    def wrong_envelopes(job: kf.Job) -> None:
        job.source("sales", Sale).join(
            job.changes("prices", Product, key="sku", format=kf.protobuf(envelope, url=url))
        ).to(kf.topic("x"))

    for build, said in (
        (wrong_table, "field 'list_price' is not in message Product"),
        (wrong_changes, "'category'"),
        (wrong_envelopes, "message pg.Envelope.Value): field 'category' is not in message"),
    ):
        with pytest.raises(SchemaIncompatibleError) as refused:
            kf.testing.run(build, {"sales": [[]], "products": [[]], "prices": [[]]}, spark=spark)
        assert said in str(refused.value), str(refused.value)
