"""The built-in count job's workload on the job API: events per key in 1-minute tumbling
windows, a 10 s watermark, no allowed lateness and no id, written where the built-in
writes (a Kafka changelog and Redis)."""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Event:
    """The counting benchmark's event (count.event); ``pad`` and ``amount`` are not read."""

    id: str
    key: str
    ts: kf.EventTime


def build(job: kf.Job) -> None:
    events = job.source(job.param("topic"), Event, key="key", watermark="10s")
    counts = events.window(tumbling="1m").aggregate("counts", by="key", events=kf.count())
    counts.to(kf.topic(), kf.store())
