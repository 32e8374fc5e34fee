"""The YSB job as a user writes it on kappaflow's job API (``build(job)``).

Ad events from the topic ``source``, keep the views, join each ad to its campaign, count
the views per campaign in 10-second tumbling event-time windows, and write every change
of a window's count to the serving store and/or the Kafka topic ``dest``.

The ad-to-campaign join (``join``):

- ``table`` (the default): the compacted topic ``ads`` (``{"ad_id", "campaign_id"}``
  keyed by ad) as a reference table (``job.table``), joined inner: views of unknown ads
  are dropped. The job API reads the whole table topic again in every micro-batch and
  broadcasts it, so an ad added during the run is seen by the next micro-batch.
- ``map``: the same pairs as a map literal in the plan (``with_column`` of a lookup),
  read once from the table topic's JSON file ``ads_file`` when the job is declared:
  what a user with a fixed table would write, and what the hand-written Spark pipeline
  does.

Parameters: ``source``; ``ads`` (the table's topic) or ``ads_file``; ``join``; ``dest``
(a topic that receives the changelog; none: no Kafka output); ``store`` (``yes`` or
``no``: the serving store); ``watermark`` (default 60 s, as the other engines).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F

import kappaflow as kf

#: The output's name: the serving store keeps its windows under ``kf:JOB:windows:``.
OUTPUT = "windows"
JOINS = ("table", "map")


@dataclass
class AdEvent:
    """The original's event: seven strings, ``event_time`` epoch ms as digits."""

    user_id: str
    page_id: str
    ad_id: str
    ad_type: str
    event_type: str
    event_time: kf.EventTime
    ip_address: str


@dataclass
class Ad:
    ad_id: str
    campaign_id: str


def build(job: kf.Job) -> None:
    events = job.source(job.param("source"), AdEvent, watermark=job.param("watermark", "60s"))
    views = events.where(F.col("event_type") == "view").select("ad_id")
    how = job.param("join", "table")
    if how == "table":
        ads = job.table(job.param("ads"), Ad, key="ad_id")
        campaigns = views.join(ads, how="inner")
    elif how == "map":
        table: dict[str, str] = json.loads(Path(job.param("ads_file")).read_text())
        lookup = F.create_map(*[F.lit(x) for pair in sorted(table.items()) for x in pair])
        campaigns = views.with_column("campaign_id", lookup[F.col("ad_id")]).where(
            F.col("campaign_id").isNotNull()
        )
    else:
        raise kf.InvalidParameterError(f"join={how!r}: table or map")
    counts = campaigns.window(tumbling="10s").aggregate(
        OUTPUT, by="campaign_id", seen_count=kf.count()
    )
    sinks: list[Any] = []
    if job.param("store", "yes") == "yes":
        sinks.append(kf.store())
    dest = job.param("dest", "")
    if dest:
        sinks.append(kf.topic(dest))
    counts.to(*sinks)
