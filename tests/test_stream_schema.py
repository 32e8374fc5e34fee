"""Record types compile to a Spark schema, or fail with the code of what is wrong."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest
from order_records import Address, Order
from pydantic import BaseModel
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kappaflow.errors import StreamError
from kappaflow.streams.schema import EventTime, compile_schema


class PAddress(BaseModel):
    zip: str
    city: str | None = None


class PCustomer(BaseModel):
    id: int
    address: PAddress
    vip: bool | None


class PItem(BaseModel):
    sku: str
    qty: int
    price: float
    tags: list[str] | None = None


class POrder(BaseModel):
    id: str
    at: EventTime
    customer: PCustomer
    items: list[PItem]
    total: float
    paid: bool
    created: datetime | None = None
    note: str | None = None
    region: str | None = None


def s(*fields: tuple[str, Any]) -> StructType:
    return StructType([StructField(name, tp, True) for name, tp in fields])


ORDER_STRUCT = s(
    ("id", StringType()),
    ("at", TimestampType()),
    (
        "customer",
        s(
            ("id", LongType()),
            ("address", s(("zip", StringType()), ("city", StringType()))),
            ("vip", BooleanType()),
        ),
    ),
    (
        "items",
        ArrayType(
            s(
                ("sku", StringType()),
                ("qty", LongType()),
                ("price", DoubleType()),
                ("tags", ArrayType(StringType())),
            )
        ),
    ),
    ("total", DoubleType()),
    ("paid", BooleanType()),
    ("created", TimestampType()),
    ("note", StringType()),
    ("region", StringType()),
)


@pytest.mark.parametrize("model", [Order, POrder], ids=["dataclass", "pydantic"])
def test_a_nested_model_compiles_to_its_struct_with_required_and_optional_fields(
    model: type,
) -> None:
    schema = compile_schema(model)
    assert schema.name == model.__name__
    assert schema.struct == ORDER_STRUCT
    assert schema.event_time == "at"
    optional = {f.name for f in schema.fields if f.optional}
    assert optional == {"created", "note", "region"}
    assert schema.field("customer.vip").optional
    assert not schema.field("customer.address.zip").optional
    assert schema.field("customer.address.city").optional
    items = schema.field("items")
    assert items.kind == "array" and items.element is not None
    assert [(f.name, f.kind, f.optional) for f in items.element.fields] == [
        ("sku", "str", False),
        ("qty", "int", False),
        ("price", "float", False),
        ("tags", "array", True),
    ]
    assert schema.field("at").kind == "event_time"
    assert schema.field("created").kind == "timestamp"


def test_a_model_without_event_time_has_none() -> None:
    assert compile_schema(Address).event_time is None


def test_field_names_the_missing_part_and_the_fields_it_could_be() -> None:
    schema = compile_schema(Order)
    with pytest.raises(StreamError) as caught:
        schema.field("customer.adress.zip")
    assert caught.value.code == "KF705"
    assert str(caught.value) == (
        "Order.customer has no field 'adress' (in 'customer.adress.zip'; fields: id, address, vip)"
    )
    with pytest.raises(LookupError, match="Order has no field 'x'"):
        schema.field("x")


# Models that do not compile. Defined at module level: annotations are strings here
# (from __future__ import annotations) and resolve in the module's namespace.


@dataclass
class WithDict:
    tags: dict[str, int]


@dataclass
class WithSet:
    tags: set[str]


@dataclass
class WithTuple:
    pair: tuple[int, int]


@dataclass
class WithAny:
    blob: Any


@dataclass
class WithUnion:
    id: str | bool


@dataclass
class WithBareList:
    items: list  # type: ignore[type-arg]


@dataclass
class Loop:
    next: Loop | None = None


class PWithDict(BaseModel):
    tags: dict[str, str]


@dataclass
class TwoTimes:
    at: EventTime
    seen: EventTime


@dataclass
class Inner:
    at: EventTime


@dataclass
class NestedTime:
    inner: Inner


@dataclass
class ListOfTimes:
    times: list[EventTime]


@dataclass
class Unresolved:
    id: int
    thing: Nowhere  # type: ignore[name-defined]  # noqa: F821 (the point of the test)


@pytest.mark.parametrize(
    ("model", "code", "message"),
    [
        (WithDict, "KF701", "WithDict.tags: type dict[str, int] is not supported"),
        (WithSet, "KF701", "WithSet.tags: type set[str] is not supported"),
        (WithTuple, "KF701", "WithTuple.pair: type tuple[int, int] is not supported"),
        (WithAny, "KF701", "WithAny.blob: type Any is not supported"),
        (WithUnion, "KF701", "WithUnion.id: type str | bool (a union other than T | None)"),
        (WithBareList, "KF701", "WithBareList.items: type list (a list without its element"),
        (Loop, "KF701", "Loop.next: type Loop (a recursive record type)"),
        (PWithDict, "KF701", "PWithDict.tags: type dict[str, str] is not supported"),
        (dict, "KF702", "<class 'dict'> is not a dataclass or pydantic model class"),
        (TwoTimes, "KF703", "TwoTimes has 2 EventTime fields (at, seen)"),
        (NestedTime, "KF703", "Inner.at: EventTime is for a top-level field"),
        (ListOfTimes, "KF703", "ListOfTimes.times[]: EventTime is for a top-level field"),
        (Unresolved, "KF704", "Unresolved.thing: annotation 'Nowhere' does not resolve"),
    ],
    ids=lambda p: p.__name__ if isinstance(p, type) else None,
)
def test_an_unsupported_model_fails_naming_model_field_and_annotation(
    model: type, code: str, message: str
) -> None:
    with pytest.raises(StreamError) as caught:
        compile_schema(model)
    assert caught.value.code == code
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_instance_is_not_a_model() -> None:
    with pytest.raises(TypeError, match="is not a dataclass or pydantic model class"):
        compile_schema(
            Address("1")  # type: ignore[arg-type]
        )


def test_a_default_of_none_makes_a_field_optional() -> None:
    @dataclass
    class Defaults:
        a: int = dataclasses.field(default=None)  # type: ignore[assignment]

    assert compile_schema(Defaults).fields[0].optional


def test_a_string_or_number_union_is_text() -> None:
    @dataclass
    class Keyed:
        store: str | int
        code: float | str | None
        both: str | int | float

    fields = {f.name: (f.kind, f.optional) for f in compile_schema(Keyed).fields}
    assert fields == {
        "store": ("text", False),
        "code": ("text", True),
        "both": ("text", False),
    }
    assert compile_schema(Keyed).struct["store"].dataType == StringType()
