"""kappaflow: Kafka as the event log, Spark Structured Streaming as the engine.

A job is a function ``build(job)`` declaring its sources, windowed aggregates and sinks::

    import kappaflow as kf

    def build(job: kf.Job) -> None:
        orders = job.source("orders", Order, key="buyer", id="order_id", watermark="10s")
        revenue = orders.window(tumbling="1m").aggregate(
            "revenue", by="country", total=kf.sum("amount"), buyers=kf.approx_distinct("buyer")
        )
        revenue.to(kf.topic(), kf.store(), kf.lake("revenue"))

The job API's names load on first use, so importing kappaflow (as its command line does)
does not import PySpark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kappaflow.errors import KappaflowError
from kappaflow.settings import Settings, load_settings

if TYPE_CHECKING:
    from kappaflow import testing
    from kappaflow.streams.aggregates import (
        approx_distinct,
        approx_quantiles,
        count,
        max,
        mean,
        min,
        sum,
    )
    from kappaflow.streams.job import Job, Stream, Table, Windowed
    from kappaflow.streams.model import logged_at
    from kappaflow.streams.schema import EventTime
    from kappaflow.streams.sinks import lake, store, topic
    from kappaflow.streams.stateful import StateContext, stateful

__version__ = "0.1.0"

#: Public name → the module that defines it.
_API = {
    "Job": "kappaflow.streams.job",
    "Stream": "kappaflow.streams.job",
    "Windowed": "kappaflow.streams.job",
    "Table": "kappaflow.streams.job",
    "logged_at": "kappaflow.streams.model",
    "EventTime": "kappaflow.streams.schema",
    "count": "kappaflow.streams.aggregates",
    "sum": "kappaflow.streams.aggregates",
    "min": "kappaflow.streams.aggregates",
    "max": "kappaflow.streams.aggregates",
    "mean": "kappaflow.streams.aggregates",
    "approx_distinct": "kappaflow.streams.aggregates",
    "approx_quantiles": "kappaflow.streams.aggregates",
    "topic": "kappaflow.streams.sinks",
    "store": "kappaflow.streams.sinks",
    "lake": "kappaflow.streams.sinks",
    "stateful": "kappaflow.streams.stateful",
    "StateContext": "kappaflow.streams.stateful",
}

__all__ = [
    "EventTime",
    "Job",
    "KappaflowError",
    "Settings",
    "StateContext",
    "Stream",
    "Table",
    "Windowed",
    "__version__",
    "approx_distinct",
    "approx_quantiles",
    "count",
    "lake",
    "load_settings",
    "logged_at",
    "max",
    "mean",
    "min",
    "stateful",
    "store",
    "sum",
    "testing",
    "topic",
]


def __getattr__(name: str) -> Any:
    if name == "testing":
        return importlib.import_module("kappaflow.testing")
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'kappaflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
