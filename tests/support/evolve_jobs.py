"""Versions of one job whose state evolves through a savepoint (tests/test_state_evolution.py):
as first deployed, with an aggregate added and a field added to a stateful function's
state, and with that field's type narrowed. Not part of kappaflow; the tests put this
directory on the jobs' path."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import kappaflow as kf


@dataclass
class Reading:
    reading_id: str
    device: str
    site: str
    value: int
    at: kf.EventTime


@dataclass
class Seen:
    readings: int = 0


@dataclass
class SeenWithPeak:
    readings: int = 0
    peak: float = 0.0


@dataclass
class SeenNarrowed:
    readings: int = 0
    peak: int = 0


@dataclass
class Tally:
    device: str
    readings: int


def _seen(state: type) -> kf.StatefulFunction[object]:
    def tally(
        key: tuple[object, ...], events: list[Reading], ctx: kf.StateContext[object]
    ) -> Iterator[Tally]:
        state = ctx.state
        state.readings += len(events)  # type: ignore[attr-defined]
        if hasattr(state, "peak"):
            state.peak = max([state.peak, *(e.value for e in events)])
        yield Tally(str(key[0]), state.readings)  # type: ignore[attr-defined]

    return kf.stateful(state=state, output=Tally)(tally)


def _readings(job: kf.Job) -> kf.Stream:
    # Lateness of a minute: events behind the watermark correct their windows for a
    # minute, then go to the late topic.
    return job.source(
        job.param("topic"), Reading, key="device", watermark="5s", allowed_lateness="1m"
    )


def build(job: kf.Job) -> None:
    """Readings counted per site and 10 seconds; readings per device, as state."""
    readings = _readings(job)
    readings.window(tumbling="10s").aggregate("counts", by="site", n=kf.count()).to(
        kf.topic(), kf.store()
    )
    readings.process(_seen(Seen), by="device", name="seen").to(kf.topic())


def with_sum(job: kf.Job) -> None:
    """The sum of the values added to the counts, and a field with a default to the state."""
    readings = _readings(job)
    readings.window(tumbling="10s").aggregate(
        "counts", by="site", n=kf.count(), total=kf.sum("value")
    ).to(kf.topic(), kf.store())
    readings.process(_seen(SeenWithPeak), by="device", name="seen").to(kf.topic())


def narrowed(job: kf.Job) -> None:
    """The state's new field narrowed from float to int: its values may not fit."""
    readings = _readings(job)
    readings.window(tumbling="10s").aggregate(
        "counts", by="site", n=kf.count(), total=kf.sum("value")
    ).to(kf.topic(), kf.store())
    readings.process(_seen(SeenNarrowed), by="device", name="seen").to(kf.topic())
