"""Sales priced from a PostgreSQL table, as its rows change: change data capture.

The table ``products (sku text PRIMARY KEY, name text, price numeric)`` is captured by a
Debezium connector into the topic ``shop.public.products`` (``-P products=...`` names
another); each sale (JSON objects on ``sales``: ``{"sale_id", "sku", "at"}``) is joined
with its product's row as the table's changes had reached Kafka when the sale was
processed, a deleted product leaving the sale without a name and price. Run it from this
folder::

    kappaflow postgres start && kappaflow connect start
    psql postgresql://kappaflow@127.0.0.1:15432/kappaflow \\
        -c "CREATE TABLE products (sku text PRIMARY KEY, name text, price numeric)"
    kappaflow connect create shop --tables products
    kappaflow jobs start priced-sales --app priced_sales:build
"""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Sale:
    sale_id: str
    sku: str
    at: kf.EventTime


@dataclass
class Product:
    sku: str
    name: str
    #: PostgreSQL's numeric, as Debezium writes it with decimal.handling.mode=string.
    price: str


def build(job: kf.Job) -> None:
    products = job.changes(job.param("products", "shop.public.products"), Product, key="sku")
    sales = job.source(job.param("sales", "sales"), Sale, key="sku", id="sale_id")
    sales.join(products, how="left").to(kf.topic(job.param("priced", "priced")))
