"""The cleaning job: devices' raw readings, checked, in canonical units, each once.

Written on the public job API only, as a user would write it. Start it with::

    kappaflow jobs start iot-clean --app kappaflow.iot.clean:build

From ``telemetry.raw`` (``-P source=...``), every reading that parses is checked, and the
first rule it breaks sends it to ``iot-clean.dlq`` with the reason and its original
bytes (records that do not parse go there too):

* its device is not registered: the reading is joined to the device registry, the
  compacted topic ``devices.registry`` (``-P registry=...``) read as a table as it is at
  each micro-batch, and a device without a row there is unknown (a producer that went
  past the gateway, or a device removed);
* its time is more than ``-P max_ahead=`` (default 1d) after, or more than ``-P
  max_behind=`` (default 30d) before, the time it was written to Kafka: a clock that is
  wrong by days or years, whose reading would land in a day of the lake it does not
  belong to. Judged against the record's Kafka timestamp (``kf.logged_at()``), not the
  clock, so a replay of the topic refuses what the live run refused, and no more;
* its metric is one the application does not know, its unit is not its metric's, or
  its value (in the canonical unit) is outside what its sensor can report.

Temperatures in Fahrenheit become Celsius and ratios percent. A
reading sent twice (the same ``id``) passes once: per device, the function ``first_sends``
keeps the ids it passed in the last ``DEDUP_MS`` of event time. Readings go, keyed by
device, to ``telemetry.clean`` (``-P dest=...``) and to the lake table ``telemetry``,
partitioned by metric and by the UTC date of their time.

The watermark trails the newest reading by a minute; readings later than that (a device
whose clock is behind, one that was silent and sends its backlog) still pass, flagged by
nothing but their time: cleaning drops nothing for being late (within ``max_behind`` of
its sending), the windowed jobs downstream judge lateness by their own rules.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

import kappaflow as kf
from kappaflow.iot.registry import REGISTRY_TOPIC, Device
from kappaflow.iot.telemetry import METRICS, READINGS_TOPIC

#: The topic of clean readings, and how long (event time) a device's reading ids are
#: remembered to drop a second send.
CLEAN_TOPIC = "telemetry.clean"
DEDUP_MS = 10 * 60_000
#: How far a reading's time may be after, and before, the time it was written to Kafka:
#: a day ahead covers any clock set to another zone; a month behind, a device that
#: was offline for weeks and sends its backlog.
MAX_AHEAD, MAX_BEHIND = "1d", "30d"
#: How a gap between a reading's time and its logging is worded: in its largest unit.
_SPANS = (("day", 86_400_000), ("hour", 3_600_000), ("minute", 60_000), ("second", 1000))


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
        seen[e.id] = kf.to_epoch_ms(e.time)
        yield Reading(e.device, e.metric, e.value, e.unit, e.time, e.seq, e.id)
    if seen:
        horizon = max(seen.values()) - DEDUP_MS
        ctx.state.ids = {i: t for i, t in seen.items() if t >= horizon}


def canonical_units() -> tuple[Column, Column, Column, Column]:
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


def _span(ms: Column) -> Column:
    """A positive number of milliseconds in whole units of the largest that fits:
    "1826 days", "1 hour", "250 ms"."""

    def whole(unit: str, size: int) -> Column:
        n = F.floor(ms / size)
        plural = F.when(n == 1, F.lit(f" {unit}")).otherwise(F.lit(f" {unit}s"))
        return F.concat(n.cast("string"), plural)

    worded = F.when(ms >= _SPANS[0][1], whole(*_SPANS[0]))
    for unit, size in _SPANS[1:]:
        worded = worded.when(ms >= size, whole(unit, size))
    return worded.otherwise(F.concat(ms.cast("string"), F.lit(" ms")))


def _off(ms: Column, way: str, limit: str) -> Column:
    """Why a reading whose time is ``ms`` ``way`` ("after", "before") its logging is
    refused."""
    stamp = F.date_format(F.col("time"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")
    told = F.lit(f" {way} the reading was logged ({limit})")
    return F.concat(F.lit("time "), stamp, F.lit(" is "), _span(ms), told)


def duration_ms(duration: str) -> int:
    return int(kf.parse_duration(duration) / timedelta(milliseconds=1))


def build(job: kf.Job) -> None:
    raw = job.source(
        job.param("source", READINGS_TOPIC),
        RawReading,
        key="device",
        time="time",
        watermark="1m",
    )
    # Of the registry, the job needs only whether a device has a row: its token digest
    # stays out of the readings, and ``registered`` goes once the rules are checked.
    registry = job.table(job.param("registry", REGISTRY_TOPIC), Device, key="device")
    registered = registry.select("registered")
    known_unit, canonical, canonical_unit, in_range = canonical_units()
    max_ahead = job.param("max_ahead", MAX_AHEAD)
    max_behind = job.param("max_behind", MAX_BEHIND)
    # How far a reading's time is after it was written to Kafka (negative: before).
    ahead = F.unix_millis(F.col("time")) - F.unix_millis(kf.logged_at())
    metric = F.col("metric")
    # The first rule a reading breaks, worded; one reject for all of them, since each
    # reject reads the source once more per micro-batch.
    broken = (
        F.when(
            F.col("registered").isNull(),
            F.concat(F.lit("unknown device '"), F.col("device"), F.lit("'")),
        )
        .when(ahead > duration_ms(max_ahead), _off(ahead, "after", f"at most {max_ahead} ahead"))
        .when(
            -ahead > duration_ms(max_behind), _off(-ahead, "before", f"at most {max_behind} behind")
        )
        .when(
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
    checked = (
        raw.join(registered, on="device", how="left")
        .reject(broken.isNotNull(), broken)
        .select(*[f.name for f in fields(RawReading)])
    )
    clean = (
        checked.with_column("value", F.round(canonical, 3))
        .with_column("unit", canonical_unit)
        .process(first_sends, by="device", name="clean")
    )
    clean.to(
        kf.topic(job.param("dest", CLEAN_TOPIC)),
        kf.lake("telemetry", partition_by="metric", by_date="time"),
    )
