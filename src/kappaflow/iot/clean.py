"""The cleaning job: devices' raw readings, checked, in canonical units, each once.

Written on the public job API only, as a user would write it. Start it with::

    kappaflow jobs start iot-clean --app kappaflow.iot.clean:build

From ``telemetry.raw`` (``-P source=...``), every reading that parses is checked: a metric
the application does not know, a unit that is not its metric's, or a value outside what
its sensor can report goes to ``iot-clean.dlq`` with the reason (records that do not
parse go there too). Temperatures in Fahrenheit become Celsius and ratios percent. A
reading sent twice (the same ``id``) passes once: per device, the function ``first_sends``
keeps the ids it passed in the last ``DEDUP_MS`` of event time. Readings go, keyed by
device, to ``telemetry.clean`` (``-P dest=...``) and to the lake table ``telemetry``,
partitioned by metric and by the UTC date of their time.

The watermark trails the newest reading by a minute; readings later than that (a device
whose clock is behind, one that was silent and sends its backlog) still pass, flagged by
nothing but their time: cleaning drops nothing for being late, the windowed jobs
downstream judge lateness by their own rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.iot.telemetry import METRICS, READINGS_TOPIC
from kappaflow.timeutil import to_epoch_ms

#: The topic of clean readings, and how long (event time) a device's reading ids are
#: remembered to drop a second send.
CLEAN_TOPIC = "telemetry.clean"
DEDUP_MS = 10 * 60_000


@dataclass
class RawReading:
    device: str
    metric: str
    value: float
    unit: str
    time: kf.EventTime
    seq: int
    id: str


#: A reading of ``telemetry.clean`` as the jobs that read it declare it: the fields of a
#: raw reading, with the value in its metric's canonical unit.
CleanReading = RawReading


@dataclass
class Reading:
    device: str
    metric: str
    value: float
    unit: str
    time: datetime
    seq: int
    id: str


@dataclass
class Sent:
    #: The ids of the device's readings passed, with their event times (epoch ms).
    ids: dict[str, int] = field(default_factory=dict)


@kf.stateful(state=Sent, output=Reading, ttl="1h", late="function")
def first_sends(
    key: tuple[Any, ...], events: list[RawReading], ctx: kf.StateContext[Sent]
) -> Iterator[Reading]:
    seen = ctx.state.ids
    for e in events:
        if e.id in seen:
            continue
        seen[e.id] = to_epoch_ms(e.time)
        yield Reading(e.device, e.metric, e.value, e.unit, e.time, e.seq, e.id)
    if seen:
        horizon = max(seen.values()) - DEDUP_MS
        ctx.state.ids = {i: t for i, t in seen.items() if t >= horizon}


def _units() -> tuple[Column, Column, Column, Column]:
    """Per metric: whether a reading's unit is its metric's, the value in the canonical
    unit, the canonical unit, and whether that value is in the sensor's range."""
    metric, unit, value = F.col("metric"), F.col("unit"), F.col("value")
    known_unit = F.lit(False)
    canonical_unit = F.lit(None).cast("string")
    in_range = F.lit(False)
    for m in METRICS:
        units = [m.unit, *([m.imperial_unit] if m.imperial_unit else [])]
        known_unit = F.when(metric == m.name, unit.isin(units)).otherwise(known_unit)
        canonical_unit = F.when(metric == m.name, F.lit(m.unit)).otherwise(canonical_unit)
    canonical = (
        F.when(unit == "fahrenheit", (value - 32.0) * 5.0 / 9.0)
        .when(unit == "ratio", value * 100.0)
        .otherwise(value)
    )
    for m in METRICS:
        fits = canonical.between(m.low, m.high)
        in_range = F.when(metric == m.name, fits).otherwise(in_range)
    return known_unit, canonical, canonical_unit, in_range


def build(job: kf.Job) -> None:
    raw = job.source(
        job.param("source", READINGS_TOPIC),
        RawReading,
        key="device",
        time="time",
        watermark="1m",
    )
    known_unit, canonical, canonical_unit, in_range = _units()
    metric = F.col("metric")
    # The first rule a reading breaks, worded; one reject for all three, since each
    # reject reads the source once more per micro-batch.
    broken = (
        F.when(
            ~metric.isin([m.name for m in METRICS]),
            F.concat(F.lit("unknown metric '"), metric, F.lit("'")),
        )
        .when(
            ~known_unit,
            F.concat(
                F.lit("unit '"),
                F.col("unit"),
                F.lit("' is not one of metric '"),
                metric,
                F.lit("'"),
            ),
        )
        .when(
            ~in_range,
            F.concat(
                F.lit("value "),
                F.col("value").cast("string"),
                F.lit(" is outside the range of metric '"),
                metric,
                F.lit("'"),
            ),
        )
    )
    checked = raw.reject(broken.isNotNull(), broken)
    clean = (
        checked.with_column("value", F.round(canonical, 3))
        .with_column("unit", canonical_unit)
        .process(first_sends, by="device", name="clean")
    )
    clean.to(
        kf.topic(job.param("dest", CLEAN_TOPIC)),
        kf.lake("telemetry", partition_by="metric", by_date="time"),
    )
