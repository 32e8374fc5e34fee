"""kappaflow: Kafka as the event log, Spark Structured Streaming as the engine.

A job is a function ``build(job)`` declaring its sources, windowed aggregates and sinks::

    import kappaflow as kf

    def build(job: kf.Job) -> None:
        orders = job.source("orders", Order, key="buyer", id="order_id", watermark="10s")
        revenue = orders.window(tumbling="1m").aggregate(
            "revenue", by="country", total=kf.sum("amount"), buyers=kf.approx_distinct("buyer")
        )
        revenue.to(kf.topic(), kf.store(), kf.lake("revenue"))

The public API is what this module exports (``__all__``), ``kappaflow.testing`` (``kf.testing``)
and, for pipelines written against Spark directly, ``kappaflow.jobs.pipeline`` (``Pipeline``,
``Part``, ``JobContext``). Every other module is internal and may change between versions.

The names load on first use, so importing kappaflow (as its command line does) does not
import PySpark.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kappaflow import testing as testing
    from kappaflow.errors import InvalidParameterError as InvalidParameterError
    from kappaflow.errors import KappaflowError as KappaflowError
    from kappaflow.settings import Settings as Settings
    from kappaflow.settings import load_settings as load_settings
    from kappaflow.streams.aggregates import approx_distinct as approx_distinct
    from kappaflow.streams.aggregates import approx_quantiles as approx_quantiles
    from kappaflow.streams.aggregates import count as count
    from kappaflow.streams.aggregates import max as max
    from kappaflow.streams.aggregates import mean as mean
    from kappaflow.streams.aggregates import min as min
    from kappaflow.streams.aggregates import sum as sum
    from kappaflow.streams.formats import avro as avro
    from kappaflow.streams.formats import protobuf as protobuf
    from kappaflow.streams.job import Job as Job
    from kappaflow.streams.job import Stream as Stream
    from kappaflow.streams.job import Table as Table
    from kappaflow.streams.job import Windowed as Windowed
    from kappaflow.streams.joins import Reference as Reference
    from kappaflow.streams.model import logged_at as logged_at
    from kappaflow.streams.schema import EventTime as EventTime
    from kappaflow.streams.sinks import lake as lake
    from kappaflow.streams.sinks import postgres as postgres
    from kappaflow.streams.sinks import store as store
    from kappaflow.streams.sinks import topic as topic
    from kappaflow.streams.stateful import StateContext as StateContext
    from kappaflow.streams.stateful import StatefulFunction as StatefulFunction
    from kappaflow.streams.stateful import stateful as stateful
    from kappaflow.timeutil import from_epoch_ms as from_epoch_ms
    from kappaflow.timeutil import parse_duration as parse_duration
    from kappaflow.timeutil import to_epoch_ms as to_epoch_ms

#: The public names, each with the module that defines it: the one list of them (the
#: imports above only tell type checkers the same; tests/test_public_api.py holds the two
#: together).
_API = {
    # Declaring a job.
    "Job": "kappaflow.streams.job",
    "Stream": "kappaflow.streams.job",
    "Windowed": "kappaflow.streams.job",
    "Table": "kappaflow.streams.job",
    "Reference": "kappaflow.streams.joins",
    "EventTime": "kappaflow.streams.schema",
    "logged_at": "kappaflow.streams.model",
    # Source formats besides JSON (docs/registry.md).
    "avro": "kappaflow.streams.formats",
    "protobuf": "kappaflow.streams.formats",
    # Aggregates.
    "count": "kappaflow.streams.aggregates",
    "sum": "kappaflow.streams.aggregates",
    "min": "kappaflow.streams.aggregates",
    "max": "kappaflow.streams.aggregates",
    "mean": "kappaflow.streams.aggregates",
    "approx_distinct": "kappaflow.streams.aggregates",
    "approx_quantiles": "kappaflow.streams.aggregates",
    # Sinks.
    "topic": "kappaflow.streams.sinks",
    "store": "kappaflow.streams.sinks",
    "lake": "kappaflow.streams.sinks",
    "postgres": "kappaflow.streams.sinks",
    # Stateful functions.
    "stateful": "kappaflow.streams.stateful",
    "StatefulFunction": "kappaflow.streams.stateful",
    "StateContext": "kappaflow.streams.stateful",
    # Time, as events and parameters give it.
    "to_epoch_ms": "kappaflow.timeutil",
    "from_epoch_ms": "kappaflow.timeutil",
    "parse_duration": "kappaflow.timeutil",
    # Errors a job raises or catches.
    "KappaflowError": "kappaflow.errors",
    "InvalidParameterError": "kappaflow.errors",
    # The platform's settings.
    "Settings": "kappaflow.settings",
    "load_settings": "kappaflow.settings",
}

try:
    __version__ = version("kappaflow")
except PackageNotFoundError:  # run from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = ["__version__", "testing", *_API]


def __getattr__(name: str) -> Any:
    if name == "testing":
        return importlib.import_module("kappaflow.testing")
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'kappaflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
