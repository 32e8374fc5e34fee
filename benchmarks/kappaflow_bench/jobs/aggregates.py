"""The counting workload with more to compute: per key and 1-minute window, the count,
the sum and mean of a number and the approximate number of distinct event ids; same
source, watermark and sinks as counts.py."""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Event:
    """The counting benchmark's event with its ``amount`` (count.event(amount=True))."""

    id: str
    key: str
    amount: float
    ts: kf.EventTime


def build(job: kf.Job) -> None:
    events = job.source(job.param("topic"), Event, key="key", watermark="10s")
    figures = events.window(tumbling="1m").aggregate(
        "figures",
        by="key",
        events=kf.count(),
        total=kf.sum("amount"),
        mean=kf.mean("amount"),
        ids=kf.approx_distinct("id"),
    )
    figures.to(kf.topic(), kf.store())
