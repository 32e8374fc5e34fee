"""Overheating alarms per device: three hot readings within a minute raise one alert per
incident; a cool reading, or five minutes without data, resolves it.

Readings are JSON objects on the topic ``readings`` (``-P topic=...`` names another)::

    {"device": "boiler-1", "temperature": 84.5, "at": "2026-11-23T10:00:03Z"}

Per device, a stateful function keeps the times of its recent readings above the limit
(80 degrees), whether an alert is open, and when the device last sent data. Three
readings above the limit within a minute raise an alert; more hot readings raise no
other until it is resolved, by a reading at or below the limit or by five minutes of
event time without data (an event-time timer). A device silent for an hour is forgotten.
Readings behind the watermark (10 s behind the latest) go to the job's late topic.
Run it with ``kappaflow jobs start alarm --app alarm:build`` from this folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kappaflow as kf

LIMIT = 80.0
WITHIN_MS = 60_000
SILENCE_MS = 5 * 60_000


@dataclass
class Reading:
    device: str
    temperature: float
    at: kf.EventTime


@dataclass
class Alert:
    device: str
    kind: str  # "raised" or "resolved"
    reason: str
    at: datetime


@dataclass
class Watch:
    #: Event times (epoch ms) of the readings above the limit in the last minute.
    hot: list[int] = field(default_factory=list)
    alarmed: bool = False
    last_seen: int = 0


@kf.stateful(state=Watch, output=Alert, ttl="1h", late="topic")
def overheating(
    key: tuple[Any, ...], events: list[Reading], ctx: kf.StateContext[Watch]
) -> Iterator[Alert]:
    w = ctx.state
    for e in events:
        t = kf.to_epoch_ms(e.at)
        if w.last_seen:
            ctx.timers.cancel(w.last_seen + SILENCE_MS)
        w.last_seen = max(w.last_seen, t)
        ctx.timers.at(w.last_seen + SILENCE_MS)
        if e.temperature > LIMIT:
            w.hot = [h for h in w.hot if h > t - WITHIN_MS] + [t]
            if len(w.hot) >= 3 and not w.alarmed:
                w.alarmed = True
                reason = f"3 readings above {LIMIT} within a minute"
                yield Alert(e.device, "raised", reason, e.at)
        else:
            w.hot = []
            if w.alarmed:
                w.alarmed = False
                reason = f"reading {e.temperature} at or below {LIMIT}"
                yield Alert(e.device, "resolved", reason, e.at)


@overheating.on_timer
def silent(key: tuple[Any, ...], at_ms: int, ctx: kf.StateContext[Watch]) -> Iterator[Alert]:
    ctx.state.hot = []
    if ctx.state.alarmed:
        ctx.state.alarmed = False
        yield Alert(key[0], "resolved", "no data for five minutes", kf.from_epoch_ms(at_ms))


def build(job: kf.Job) -> None:
    readings = job.source(job.param("topic", "readings"), Reading, key="device", watermark="10s")
    alerts = readings.process(overheating, by="device")
    alerts.to(kf.topic(), kf.lake("alerts"))
