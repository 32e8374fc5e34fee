"""The device state job: each device's presence and sessions, and its metrics' last values.

Written on the public job API only. Start it with::

    kappaflow jobs start iot-devices --app kappaflow.iot.devices:build

Two stateful functions, each served from Redis (``kf.store()``: each key's latest record):

- ``presence``, per device, from ``devices.events`` (``-P events=...``): any event (a
  heartbeat, a user's command, a state change) shows the device alive. A device that was
  offline (or never seen) comes ``online`` and begins a session; an event-time timer
  ``OFFLINE_AFTER`` past its last event (three heartbeats) takes it ``offline`` and ends
  the session, as does an event that comes later than that after the one before. A
  record per device per micro-batch that changed it (and one when it goes offline), to
  ``devices.status`` (``-P status=...``) and the store (``kf:JOB:status:latest``)::

      {"device": "dev-000042", "status": "online", "last_seen": "...",
       "session_start": "...", "sessions": 3}

- ``last_values``, per device and metric, from ``telemetry.clean`` (``-P source=...``):
  the reading with the newest event time, to the store (``kf:JOB:last_values:latest``);
  a reading older than the one held changes nothing.

Events behind the watermark (a minute behind the newest) go to the job's late topic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kappaflow as kf
from kappaflow.iot.clean import CLEAN_TOPIC, CleanReading
from kappaflow.iot.telemetry import EVENTS_TOPIC

STATUS_TOPIC = "devices.status"
#: A device without an event for three heartbeats (the simulator beats every 30 s) is
#: offline.
OFFLINE_AFTER_MS = 90_000
FORGET_AFTER = "7d"


@dataclass
class DeviceEventRecord:
    device: str
    time: kf.EventTime
    kind: str


@dataclass
class Status:
    device: str
    status: str
    last_seen: datetime
    session_start: datetime
    sessions: int


@dataclass
class Presence:
    online: bool = False
    last_seen: int = 0
    session_start: int = 0
    sessions: int = 0


def _status(device: str, p: Presence) -> Status:
    state = "online" if p.online else "offline"
    return Status(
        device, state, kf.from_epoch_ms(p.last_seen), kf.from_epoch_ms(p.session_start), p.sessions
    )


@kf.stateful(state=Presence, output=Status, ttl=FORGET_AFTER, late="topic")
def presence(
    key: tuple[Any, ...], events: list[DeviceEventRecord], ctx: kf.StateContext[Presence]
) -> Iterator[Status]:
    p = ctx.state
    if p.last_seen:
        ctx.timers.cancel(p.last_seen + OFFLINE_AFTER_MS)
    for e in events:
        t = kf.to_epoch_ms(e.time)
        if p.online and t - p.last_seen > OFFLINE_AFTER_MS:
            # Silent for longer than the timeout, though its timer has not fired yet (the
            # watermark passed it in this same micro-batch): the session ended back then.
            p.online = False
            yield _status(str(key[0]), p)
        if not p.online:
            p.online, p.session_start, p.sessions = True, t, p.sessions + 1
        p.last_seen = max(p.last_seen, t)
    ctx.timers.at(p.last_seen + OFFLINE_AFTER_MS)
    yield _status(str(key[0]), p)


@presence.on_timer
def gone(key: tuple[Any, ...], at_ms: int, ctx: kf.StateContext[Presence]) -> Iterator[Status]:
    if ctx.state.online:
        ctx.state.online = False
        yield _status(str(key[0]), ctx.state)


@dataclass
class LastValue:
    device: str
    metric: str
    value: float
    unit: str
    time: datetime


@dataclass
class Newest:
    time: int = 0


@kf.stateful(state=Newest, output=LastValue, ttl=FORGET_AFTER, late="topic")
def last_values(
    key: tuple[Any, ...], events: list[CleanReading], ctx: kf.StateContext[Newest]
) -> Iterator[LastValue]:
    newest = max(events, key=lambda e: kf.to_epoch_ms(e.time))
    t = kf.to_epoch_ms(newest.time)
    if t > ctx.state.time:
        ctx.state.time = t
        yield LastValue(newest.device, newest.metric, newest.value, newest.unit, newest.time)


def build(job: kf.Job) -> None:
    events = job.source(
        job.param("events", EVENTS_TOPIC),
        DeviceEventRecord,
        key="device",
        time="time",
        watermark="1m",
    )
    status = events.process(presence, by="device", name="status")
    status.to(kf.topic(job.param("status", STATUS_TOPIC)), kf.store())
    readings = job.source(
        job.param("source", CLEAN_TOPIC), CleanReading, key="device", time="time", watermark="1m"
    )
    values = readings.process(last_values, by=["device", "metric"], name="last_values")
    values.to(kf.store())
