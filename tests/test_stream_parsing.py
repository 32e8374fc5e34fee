"""Kafka records parse into typed rows, or carry the reason they do not fit the schema.

Each group of cases runs as one DataFrame and one collect, to keep Spark actions few.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from order_records import Order
from pydantic import BaseModel
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import LongType, StringType, TimestampType

from kappaflow.errors import StreamError
from kappaflow.streams.ops import parsing
from kappaflow.streams.ops.parsing import parse_records
from kappaflow.streams.schema import EventTime, RecordSchema, compile_schema

RAW = "key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP"
KAFKA_TS = datetime(2024, 1, 1, tzinfo=UTC)


GOOD: dict[str, Any] = {
    "id": "o-1",
    "at": 1700000000123,
    "customer": {"id": 7, "address": {"zip": "02139", "city": "Cambridge"}, "vip": True},
    "items": [
        {"sku": "a", "qty": 2, "price": 1.5, "tags": ["x"]},
        {"sku": "b", "qty": 1, "price": 3},
    ],
    "total": 6,
    "paid": False,
    "created": "2024-01-02T03:04:05.250+01:00",
    "region": "eu",
}


def raw_frame(spark: SparkSession, values: Sequence[bytes | None]) -> DataFrame:
    rows = [(b"k", v, "orders", 0, n, KAFKA_TS) for n, v in enumerate(values)]
    return spark.createDataFrame(rows, RAW)


def parse(spark: SparkSession, values: Sequence[bytes | None], schema: RecordSchema) -> list[Row]:
    raw = raw_frame(spark, values)
    rows = parse_records(raw, schema, time="at", keys=["region"], id="id").collect()
    return sorted(rows, key=lambda r: r["_kf_offset"])


def changed(path: str, value: Any = ..., base: dict[str, Any] = GOOD) -> bytes:
    """GOOD with the field at ``path`` (dots; [n] for items) set to ``value`` (... deletes)."""
    record = copy.deepcopy(base)
    *parents, last = path.replace("[", ".").replace("]", "").split(".")
    target: Any = record
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    if value is ...:
        del target[int(last) if last.isdigit() else last]
    else:
        target[int(last) if last.isdigit() else last] = value
    return json.dumps(record).encode()


def test_output_columns_and_types(spark: SparkSession) -> None:
    schema = compile_schema(Order)
    out = parse_records(raw_frame(spark, []), schema, time="at", keys=["region"], id="id")
    assert out.columns == [
        *schema.struct.fieldNames(),
        "_kf_time",
        "_kf_reason",
        "_kf_value",
        "_kf_topic",
        "_kf_partition",
        "_kf_offset",
        "_kf_logged",
    ]
    types = {f.name: f.dataType for f in out.schema.fields}
    assert all(types[f.name] == f.dataType for f in schema.struct.fields)
    assert types["_kf_time"] == LongType() and types["_kf_reason"] == StringType()
    assert types["_kf_logged"] == TimestampType()


BAD: list[tuple[bytes | None, str]] = [
    (None, "empty record"),
    (b"", "empty record"),
    (b"{not json", "not valid JSON"),
    (b'{"id": "a", "id": "b"}', "not valid JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'"text"', "not a JSON object"),
    (changed("id", ...), "missing field 'id'"),
    (changed("id", None), "field 'id' is null"),
    (changed("id", 5), "field 'id' is not a string"),
    (changed("id", {"a": 1}), "field 'id' is not a string"),
    (changed("paid", "false"), "field 'paid' is not a boolean"),
    (changed("total", "6"), "field 'total' is not a number"),
    (changed("total", "NaN"), "field 'total' is not a number"),
    (changed("customer.id", 1.5), "field 'customer.id' is not an integer"),
    (changed("customer.id", 2**63), "field 'customer.id' is not an integer"),
    (changed("customer.id", "7"), "field 'customer.id' is not an integer"),
    (changed("customer.address", ...), "missing field 'customer.address'"),
    (changed("customer.address.zip", 2139), "field 'customer.address.zip' is not a string"),
    (changed("customer.address.zip", None), "field 'customer.address.zip' is null"),
    (changed("customer.address.city", 3), "field 'customer.address.city' is not a string"),
    (changed("customer.vip", "yes"), "field 'customer.vip' is not a boolean"),
    (changed("customer", []), "field 'customer' is not an object"),
    (changed("items", {"sku": "a"}), "field 'items' is not an array"),
    (changed("items[1].sku", ...), "missing field 'items[1].sku'"),
    (changed("items[1].sku", True), "field 'items[1].sku' is not a string"),
    (changed("items[0].qty", 2.5), "field 'items[0].qty' is not an integer"),
    (changed("items[1].tags", ["a", 1]), "field 'items[1].tags[1]' is not a string"),
    (changed("items[1].tags", ["a", None]), "field 'items[1].tags[1]' is null"),
    (changed("items[1]", None), "field 'items[1]' is null"),
    (changed("items[0]", 5), "field 'items[0]' is not an object"),
    (
        changed("created", 1700000000000),
        "field 'created' is not a timestamp (ISO-8601 with a zone)",
    ),
    (
        changed("created", "2024-01-02T03:04:05"),
        "field 'created' is not a timestamp (ISO-8601 with a zone)",
    ),
    (changed("at", ...), "missing time field 'at'"),
    (changed("at", None), "missing time field 'at'"),
    (changed("at", 1.5), "time field 'at' is not epoch milliseconds or ISO-8601 with a zone"),
    (changed("at", "soon"), "time field 'at' is not epoch milliseconds or ISO-8601 with a zone"),
    (
        changed("at", "2024-02-30T00:00:00Z"),
        "time field 'at' is not epoch milliseconds or ISO-8601 with a zone",
    ),
    (changed("at", True), "time field 'at' is not epoch milliseconds or ISO-8601 with a zone"),
    (changed("region", ...), "missing key field 'region'"),
    (changed("region", None), "missing key field 'region'"),
    (changed("region", 5), "key field 'region' is not a string"),
]


@pytest.fixture(scope="module")
def bad_rows(spark: SparkSession) -> list[Row]:
    return parse(spark, [value for value, _ in BAD], compile_schema(Order))


@pytest.mark.parametrize(("index", "reason"), [(i, r) for i, (_, r) in enumerate(BAD)])
def test_a_bad_record_carries_the_reason_and_its_source(
    bad_rows: list[Row], index: int, reason: str
) -> None:
    row = bad_rows[index]
    assert row["_kf_reason"] == reason, BAD[index][0]
    assert row["_kf_value"] == BAD[index][0] or (row["_kf_value"] is None and index == 0)
    assert (row["_kf_topic"], row["_kf_partition"], row["_kf_offset"]) == ("orders", 0, index)
    assert all(row[name] is None for name in (*GOOD, "_kf_time"))


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


GOOD_CASES: list[tuple[bytes, dict[str, Any]]] = [
    (json.dumps(GOOD).encode(), {"_kf_time": 1700000000123}),
    (changed("at", "1700000000123"), {"_kf_time": 1700000000123}),
    (changed("at", "2024-01-02T03:04:05Z"), {"_kf_time": ms("2024-01-02T03:04:05+00:00")}),
    (changed("at", "2024-01-02T03:04:05.5+01:00"), {"_kf_time": ms("2024-01-02T02:04:05.5+00:00")}),
    (changed("at", "2024-01-02T03:04:05-0130"), {"_kf_time": ms("2024-01-02T04:34:05+00:00")}),
    (changed("at", "2024-01-02T03:04:05+02"), {"_kf_time": ms("2024-01-02T01:04:05+00:00")}),
    # Strings that look like numbers or JSON go the slow way, and are good.
    (changed("id", "12345"), {"id": "12345"}),
    (changed("id", "true"), {"id": "true"}),
    (changed("id", "[x"), {"id": "[x"}),
    # Optional fields missing or null; extra fields ignored; the id may be null? No: id
    # is required by the schema here; optional ones below.
    (changed("created", ...), {"created": None}),
    (
        changed("customer.vip", None),
        {"customer": Row(id=7, address=Row(zip="02139", city="Cambridge"), vip=None)},
    ),
    (changed("items[0].tags", ...), {}),
    (changed("customer.address.city", None), {}),
    (changed("items[1].tags", ["a", "1"]), {}),
    (changed("extra", {"deep": [1, {"x": None}]}), {}),
    (changed("items", []), {"items": []}),
]


@pytest.fixture(scope="module")
def good_rows(spark: SparkSession) -> list[Row]:
    return parse(spark, [value for value, _ in GOOD_CASES], compile_schema(Order))


def test_a_good_record_parses_to_typed_values(good_rows: list[Row]) -> None:
    row = good_rows[0]
    assert row["_kf_reason"] is None
    assert row["id"] == "o-1"
    assert row["at"].astimezone(UTC) == datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)
    assert row["customer"] == Row(id=7, address=Row(zip="02139", city="Cambridge"), vip=True)
    assert row["items"] == [
        Row(sku="a", qty=2, price=1.5, tags=["x"]),
        Row(sku="b", qty=1, price=3.0, tags=None),
    ]
    assert (row["total"], row["paid"], row["region"]) == (6.0, False, "eu")
    assert row["created"].astimezone(UTC) == datetime(2024, 1, 2, 2, 4, 5, 250000, tzinfo=UTC)
    assert isinstance(row["total"], float)
    assert row["_kf_logged"].astimezone(UTC) == KAFKA_TS


@pytest.mark.parametrize("index", range(len(GOOD_CASES)))
def test_good_variants_parse(good_rows: list[Row], index: int) -> None:
    row = good_rows[index]
    assert row["_kf_reason"] is None, GOOD_CASES[index][0]
    for name, value in GOOD_CASES[index][1].items():
        assert row[name] == value
    assert row["at"].astimezone(UTC).timestamp() * 1000 == pytest.approx(row["_kf_time"])


class Reading(BaseModel):
    sensor: str
    at: EventTime
    value: float
    ok: bool | None = None
    unit: str = None  # type: ignore[assignment]  # a default of None: optional


def test_a_pydantic_model_parses_too(spark: SparkSession) -> None:
    schema = compile_schema(Reading)
    values = [
        b'{"sensor": "s1", "at": "2024-01-01T00:00:00Z", "value": 2}',
        b'{"sensor": "s1", "at": 1700000000000, "value": 2.5, "ok": "yes"}',
        b'{"at": 1700000000000, "value": 1}',
    ]
    out = parse_records(raw_frame(spark, values), schema, time="at", keys=["sensor"])
    rows = sorted(out.collect(), key=lambda r: r["_kf_offset"])
    assert [r["_kf_reason"] for r in rows] == [
        None,
        "field 'ok' is not a boolean",
        "missing key field 'sensor'",
    ]
    assert (rows[0]["sensor"], rows[0]["value"], rows[0]["ok"]) == ("s1", 2.0, None)
    assert rows[0]["_kf_time"] == ms("2024-01-01T00:00:00+00:00")


@pytest.mark.parametrize(
    ("arguments", "code", "message"),
    [
        ({"time": "total"}, "KF706", "time field 'total' of Order is float, not datetime"),
        ({"time": "when"}, "KF705", "Order has no field 'when'"),
        ({"time": "at", "keys": ["customer.name"]}, "KF705", "Order.customer has no field 'name'"),
        ({"time": "at", "id": "items.sku"}, "KF705", "Order.items has no field 'sku'"),
    ],
)
def test_arguments_naming_no_usable_field_fail(
    spark: SparkSession, arguments: dict[str, Any], code: str, message: str
) -> None:
    with pytest.raises(StreamError) as caught:
        parse_records(raw_frame(spark, []), compile_schema(Order), **arguments)
    assert caught.value.code == code
    assert message in str(caught.value)


def test_the_fast_path_settles_every_good_record_and_no_bad_one(spark: SparkSession) -> None:
    # Performance rests on good records never reaching the variant verdict; correctness
    # on no bad record being settled (its mismatch would pass as a silent null).
    values = [value for value, _ in GOOD_CASES] + [value for value, _ in BAD]
    nodes = parsing._nodes(compile_schema(Order), time="at", keys=["region"], id="id")
    rows = parsing._fast_path(raw_frame(spark, values), nodes).select("offset", "_kf_settled")
    settled = [r["_kf_settled"] for r in sorted(rows.collect())]
    assert settled == [True] * len(GOOD_CASES) + [False] * len(BAD)


@dataclass
class Visit:
    page: str | int
    at: EventTime
    ref: str | float | None = None


def test_a_text_field_takes_a_string_or_a_number_as_text(spark: SparkSession) -> None:
    values = [
        b'{"page": "/a", "at": 1, "ref": 4.50}',
        b'{"page": 42, "at": 1, "ref": null}',
        b'{"page": 1e3, "at": 1}',
        b'{"page": "[x", "at": 1, "ref": "true"}',
        b'{"page": true, "at": 1}',
        b'{"page": {"x": 1}, "at": 1}',
        b'{"page": 7, "at": 1, "ref": [1]}',
        b'{"at": 1}',
    ]
    raw = raw_frame(spark, values)
    schema = compile_schema(Visit)
    rows = sorted(
        parse_records(raw, schema, time="at", keys=["page"]).collect(),
        key=lambda r: r["_kf_offset"],
    )
    assert [(r["page"], r["ref"], r["_kf_reason"]) for r in rows] == [
        ("/a", "4.5", None),
        ("42", None, None),
        ("1000.0", None, None),
        ("[x", "true", None),
        (None, None, "key field 'page' is not a string or a number"),
        (None, None, "key field 'page' is not a string or a number"),
        (None, None, "field 'ref' is not a string or a number"),
        (None, None, "missing key field 'page'"),
    ]
    nodes = parsing._nodes(schema, time="at", keys=["page"], id=None)
    settled = parsing._fast_path(raw, nodes).select("offset", "_kf_settled").collect()
    assert [r["_kf_settled"] for r in sorted(settled)] == [True] * 3 + [False] * 5
