"""The nested order record type that the schema and parsing tests compile and parse."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from kappaflow.streams.schema import EventTime


@dataclass
class Address:
    zip: str
    city: str | None = None


@dataclass
class Customer:
    id: int
    address: Address
    vip: Optional[bool]  # noqa: UP045 (the spelling users may write)


@dataclass
class Item:
    sku: str
    qty: int
    price: float
    tags: list[str] | None = None


@dataclass
class Order:
    id: str
    at: EventTime
    customer: Customer
    items: list[Item]
    total: float
    paid: bool
    created: datetime | None = None
    note: str | None = None
    region: str | None = None  # optional in the schema, but the parsing tests' key: required
