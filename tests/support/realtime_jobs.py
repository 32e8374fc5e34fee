"""Jobs the real-time mode tests start (tests/test_job_realtime.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType

import kappaflow as kf


@dataclass
class Reading:
    device: str
    value: float
    time: kf.EventTime


def windows(job: kf.Job) -> None:
    readings = job.source(job.param("topic"), Reading, key="device", watermark="1s")
    readings.window(tumbling="2s").aggregate(
        "stats", by="device", n=kf.count(), total=kf.sum("value"), high=kf.max("value")
    ).to(kf.topic(), kf.store())


def with_postgres(job: kf.Job) -> None:
    readings = job.source(job.param("topic"), Reading, key="device", watermark="1s")
    readings.window(tumbling="2s").aggregate("stats", by="device", n=kf.count()).to(
        kf.postgres("device_stats", dsn="postgresql://kappaflow@127.0.0.1:1/none")
    )


def with_udf(job: kf.Job) -> None:
    doubled = F.udf(lambda v: v * 2, DoubleType())
    readings = job.source(job.param("topic"), Reading, key="device")
    readings.with_column("value", doubled(F.col("value"))).to(kf.topic(job.param("dest")))


@dataclass
class Seen:
    n: int = 0


@kf.stateful(state=Seen, output=Reading)
def last_seen(
    key: tuple[Any, ...], events: list[Reading], ctx: kf.StateContext[Seen]
) -> Iterator[Reading]:
    ctx.state.n += len(events)
    yield from events


def with_stateful(job: kf.Job) -> None:
    readings = job.source(job.param("topic"), Reading, key="device")
    readings.process(last_seen, by="device").to(kf.topic(job.param("dest")))


def alerts(job: kf.Job) -> None:
    readings = job.source(job.param("topic"), Reading, key="device")
    readings.alerts(high=("value", ">=", 5.0), negative=("value", "<", 0)).to(
        kf.topic(job.param("dest")), kf.store()
    )
