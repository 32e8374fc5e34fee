"""Every event of the counting benchmark's backlog passed to a topic as it is: an
output as large as the input, for measuring what writing it costs the driver."""

from __future__ import annotations

from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Event:
    """The counting benchmark's event (count.event); ``pad`` goes along."""

    id: str
    key: str
    ts: kf.EventTime
    pad: str


def build(job: kf.Job) -> None:
    events = job.source(job.param("topic"), Event, key="key", watermark="10s")
    events.to(kf.topic())
